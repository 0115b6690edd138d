"""Checkpoints of a sharded (FSDP2) trainer on two gloo ranks: each rank writes its shards, one merged DCP metadata
makes them one checkpoint that resumes bit-exact at two ranks, reads whole in one process and merges into a plain
Hugging Face folder; a kill while saving leaves the previous checkpoint; another rank count is refused.

The runs are real subprocesses (`sharded_resume.py`), stopped at a known point by a marker each rank writes once its
shards are on disk, not by timing."""

from __future__ import annotations

import shutil
import signal
import time
from pathlib import Path

import pytest
import torch
from sharded_resume import start_ranks
from support.launch import free_port_pair
from support.train_runs import write_train_config

from agentic_rl.cli import main
from agentic_rl.errors import ConfigError
from agentic_rl.loop import load_train_config
from agentic_rl.loop.setup import starting_point
from agentic_rl.loop.weight_sync import restore_weights
from agentic_rl.train.checkpoints import (
    STATE_FILE,
    CheckpointError,
    latest_checkpoint,
    load_state,
    save_checkpoint,
    weights_digest,
)
from agentic_rl.train.distributed import DistContext
from agentic_rl.train.sharded_checkpoints import SHARDS, is_sharded_checkpoint, merge_shard_metadata
from agentic_rl.train.trainer import GRPOConfig, GRPOTrainer

TIMEOUT_S = 300


def _finish(procs, log: Path) -> None:
    """Wait for both ranks; fail with their output when one failed or time ran out."""
    deadline = time.monotonic() + TIMEOUT_S
    try:
        for p in procs:
            p.wait(timeout=max(deadline - time.monotonic(), 1))
    finally:
        for p in procs:
            p.kill()
    logs = "\n".join(Path(f"{log}.rank{r}").read_text(errors="replace")[-3000:] for r in (0, 1))
    assert [p.returncode for p in procs] == [0, 0], logs


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    """Full fine-tuning (`full/`) and LoRA (`lora/`): step 1, `checkpoints/step_1`, steps 2 and 3."""
    out = tmp_path_factory.mktemp("uninterrupted")
    _finish(start_ranks(["uninterrupted", str(out)], out / "log", free_port_pair()), out / "log")
    return out


@pytest.fixture(scope="module")
def killed(tmp_path_factory) -> tuple[Path, list[str]]:
    """A run killed (SIGKILL, both ranks) while saving `step_2`, after each rank wrote its shards; with what its
    checkpoints folder held then."""
    out = tmp_path_factory.mktemp("killed")
    procs = start_ranks(["killed", str(out)], out / "log", free_port_pair())
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while not all((out / f"saving_rank{r}").exists() for r in (0, 1)):
            if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
                _finish(procs, out / "log")  # fails with the ranks' output
                raise AssertionError("the ranks ended before saving step 2")
            time.sleep(0.05)
    finally:
        for p in procs:
            p.send_signal(signal.SIGKILL)
            p.wait(timeout=60)
    assert [p.returncode for p in procs] == [-signal.SIGKILL] * 2
    return out, sorted(p.name for p in (out / "full" / "checkpoints").iterdir())


@pytest.fixture(scope="module")
def resumed(killed, uninterrupted) -> Path:
    """The killed full fine-tuning run, and the uninterrupted LoRA run's `step_1`, resumed in fresh processes."""
    out, _ = killed
    shutil.copytree(uninterrupted / "lora" / "checkpoints", out / "lora" / "checkpoints")
    _finish(start_ranks(["resumed", str(out)], out / "resume", free_port_pair()), out / "resume")
    return out


def test_a_kill_while_saving_leaves_the_previous_checkpoint_and_a_partial_folder(killed):
    out, listing = killed
    assert listing == [".tmp-step_2-sharded", "step_1"]
    root = out / "full" / "checkpoints"
    partial = root / ".tmp-step_2-sharded" / SHARDS
    assert all((partial / f"rank_{r}" / "__0_0.distcp").is_file() for r in (0, 1))  # shards written, not published
    assert is_sharded_checkpoint(root / "step_1") and load_state(root / "step_1")["step"] == 1
    assert latest_checkpoint(root, final_step=3).path == root / "step_1"


def test_a_resumed_sharded_run_ends_on_the_uninterrupted_runs_weights(resumed, uninterrupted):
    """Full fine-tuning resumed after the kill, from `step_1` (the partial folder removed), and LoRA resumed from
    its `step_1`: each trains steps 2 and 3 into the same bits as the run that never stopped."""
    assert sorted(p.name for p in (resumed / "full" / "checkpoints").iterdir()) == ["step_1"]
    for name in ("full", "lora"):
        assert (resumed / name / "digest.txt").read_text() == (uninterrupted / name / "digest.txt").read_text(), name


def test_the_merged_shards_read_whole_in_one_process(uninterrupted):
    """`dcp.load(no_dist=True)` into plain whole tensors reads both ranks' chunks: the weights and AdamW moments
    gathered at the checkpoint; AdamW's `step`, held whole by both ranks, is one chunk."""
    import torch.distributed.checkpoint as dcp

    folder = uninterrupted / "full" / "checkpoints" / "step_1"
    gathered = torch.load(folder.parents[1] / "gathered_step_1.pt")
    weights = {name: torch.zeros_like(t) for name, t in gathered["weights"].items()}
    moments = {name: {"exp_avg": torch.zeros_like(t), "step": torch.zeros(())} for name, t in gathered["exp_avg"].items()}
    state = {"model": weights, "optimizer": {"state": moments}}
    dcp.load(state, storage_reader=dcp.FileSystemReader(folder / SHARDS), no_dist=True)
    for name, tensor in gathered["weights"].items():
        assert torch.equal(state["model"][name], tensor), name
    for name, tensor in gathered["exp_avg"].items():
        assert torch.equal(state["optimizer"]["state"][name]["exp_avg"], tensor), name
        assert state["optimizer"]["state"][name]["step"].item() == 1.0
    metadata = dcp.FileSystemReader(folder / SHARDS).read_metadata()
    embed = metadata.state_dict_metadata["model.model.embed_tokens.weight"]
    assert [tuple(c.offsets) for c in embed.chunks] == [(0, 0), (24576, 0)]
    assert {info.relative_path.split("/")[0] for info in metadata.storage_data.values()} == {"rank_0", "rank_1"}
    assert len(metadata.state_dict_metadata["optimizer.state.model.norm.weight.step"].chunks) == 1


def test_merging_refuses_missing_ranks_and_chunks_that_do_not_cover(uninterrupted, tmp_path):
    shards = tmp_path / SHARDS
    shutil.copytree(uninterrupted / "full" / "checkpoints" / "step_1" / SHARDS, shards)
    with pytest.raises(CheckpointError, match="rank 2 wrote no shards"):
        merge_shard_metadata(shards, 3)
    with pytest.raises(CheckpointError, match="do not cover it exactly"):
        merge_shard_metadata(shards, 1)  # rank 0's half alone


def test_merge_writes_a_plain_model_folder_from_a_sharded_checkpoint(uninterrupted, tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = uninterrupted / "full" / "checkpoints" / "step_1"
    out = tmp_path / "merged"
    assert main(["merge", "--checkpoint", str(folder), "--out", str(out)]) == 0
    assert "merged model written to" in capsys.readouterr().out
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in out.iterdir()}
    assert not (out / SHARDS).exists() and not (out / STATE_FILE).exists()
    model = AutoModelForCausalLM.from_pretrained(str(out))
    assert model.dtype == torch.float32  # auto: as trained
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied as the model's config says
    saved = (out / "model.safetensors").stat().st_size
    assert saved < 1.1 * sum(p.numel() * 4 for p in model.parameters())  # the tied head not saved twice
    assert weights_digest(model) == torch.load(folder.parents[1] / "gathered_step_1.pt")["digest"]
    assert AutoTokenizer.from_pretrained(str(out)).encode("12 * 7") == AutoTokenizer.from_pretrained(str(folder)).encode("12 * 7")
    assert main(["merge", "--checkpoint", str(folder), "--out", str(out)]) == 2  # holds a model already
    assert "already holds a model" in capsys.readouterr().err


def test_merge_takes_a_sharded_lora_checkpoint_and_a_replicated_one(uninterrupted, tiny, tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM

    lora = uninterrupted / "lora" / "checkpoints" / "step_1"
    assert main(["merge", "--checkpoint", str(lora), "--out", str(tmp_path / "lora"), "--dtype", "bfloat16"]) == 0
    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "lora"), dtype=torch.float32)
    base = dict(tiny.named_parameters())
    moved = {n for n, p in merged.named_parameters() if not torch.allclose(p, base[n].to(torch.bfloat16).float())}
    assert moved and all(n.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight",
                                     "gate_proj.weight", "up_proj.weight", "down_proj.weight")) for n in moved)  # fmt: skip
    replicated = save_checkpoint(tmp_path / "step_1", tiny, tokenizer, {"step": 1})
    assert main(["merge", "--checkpoint", str(replicated), "--out", str(tmp_path / "plain")]) == 0
    assert weights_digest(AutoModelForCausalLM.from_pretrained(str(tmp_path / "plain"))) == weights_digest(tiny)
    assert main(["merge", "--checkpoint", str(tmp_path / "plain"), "--out", str(tmp_path / "again")]) == 2  # no state
    with pytest.raises(SystemExit):  # one of --checkpoint and --adapter
        main(["merge", "--checkpoint", str(lora), "--adapter", str(lora), "--out", str(tmp_path / "x")])


def test_another_rank_count_is_refused_with_the_way_out(uninterrupted, tmp_path, tiny):
    run = uninterrupted / "full"
    config = load_train_config(write_train_config(tmp_path, output_dir=str(run), steps=3))
    with pytest.raises(ConfigError, match=r"written by 2 rank\(s\).* not 1.*agentic-rl merge --checkpoint"):
        starting_point(config, DistContext(), resume=True)
    folder = run / "checkpoints" / "step_1"
    one = GRPOTrainer(tiny, pad_token_id=2, config=GRPOConfig(sharding="fsdp"))  # one process: not sharded
    with pytest.raises(ConfigError, match="is a sharded checkpoint, and this run's trainer is replicated"):
        restore_weights(one, folder, load_state(folder))


def test_a_damaged_sharded_checkpoint_is_named_not_a_traceback(uninterrupted, tmp_path, capsys):
    """What an incomplete copy leaves: a rank's shard folder gone, a shard file cut short, the hidden merged
    metadata left out; and paths that are not a checkpoint at all."""
    source = uninterrupted / "full" / "checkpoints" / "step_1"
    damaged = {}
    for kind in ("no_rank", "cut", "no_metadata"):
        damaged[kind] = tmp_path / kind
        shutil.copytree(source, damaged[kind])
    shutil.rmtree(damaged["no_rank"] / SHARDS / "rank_1")
    (shard,) = (damaged["cut"] / SHARDS / "rank_0").glob("*.distcp")
    shard.write_bytes(shard.read_bytes()[:1000])
    (damaged["no_metadata"] / SHARDS / ".metadata").unlink()
    for kind, why in (("no_rank", "missing or damaged shard"), ("cut", "missing or damaged shard"),
                      ("no_metadata", "incomplete sharded checkpoint")):  # fmt: skip
        assert main(["merge", "--checkpoint", str(damaged[kind]), "--out", str(tmp_path / f"out_{kind}")]) == 1, kind
        err = capsys.readouterr().err
        assert why in err and "Traceback" not in err, err
    for path, why in ((tmp_path / "nope", "does not exist"), (uninterrupted / "full", "RUN/checkpoints/final")):
        assert main(["merge", "--checkpoint", str(path), "--out", str(tmp_path / "out")]) == 2
        assert why in capsys.readouterr().err
