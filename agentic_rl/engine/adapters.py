"""LoRA adapters on the in-process vLLM engine: each weight sync sends only the adapter, the base weights stay.

Each `VLLMEngine.update_adapter(folder)` loads the peft adapter saved in `folder` as the next weight version V + 1,
under LoRA id V + 1 and name `adapter-v{V+1}` (version 0, or `VLLMEngineConfig.weight_version`, is the base model
without an adapter). vLLM's prefix cache keys KV blocks by the adapter's name, so no KV of another version is ever
reused and nothing needs resetting.

A request is pinned to the adapter that is the latest when the engine thread takes it: it samples every token
with that adapter, even across later syncs, so each turn is exactly on-policy for the version it records
(`Generation.weight_versions`). `AdapterSlots` (engine-thread state) counts the requests on each version and
removes an older adapter from vLLM as soon as no request uses it. At most `max_loras` adapters are held after each
sync: the latest and those requests in flight still use. A sync that would need more waits until a request on an
older adapter ends (generation going on), or fails at once while generation is paused (none could end): with
bounded-staleness training, `max_loras >= max_staleness + 1` never needs either.

The adapter folder is read once, during `update_adapter` (vLLM keeps the loaded adapter in memory: its CPU cache
holds `max_loras + 1`, so that the new adapter loads before an unused old one is removed), and may be overwritten
or removed afterwards.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter, deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentic_rl.engine.commands import LoadAdapter
from agentic_rl.errors import EngineError

__all__ = ["MAX_LORA_RANKS", "AdapterSlots", "adapter_name", "check_adapter_folder"]

logger = logging.getLogger(__name__)

#: The `max_lora_rank` values vLLM (0.32) takes; an adapter of any rank up to it loads.
MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)

#: Files that hold a peft adapter's weights (vLLM reads either).
_WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")


def adapter_name(version: int) -> str:
    """vLLM's name of the adapter of weight version `version` (its LoRA id is `version`)."""
    return f"adapter-v{version}"


def check_adapter_folder(folder: str | Path, max_lora_rank: int) -> Path:
    """Check that `folder` holds a peft LoRA adapter vLLM can load with `max_lora_rank`; return its absolute path.

    Reads `adapter_config.json` (peft's `LoraConfig`, as `save_pretrained` writes it): `peft_type` LORA (when given),
    rank `r` and any `rank_pattern` ranks at most `max_lora_rank`, no `bias`. The weights themselves are read by
    vLLM when the engine loads them.

    Raises:
        EngineError: naming the folder and what is wrong (missing folder, config or weights file, bad JSON, rank).
    """
    path = Path(folder).expanduser().resolve()
    if not path.is_dir():
        raise EngineError(f"LoRA adapter folder {path} does not exist or is not a folder")
    config_file = path / "adapter_config.json"
    if not config_file.is_file():
        raise EngineError(f"LoRA adapter folder {path} holds no adapter_config.json (peft's save_pretrained writes it)")
    if not any((path / name).is_file() for name in _WEIGHT_FILES):
        raise EngineError(f"LoRA adapter folder {path} holds no weights file ({' or '.join(_WEIGHT_FILES)})")
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as exc:
        raise EngineError(f"LoRA adapter config {config_file} could not be read: {exc}") from exc
    if not isinstance(config, dict):
        raise EngineError(f"LoRA adapter config {config_file} is not a JSON object")
    peft_type = config.get("peft_type", "LORA")
    if str(peft_type).upper() != "LORA":
        raise EngineError(f"{config_file}: peft_type={peft_type!r} is not a LoRA adapter")
    ranks = [config.get("r"), *(config.get("rank_pattern") or {}).values()]
    if not all(isinstance(r, int) and not isinstance(r, bool) and r >= 1 for r in ranks):
        raise EngineError(f"{config_file}: rank r={config.get('r')!r} (or a rank_pattern value) is not an int >= 1")
    if max(ranks) > max_lora_rank:
        raise EngineError(
            f"{config_file}: LoRA rank {max(ranks)} exceeds VLLMEngineConfig.max_lora_rank="
            f"{max_lora_rank}: raise max_lora_rank (one of {MAX_LORA_RANKS})"
        )
    if config.get("bias", "none") != "none":
        raise EngineError(f"{config_file}: bias={config['bias']!r}: vLLM serves LoRA adapters without bias only")
    return path


class AdapterSlots:
    """The engine thread's LoRA adapters: the latest version, the adapters vLLM holds, and who uses each.

    Only the engine thread uses it, between two engine steps.

    Attributes:
        max_loras: the most adapters held after a sync (vLLM's `max_loras`; its CPU cache holds one more).
        latest: the weight version new requests get (the base model's until the first sync).
        loaded: version -> the `vllm.lora.request.LoRARequest` of each adapter vLLM holds.
        users: version -> requests submitted to vLLM on that version that have not ended (base version included).
        parked: syncs waiting for a request on an older adapter to end, in the order they were sent.
    """

    def __init__(self, max_loras: int, base_version: int) -> None:
        self.max_loras = max_loras
        self.latest = base_version
        #: called with the new latest version after a load and before its caller is answered, so that whoever reads
        #: the engine's weight version once `update_adapter` returns sees the new one (the engine thread sets it)
        self.on_latest: Callable[[int], None] = lambda version: None
        self.loaded: dict[int, Any] = {}
        self.users: Counter[int] = Counter()
        self.parked: deque[LoadAdapter] = deque()

    def take(self) -> tuple[int, Any]:
        """Pin a new request to the latest version: `(version, LoRARequest or None for the base model)`."""
        self.users[self.latest] += 1
        return self.latest, self.loaded.get(self.latest)

    def release(self, llm: Any, version: int) -> bool:
        """A request on `version` ended (finished, aborted or failed): remove its adapter if no request uses it and
        it is not the latest, then run the parked syncs that now fit. True when the latest version changed."""
        self.users[version] -= 1
        if self.users[version] <= 0:
            del self.users[version]
            self._retire(llm, version)
        changed = False
        while self.parked and self._fits():
            changed |= self._load(llm, self.parked.popleft())
        return changed

    def in_use(self) -> list[int]:
        """The versions of held adapters that requests in flight use."""
        return sorted(v for v in self.loaded if self.users[v] > 0)

    def request_load(self, llm: Any, command: LoadAdapter, paused: bool) -> bool:
        """Load `command.folder` as version `latest + 1` now, or park it until an older adapter is free (fail it
        while generation is paused: nothing would free one). True when the latest version changed."""
        if not self.parked and self._fits():
            return self._load(llm, command)
        if not paused:
            logger.info(
                "LoRA sync of %s waits: all %d adapter slots are in use (versions %s)",
                command.folder,
                self.max_loras,
                self.in_use(),
            )
            self.parked.append(command)
            return False
        if command.result.set_running_or_notify_cancel():
            command.result.set_exception(
                EngineError(
                    f"cannot load the LoRA adapter in {command.folder}: all max_loras={self.max_loras} adapters the "
                    f"engine may hold are used by requests in flight (versions {self.in_use()}) and generation is "
                    "paused, so none can end; set VLLMEngineConfig.max_loras >= max_staleness + 1"
                )
            )
        return False

    def fail_parked(self, exc: EngineError) -> None:
        """Fail every parked sync with `exc` (when the engine thread ends)."""
        while self.parked:
            result = self.parked.popleft().result
            if result.set_running_or_notify_cancel():
                result.set_exception(exc)

    def _fits(self) -> bool:
        """Whether one more adapter fits next to those requests in flight use (an unused latest one goes)."""
        return len(self.in_use()) + 1 <= self.max_loras

    def _retire(self, llm: Any, version: int) -> None:
        if version != self.latest and self.loaded.pop(version, None) is not None:
            llm.llm_engine.remove_lora(version)

    def _load(self, llm: Any, command: LoadAdapter) -> bool:
        """Load the adapter as version `latest + 1`; resolve the command with `(version, seconds)`, or fail it
        (the latest version stays). True when it loaded."""
        if not command.result.set_running_or_notify_cancel():  # the caller gave up while it was parked
            return False
        from vllm.lora.request import LoRARequest

        version = self.latest + 1
        t0 = time.perf_counter()
        lora = LoRARequest(adapter_name(version), version, str(command.folder))
        try:
            llm.llm_engine.add_lora(lora)
        except Exception as exc:
            command.result.set_exception(
                EngineError(
                    f"vLLM did not load the LoRA adapter in {command.folder} (the engine stays at weight version "
                    f"{self.latest}): {exc}"
                )
            )
            return False
        previous, self.latest = self.latest, version
        self.loaded[version] = lora
        if self.users[previous] <= 0:
            self._retire(llm, previous)
        self.on_latest(version)
        command.result.set_result((version, time.perf_counter() - t0))
        return True
