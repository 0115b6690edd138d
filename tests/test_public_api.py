"""The package's `__all__` lists exactly the public names it exports, and importing it stays light."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import agentic_rl

ROOT = Path(__file__).resolve().parents[1]


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


def test_reading_and_checking_a_training_config_and_its_memory_plan_load_no_torch():
    code = (
        "import sys\n"
        "from agentic_rl.cli.command import main\n"
        "main(['plan', '--model', 'examples/model_shapes/qwen2.5-7b.json', '--gpus', '8', '--gpu-memory-gib', '80', '--config',\n"
        "      'examples/train_arithmetic.yaml', '--json'])\n"
        "print('torch' in sys.modules, 'vllm' in sys.modules, 'transformers' in sys.modules, file=sys.stderr)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert json.loads(out.stdout)["fits"] in (True, False), out.stdout[:500]
    assert out.stderr.strip().splitlines()[-1] == "False False False"


def test_a_name_of_a_lazy_subpackage_is_the_defining_modules_own():
    import agentic_rl.engine
    import agentic_rl.train
    from agentic_rl.engine.ledger import RecordingEngine
    from agentic_rl.train.packing import pack_trajectories

    assert agentic_rl.engine.RecordingEngine is RecordingEngine
    assert sys.modules["agentic_rl.train"].pack_trajectories is pack_trajectories
    assert "RecordingEngine" in dir(agentic_rl.engine)
    try:
        agentic_rl.engine.NoSuchName  # noqa: B018
    except AttributeError as exc:
        assert "agentic_rl.engine" in str(exc) and "NoSuchName" in str(exc)
    else:
        raise AssertionError("an unknown name must raise AttributeError")


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
