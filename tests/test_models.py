"""Model registry: local folders, the embedded SmolLM2 built from a PyPI wheel, digest checks, clear errors."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from agentic_rl import models
from agentic_rl.errors import ModelError
from agentic_rl.models import DEFAULT_MODEL, REGISTRY, resolve_model


def test_default_model_is_a_ready_hugging_face_folder(model_dir):
    config = json.loads((model_dir / "config.json").read_text())
    assert config["model_type"] == "llama"
    assert config["num_hidden_layers"] == 30 and config["hidden_size"] == 576
    assert (model_dir / "model.safetensors").stat().st_size > 200_000_000  # de-quantized bf16 weights
    assert (model_dir / "tokenizer.json").is_file()


def test_registry_build_is_idempotent(model_dir):
    marker = model_dir / models._READY
    before = marker.stat().st_mtime_ns
    again = resolve_model(DEFAULT_MODEL, cache_dir=model_dir.parent)
    assert again == model_dir
    assert marker.stat().st_mtime_ns == before
    assert REGISTRY[DEFAULT_MODEL].gguf_sha256 in marker.read_text()


def test_local_folder_is_returned_as_is(model_dir):
    assert resolve_model(str(model_dir)) == model_dir


def test_folder_without_config_is_rejected(tmp_path):
    with pytest.raises(ModelError, match="no config.json"):
        resolve_model(tmp_path)


def test_unknown_name_is_rejected_with_the_known_names():
    with pytest.raises(ModelError, match=DEFAULT_MODEL):
        resolve_model("no-such-model")


def test_hub_id_without_hub_access_is_a_model_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelError, match="hub"):
        resolve_model("someone/some-model-that-is-not-cached")


def test_wheel_with_wrong_digest_is_rejected_and_nothing_is_left_behind(tmp_path, monkeypatch):
    spec = dataclasses.replace(REGISTRY[DEFAULT_MODEL], wheel_sha256="0" * 64)
    monkeypatch.setitem(REGISTRY, "tampered", spec)
    with pytest.raises(ModelError, match="sha256"):
        resolve_model("tampered", cache_dir=tmp_path)
    assert not (tmp_path / "tampered").exists()


def test_unknown_name_lists_the_registered_derived_models_and_says_how_they_are_registered():
    from agentic_rl.loop import sft

    with pytest.raises(ModelError, match="not one of: ") as info:
        resolve_model("no-such-model")
    assert sft.TOOL_MODEL in str(info.value) and sft.RESEARCH_MODEL in str(info.value)
    assert "import agentic_rl.loop" in str(info.value)


def test_the_sft_recipe_registers_its_models_by_callable():
    from agentic_rl.loop import sft

    tools, research = models.DERIVED[sft.TOOL_MODEL], models.DERIVED[sft.RESEARCH_MODEL]
    assert (tools.base, tools.build) == (DEFAULT_MODEL, sft.build_tool_model)
    assert tools.fingerprint is sft.tool_model_fingerprint
    assert (research.base, research.build) == (sft.TOOL_MODEL, sft.build_research_model)


def test_the_registry_alone_imports_no_recipe_and_does_not_know_the_derived_models():
    code = (
        "import sys\n"
        "from agentic_rl.errors import ModelError\n"
        "from agentic_rl.models import resolve_model\n"
        "try:\n"
        "    resolve_model('smollm2-135m-tools')\n"
        "except ModelError as exc:\n"
        "    print('agentic_rl.loop' in sys.modules, exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.startswith("False unknown model 'smollm2-135m-tools'") and DEFAULT_MODEL in out


@pytest.mark.parametrize(
    ("name", "settings", "message"),
    [
        (DEFAULT_MODEL, {}, "a built-in model"),
        ("tiny-random-smollm2", {}, "a built-in model"),
        ("someone/model", {}, "a path"),
        ("mine", {"build": "pkg.module:build"}, "build must be callable"),
    ],
)
def test_register_model_refuses_built_in_names_and_recipes_by_string(monkeypatch, name, settings, message):
    monkeypatch.setattr(models, "DERIVED", {})
    recipe = {"base": DEFAULT_MODEL, "build": lambda base, out: {}, "fingerprint": lambda base: {}, "description": ""}
    with pytest.raises(ModelError, match=message):
        models.register_model(name, **{**recipe, **settings})
    assert models.DERIVED == {}
