"""The package's `__all__` lists exactly the public names it exports, and importing it stays light."""

from __future__ import annotations

import subprocess
import sys

import agentic_rl


def test_all_names_exist_and_public_attributes_are_listed():
    for name in agentic_rl.__all__:
        assert hasattr(agentic_rl, name), name
    public = {n for n in dir(agentic_rl) if not n.startswith("_") and not isinstance(getattr(agentic_rl, n), type(sys))}
    public.discard("logging")
    assert public == set(agentic_rl.__all__)


def test_importing_the_package_does_not_import_vllm():
    code = "import sys, agentic_rl; print('vllm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


TRAINING_NAMES = ("train", "run_training", "TrainConfig", "GRPOConfig", "run_sft", "SFTConfig")


def test_the_training_entry_points_are_the_loops_own(monkeypatch):
    import agentic_rl.loop

    for name in TRAINING_NAMES:
        assert name in agentic_rl.__all__
        if name != "train":
            assert getattr(agentic_rl, name) is getattr(agentic_rl.loop, name), name
    from agentic_rl import GRPOConfig, train

    assert GRPOConfig is agentic_rl.loop.GRPOConfig
    calls = []
    monkeypatch.setattr(agentic_rl.loop, "train", lambda *args, **kwargs: calls.append((args, kwargs)) or "ran")
    assert train("config", resume=True) == "ran"  # `agentic_rl.train(...)` is `agentic_rl.loop.train(...)`
    assert calls == [(("config",), {"resume": True})]


def _run(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def test_importing_the_package_loads_neither_the_loop_nor_the_trainer():
    code = "import sys, agentic_rl; print(sorted(m for m in sys.modules if m.startswith(('agentic_rl.loop', 'agentic_rl.train'))))"
    assert _run(code) == "[]"


def test_train_stays_the_entry_point_once_the_trainer_subpackage_is_loaded():
    # the subpackage first (the import system binds it on the package), then the name
    code = (
        "import sys, agentic_rl\n"
        "from agentic_rl.train import trainer\n"
        "from agentic_rl.train.loss import grpo_loss\n"
        "import agentic_rl.train.packing as packing\n"
        "import agentic_rl.loop\n"
        "from agentic_rl import train\n"
        "agentic_rl.loop.train = lambda config: ('trained', config)\n"
        "print(train('c'), agentic_rl.train is train, trainer.__name__, packing.__name__,\n"
        "      agentic_rl.train.trainer.GRPOTrainer is trainer.GRPOTrainer, grpo_loss is agentic_rl.train.loss.grpo_loss,\n"
        "      sys.modules['agentic_rl.train'].__name__, 'train' in dir(agentic_rl))"
    )
    assert _run(code) == (
        "('trained', 'c') True agentic_rl.train.trainer agentic_rl.train.packing True True agentic_rl.train True"
    )
