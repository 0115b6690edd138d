"""Engine decorators for tests: they delegate every sample to the real engine, only steering or observing it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentic_rl.engine.base import Engine, Generation
from agentic_rl.engine.sampling import SamplingConfig
from agentic_rl.environments.base import Sample
from agentic_rl.environments.tool_env import ToolEnvironment

CALL_REGEX = r'<tool_call>\n\{"name": "calculator", "arguments": \{"expression": "[1-9][0-9]? [+*-] [1-9][0-9]?"\}\}\n</tool_call>'


class DelegatingEngine:
    """An `Engine` that passes everything to `inner`; subclasses override `generate` to steer or observe."""

    def __init__(self, inner: Engine) -> None:
        self.inner = inner

    @property
    def max_model_len(self) -> int:
        return self.inner.max_model_len

    @property
    def weight_version(self) -> int:
        return self.inner.weight_version

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingConfig) -> Generation:
        return await self.inner.generate(prompt_ids, sampling)


class RecordingEngine(DelegatingEngine):
    """Records every prompt and generation passing through to the real engine."""

    def __init__(self, inner: Engine) -> None:
        super().__init__(inner)
        self.calls: list[tuple[list[int], SamplingConfig, Generation]] = []

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingConfig) -> Generation:
        generation = await self.inner.generate(prompt_ids, sampling)
        self.calls.append((list(prompt_ids), sampling, generation))
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

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingConfig) -> Generation:
        from vllm.sampling_params import StructuredOutputsParams

        turn = self.tokenizer.decode(list(prompt_ids)).count("<|im_start|>assistant") - 1
        if turn < self.forced_turns:
            sampling = sampling.model_copy(update={"structured_outputs": StructuredOutputsParams(regex=self.regex)})
        return await super().generate(prompt_ids, sampling)


class SteeredEngine(RecordingEngine):
    """Updates the sampling options of turn k with `steer(k)`, a dict (e.g. a regex, stop ids, a logit bias).

    The turn number is the count of assistant headers in the prompt (ChatML-style templates), minus one. A `regex`
    key becomes vLLM structured outputs. Every id is still sampled by the real engine, with its logprob.
    """

    def __init__(self, inner: Engine, tokenizer: Any, steer: Any) -> None:
        super().__init__(inner)
        self.tokenizer = tokenizer
        self.steer = steer

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingConfig) -> Generation:
        from vllm.sampling_params import StructuredOutputsParams

        turn = self.tokenizer.decode(list(prompt_ids)).count("<|im_start|>assistant") - 1
        update = dict(self.steer(turn))
        if "regex" in update:
            update["structured_outputs"] = StructuredOutputsParams(regex=update.pop("regex"))
        if "stop_token_ids" in update:
            update["stop_token_ids"] = [*(sampling.stop_token_ids or []), *update["stop_token_ids"]]
        return await super().generate(prompt_ids, sampling.model_copy(update=update))


class ScriptedEngine:
    """A deterministic stand-in engine for fault injection and soak tests: no model, answers from a script.

    Turn k of a trajectory (k = assistant headers in the prompt, minus one) answers with `script(question, k)`,
    encoded by the real tokenizer and closed by the end-of-turn id; every sampled token gets logprob -0.25. A
    question containing `[fault:engine_error]` makes turn 0 raise `EngineError`; `[fault:engine_hang]` makes turn 0
    never return (until cancelled). `in_flight` counts requests being served; `served` counts completed ones.
    """

    def __init__(self, tokenizer: Any, script: Any = None, *, max_model_len: int = 4096) -> None:
        self.tokenizer = tokenizer
        self.script = script or default_script
        self._max_model_len = max_model_len
        self.end_of_turn_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.weight_version = 0
        self.in_flight = 0
        self.served = 0
        self._encoded: dict[str, list[int]] = {}

    @property
    def max_model_len(self) -> int:
        return self._max_model_len

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingConfig) -> Generation:
        import anyio

        from agentic_rl.errors import EngineError

        self.in_flight += 1
        try:
            await anyio.sleep(0)  # a real engine always yields to the event loop
            text = self.tokenizer.decode(list(prompt_ids))
            turn = text.count("<|im_start|>assistant") - 1
            question = text.split("<|im_start|>user\n", 1)[-1].split("<|im_end|>", 1)[0]
            if turn == 0 and "[fault:engine_error]" in question:
                raise EngineError("request rejected by vLLM: injected fault")
            if turn == 0 and "[fault:engine_hang]" in question:
                await anyio.sleep_forever()
            reply = self.script(question, turn)
            ids = self._encoded.get(reply)
            if ids is None:
                ids = self._encoded[reply] = self.tokenizer.encode(reply, add_special_tokens=False)
            ids = [*ids, self.end_of_turn_id]
            limit = sampling.max_tokens or len(ids)
            finish = "stop" if len(ids) <= limit else "length"
            ids = ids[:limit]
            self.served += 1
            return Generation(token_ids=ids, logprobs=[-0.25] * len(ids), finish_reason=finish)
        finally:
            self.in_flight -= 1


def default_script(question: str, turn: int) -> str:
    """Turn 0 calls the tool named by `[tool:NAME]` in the question (calculator by default); then answers 84."""
    if turn == 0:
        name = question.split("[tool:", 1)[1].split("]", 1)[0] if "[tool:" in question else "calculator"
        arguments = '{"expression": "12 * 7"}' if name == "calculator" else "{}"
        return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'
    return "12 * 7 = 84. The answer is 84."


class CountingEnvironment(ToolEnvironment):
    """A `ToolEnvironment` that counts `close` calls per trajectory (`closed[sample.id]`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.closed: dict[str, int] = {}

    async def close(self, sample: Sample) -> None:
        self.closed[sample.id] = self.closed.get(sample.id, 0) + 1
        await super().close(sample)
