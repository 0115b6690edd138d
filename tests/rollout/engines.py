"""Engine decorators for tests: they delegate every sample to the real engine, only steering or observing it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agentic_rl.engine.base import Engine, Generation

CALL_REGEX = (
    r'<tool_call>\n\{"name": "calculator", "arguments": \{"expression": "[1-9][0-9]? [+*-] [1-9][0-9]?"\}\}\n</tool_call>'
)


class RecordingEngine:
    """Records every prompt and generation passing through to the real engine."""

    def __init__(self, inner: Engine) -> None:
        self.inner = inner
        self.calls: list[tuple[list[int], dict[str, Any], Generation]] = []

    @property
    def max_model_len(self) -> int:
        return self.inner.max_model_len

    async def generate(self, prompt_ids: Sequence[int], sampling: Mapping[str, Any]) -> Generation:
        generation = await self.inner.generate(prompt_ids, sampling)
        self.calls.append((list(prompt_ids), dict(sampling), generation))
        return generation


class ForcedCallEngine(RecordingEngine):
    """Constrains the first `forced_turns` turns of each trajectory to a calculator call (vLLM structured outputs).

    SmolLM2-135M never writes tool calls on its own, so tests that need one constrain the real engine's sampling
    with a regex; the ids are still sampled by the engine, with their logprobs. The turn number is the count of
    assistant headers in the prompt (ChatML-style templates), minus one.
    """

    def __init__(self, inner: Engine, tokenizer: Any, forced_turns: int = 1, regex: str = CALL_REGEX) -> None:
        super().__init__(inner)
        self.tokenizer = tokenizer
        self.forced_turns = forced_turns
        self.regex = regex

    async def generate(self, prompt_ids: Sequence[int], sampling: Mapping[str, Any]) -> Generation:
        from vllm.sampling_params import StructuredOutputsParams

        turn = self.tokenizer.decode(list(prompt_ids)).count("<|im_start|>assistant") - 1
        params = dict(sampling)
        if turn < self.forced_turns:
            params["structured_outputs"] = StructuredOutputsParams(regex=self.regex)
        return await super().generate(prompt_ids, params)
