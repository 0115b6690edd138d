"""Chat replies from an in-process `Engine`: messages rendered to prompt ids, the sampled ids decoded to text.

Helpers that ask the run's own model a question (memory summaries, the LLM-judge reward) use `EngineChatClient`
instead of going through the OpenAI-compatible HTTP server of the same process. `chat` is a coroutine: await it on
the event loop that drives the engine (the LLM judge is an async reward, which the harness awaits on its own loop);
never block a thread on it from inside that loop.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from agentic_rl.engine.base import Engine
from agentic_rl.engine.sampling import SamplingConfig
from agentic_rl.engine.turns import ABORTED, read_turn
from agentic_rl.errors import EngineAbortedError, EngineError

if TYPE_CHECKING:
    from agentic_rl.chat import ChatRenderer

__all__ = ["ChatClient", "EngineChatClient"]

GREEDY = {"temperature": 0.0}


@runtime_checkable
class ChatClient(Protocol):
    """Answers a chat: `{"role", "content"}` messages in, the assistant reply's text out."""

    async def chat(self, messages: Sequence[dict[str, str]], *, max_tokens: int) -> str: ...


class EngineChatClient:
    """A `ChatClient` over an in-process engine: no HTTP server, no serialization.

    The messages go through `renderer.prompt_ids` (contents read as plain text, generation prompt added); the
    engine samples until the template's end-of-turn token, `max_tokens` or the end of the model window; the reply
    is the decoded text without the token or stop string that ended it (as the OpenAI-compatible server answers).

    Args:
        engine: the engine to sample from (shared with the rollout: requests interleave with its turns).
        renderer: the chat renderer of the engine's model.
        sampling: sampling options of every call, a `SamplingConfig` or a dict of its options (default greedy:
            `{"temperature": 0.0}`); `max_tokens` is set per call, and the end-of-turn id is added to
            `stop_token_ids`.
        timeout_s: most seconds one call may take before its request is aborted (None = no limit).

    Raises:
        ConfigError: if `sampling` is invalid.
    """

    def __init__(
        self,
        engine: Engine,
        renderer: ChatRenderer,
        *,
        sampling: SamplingConfig | Mapping[str, Any] | None = None,
        timeout_s: float | None = 60.0,
    ) -> None:
        self.engine = engine
        self.renderer = renderer
        self.sampling = SamplingConfig.of(GREEDY if sampling is None else sampling)
        self.timeout_s = timeout_s

    def request(self, messages: Sequence[dict[str, str]], *, max_tokens: int) -> tuple[list[int], SamplingConfig]:
        """The prompt ids and sampling options of one call.

        Args:
            messages: `{"role", "content"}` dicts in an order the chat template accepts.
            max_tokens: most tokens of the reply, >= 1; lowered to what is left of the model window.

        Returns:
            (prompt ids, list[int]; the call's `SamplingConfig`).

        Raises:
            TemplateError: if the chat template cannot render `messages`.
            EngineError: if the prompt leaves no room in the model window.
        """
        prompt_ids = self.renderer.prompt_ids(messages)
        room = self.engine.max_model_len - len(prompt_ids)
        if room < 1:
            raise EngineError(
                f"the prompt has {len(prompt_ids)} tokens; the model window (max_model_len) is "
                f"{self.engine.max_model_len}, which leaves no room for a reply"
            )
        stops = [self.renderer.end_of_turn_id, *(self.sampling.stop_token_ids or [])]
        update = {"max_tokens": min(max_tokens, room), "stop_token_ids": list(dict.fromkeys(stops))}
        return prompt_ids, self.sampling.model_copy(update=update)

    async def chat(self, messages: Sequence[dict[str, str]], *, max_tokens: int) -> str:
        """The assistant's reply to `messages`, sampled by the engine.

        Args:
            messages: `{"role", "content"}` dicts in an order the chat template accepts.
            max_tokens: most tokens of the reply, >= 1.

        Returns:
            The reply's text: complete, or cut at `max_tokens`.

        Raises:
            TemplateError: if the chat template cannot render `messages`.
            EngineError: if the engine fails or aborts the request, or the prompt does not fit the window.
            TimeoutError: if the call took longer than `timeout_s` (its request is aborted).
        """
        import anyio

        prompt_ids, sampling = self.request(messages, max_tokens=max_tokens)
        with anyio.fail_after(self.timeout_s):
            generation = await self.engine.generate(prompt_ids, sampling)
        turn = read_turn(generation, self.renderer)
        if turn.kind == ABORTED:
            raise EngineAbortedError(f"the engine ended the request with finish_reason {generation.finish_reason!r}")
        return turn.content
