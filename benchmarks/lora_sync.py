"""Seconds of one weight sync: a LoRA adapter (`VLLMEngine.update_adapter`) against the full weights
(`update_weights`), on the same model and dtype, one engine of each kind in this process.

For the adapter: peft's `save_pretrained` of the adapter (what the trainer does before each sync) and
`update_adapter` (the engine reading and loading it), medians of N. For the full weights: `update_weights` of the
model's `named_parameters()`, median of N. Prints a table and writes JSON.

    .venv/bin/python benchmarks/lora_sync.py [--model tiny-random-smollm2] [--rank 8] [--repeats 5] [--out FILE]
    .venv/bin/python benchmarks/lora_sync.py --model random-qwen2.5-0.5b --rank 16   # ~0.5B, random weights

`random-qwen2.5-0.5b` is a random-init model of Qwen2.5-0.5B's shape (494M parameters, `levers.QWEN2_05B`) with
SmolLM2's tokenizer, written to a temporary folder first: what a sync costs depends on the shapes, not the values.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import torch
from common import save, table

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


async def measure(model_dir: Path, rank: int, repeats: int, dtype: str) -> dict[str, Any]:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from agentic_rl.engine.vllm_engine import VLLMEngine, VLLMEngineConfig

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    full = [(name, p.detach()) for name, p in model.named_parameters()]
    options = {"model": model_dir, "dtype": dtype, "max_model_len": 512, "kv_cache_gib": 0.1}
    plain = VLLMEngine(VLLMEngineConfig(**options))
    lora = VLLMEngine(VLLMEngineConfig(**options, max_lora_rank=rank, max_loras=2))
    await plain.start()
    await lora.start()
    peft_model = get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=TARGETS))
    saves, adapters, weights = [], [], []
    shm = Path("/dev/shm")  # where the training loop writes the adapter it syncs (`loop.weight_sync`)
    with tempfile.TemporaryDirectory(dir=shm if shm.is_dir() else None) as tmp:
        for i in range(repeats):
            t0 = time.perf_counter()
            peft_model.save_pretrained(f"{tmp}/v{i}")
            saves.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            await lora.update_adapter(f"{tmp}/v{i}")
            adapters.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            await plain.update_weights(full)
            weights.append(time.perf_counter() - t0)
    adapter_bytes = sum(p.numel() * p.element_size() for n, p in peft_model.named_parameters() if "lora_" in n)
    await plain.close()
    await lora.close()
    return {
        "model": str(model_dir), "dtype": dtype, "rank": rank, "repeats": repeats,
        "full_weight_bytes": sum(t.numel() * t.element_size() for _, t in full), "adapter_bytes": adapter_bytes,
        "save_pretrained_s": statistics.median(saves), "update_adapter_s": statistics.median(adapters),
        "update_weights_s": statistics.median(weights), "update_weights_path": plain.last_weight_sync,
    }  # fmt: skip


def random_qwen05b(folder: Path) -> Path:
    """A random-init model of Qwen2.5-0.5B's shape with SmolLM2's tokenizer, saved in `folder`."""
    import shutil

    from levers import QWEN2_05B
    from transformers import AutoConfig, AutoModelForCausalLM

    from agentic_rl.models import resolve_model

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.for_model(**QWEN2_05B), dtype=torch.float32).save_pretrained(folder)
    tokenizer = resolve_model("smollm2-135m-instruct")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (tokenizer / name).exists():
            shutil.copy(tokenizer / name, folder)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-random-smollm2")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    from agentic_rl.models import resolve_model

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = random_qwen05b(Path(tmp)) if args.model == "random-qwen2.5-0.5b" else resolve_model(args.model)
        result = anyio.run(measure, model_dir, args.rank, args.repeats, args.dtype)
    print(table(["model", "MB full", "MB adapter", "save_pretrained s", "update_adapter s", "update_weights s"],
                [[args.model, result["full_weight_bytes"] / 1e6, result["adapter_bytes"] / 1e6,
                  result["save_pretrained_s"], result["update_adapter_s"], result["update_weights_s"]]]))  # fmt: skip
    save("lora_sync", result, args.out)


if __name__ == "__main__":
    main()
