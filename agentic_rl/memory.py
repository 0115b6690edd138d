"""Agent memory: the message history a model is prompted with, kept under `max_prompt_length` tokens.

`MemorySimple` holds messages and can drop `<think>` blocks. `MemorySummary` also replaces the middle of a long
history by one `{"role": "summary"}` message written by a summary client (e.g. `ChatSummaryClient` over an
`EngineChatClient`: the run's own engine, called in process; or `OpenAISummaryClient`: an HTTP endpoint), and falls
back to dropping the oldest middle messages when the summary client fails. The first `before_raw_message`
and the last `-end_raw_message` messages are never summarized or simplified.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from pydantic import Field, model_validator

from agentic_rl.config import Config
from agentic_rl.engine.chat_client import ChatClient
from agentic_rl.errors import ConfigError
from agentic_rl.limits import MaxPromptLength

__all__ = [
    "DEFAULT_SUMMARY_PROMPT",
    "ChatSummaryClient",
    "MemoryConfig",
    "MemorySimple",
    "MemorySummary",
    "OpenAISummaryClient",
    "SummaryClient",
    "summary_request",
    "to_template_messages",
]

logger = logging.getLogger(__name__)

ROLES = ("system", "user", "assistant", "tool", "summary")
_THINK_BLOCK = re.compile(r"<think>.*?(?:</think>|$)\s*", re.DOTALL)

DEFAULT_SUMMARY_PROMPT = (
    "You compress the middle of an agent's conversation so the agent can continue its task. Write a faithful, "
    "structured summary of at most {max_summary_length} tokens with these sections: Goal; Facts found (with exact "
    "numbers, names and tool results); Actions taken; Open questions; Next step. Do not invent anything."
)


class MemoryConfig(Config):
    """Memory settings (validated again on every assignment).

    Attributes:
        simplify_thinking: drop `<think>...</think>` content from messages between the raw head and tail.
        use_summary: summarize the middle of the history when the prompt exceeds `max_prompt_length`.
        max_summary_length: target length of a summary in tokens, in [1, max_prompt_length].
        max_prompt_length: prompt budget in tokens, in [1, 131072].
        before_raw_message: >= 0; this many first messages are never summarized or simplified.
        end_raw_message: <= 0; the last `-end_raw_message` messages are never summarized or simplified.
        summary_system_prompt: system prompt of the summary call; `{max_summary_length}` is filled in.
        oai_client: an `openai.OpenAI` / `AsyncOpenAI` client for summaries (default: the client given to the
            memory; a `ToolAgentEngineWrapper` gives one over its own engine, called in process).
        oai_model_name: model name sent with summary calls.
        train_model_tokenizer_path: tokenizer used to measure lengths ("" = the tokenizer given to the memory).
    """

    simplify_thinking: bool = False
    use_summary: bool = False
    max_summary_length: int = Field(default=1024, ge=1)
    max_prompt_length: MaxPromptLength = 8192
    before_raw_message: int = Field(default=0, ge=0)
    end_raw_message: int = Field(default=0, le=0)
    summary_system_prompt: str = DEFAULT_SUMMARY_PROMPT
    oai_client: Any = None
    oai_model_name: str = "qwen2.5-7b-instruct"
    train_model_tokenizer_path: str = ""

    @model_validator(mode="after")
    def _summary_fits(self) -> MemoryConfig:
        if self.max_summary_length > self.max_prompt_length:
            raise ValueError(
                f"max_summary_length ({self.max_summary_length}) must be <= max_prompt_length ({self.max_prompt_length})"
            )
        if "{max_summary_length}" not in self.summary_system_prompt:
            raise ValueError("summary_system_prompt must contain the {max_summary_length} placeholder")
        return self


def to_template_messages(messages: Sequence[dict[str, str]]) -> list[dict[str, str]]:
    """Messages a chat template accepts: a `summary` message becomes a user message that says it is a summary."""
    out = []
    for m in messages:
        if m["role"] == "summary":
            out.append({"role": "user", "content": "Summary of the earlier conversation:\n" + m["content"]})
        else:
            out.append({"role": m["role"], "content": m["content"]})
    return out


@runtime_checkable
class SummaryClient(Protocol):
    """Writes a summary of messages. `summarize` may raise anything: the memory falls back to truncation."""

    async def summarize(self, messages: Sequence[dict[str, str]], *, system_prompt: str, max_tokens: int) -> str: ...


def summary_request(messages: Sequence[dict[str, str]], system_prompt: str) -> list[dict[str, str]]:
    """The chat that asks for a summary: `system_prompt`, then one user message holding the transcript of
    `messages` (each as `[role]` and its content)."""
    transcript = "\n\n".join(f"[{m['role']}]\n{m['content']}" for m in messages)
    return [{"role": "system", "content": system_prompt},
            {"role": "user", "content": f"Conversation to summarize:\n\n{transcript}"}]  # fmt: skip


class ChatSummaryClient:
    """Summaries written by a `ChatClient`, e.g. an `EngineChatClient` over the run's own engine (no HTTP).

    Args:
        chat_client: answers the `summary_request` chat with `chat(messages, *, max_tokens) -> str`.
    """

    def __init__(self, chat_client: ChatClient) -> None:
        self.chat_client = chat_client

    async def summarize(self, messages: Sequence[dict[str, str]], *, system_prompt: str, max_tokens: int) -> str:
        """The summary of `messages`, at most `max_tokens` tokens.

        Raises:
            ValueError: if the reply is empty; anything the chat client raises.
        """
        text = (await self.chat_client.chat(summary_request(messages, system_prompt), max_tokens=max_tokens)).strip()
        if not text:
            raise ValueError("the summary client returned an empty summary")
        return text


class OpenAISummaryClient(ChatSummaryClient):
    """Summaries through any OpenAI-compatible chat endpoint (an external server, or a user's `oai_client`).

    Args:
        base_url: e.g. `http://127.0.0.1:8000/v1`; ignored when `client` is given.
        model: the model name to send.
        client: an `openai.AsyncOpenAI` (or sync `openai.OpenAI`, run in a worker thread).
        timeout_s: per-call timeout in seconds.
    """

    def __init__(self, base_url: str | None = None, *, model: str, client: Any = None, timeout_s: float = 60.0) -> None:
        if client is None:
            if base_url is None:
                raise ConfigError("OpenAISummaryClient needs base_url or client")
            import openai

            client = openai.AsyncOpenAI(base_url=base_url, api_key="local", timeout=timeout_s, max_retries=0)
        super().__init__(self)  # its own chat client: `chat` below asks the endpoint
        self.client = client
        self.model = model
        self.timeout_s = timeout_s

    async def chat(self, messages: Sequence[dict[str, str]], *, max_tokens: int) -> str:
        """The endpoint's greedy (`temperature=0`) reply to `messages` ("" for a reply without content)."""
        import inspect

        import anyio
        import openai

        request = {"model": self.model, "messages": list(messages), "max_tokens": max_tokens, "temperature": 0.0}
        create = self.client.chat.completions.create
        with anyio.fail_after(self.timeout_s):
            if isinstance(self.client, openai.AsyncOpenAI) or inspect.iscoroutinefunction(create):
                response = await create(**request)
            else:  # a synchronous client: keep it off the event loop
                response = await anyio.to_thread.run_sync(lambda: create(**request), abandon_on_cancel=True)
        return response.choices[0].message.content or ""


class MemorySimple:
    """A message history with optional `<think>` stripping.

    Args:
        config: a `MemoryConfig` or a dict of its fields.
        tokenizer: measures lengths (with its chat template when it has one); loaded from
            `config.train_model_tokenizer_path` when that is set.
        messages: initial messages.

    Raises:
        ConfigError: for an invalid config or message.
    """

    def __init__(self, config: MemoryConfig | dict[str, Any] | None = None, *, tokenizer: Any = None,
                 messages: Sequence[dict[str, str]] = ()) -> None:  # fmt: skip
        self.config = config if isinstance(config, MemoryConfig) else MemoryConfig(**(config or {}))
        if self.config.train_model_tokenizer_path:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(self.config.train_model_tokenizer_path)
        self.tokenizer = tokenizer
        self.messages: list[dict[str, str]] = []
        for m in messages:
            self.add_message(m)

    def add_message(self, message: dict[str, str]) -> None:
        """Append one `{"role", "content"}` message.

        Raises:
            ConfigError: for an unknown role or an empty or non-string content.
        """
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise ConfigError(f"message role must be one of {ROLES}, got {role!r}")
        if not isinstance(content, str) or not content:
            raise ConfigError(f"message content must be a non-empty string, got {content!r}")
        self.messages.append({"role": role, "content": content})

    def count_tokens(self, messages: Sequence[dict[str, str]]) -> int:
        """Prompt length of `messages` in tokens (chat template applied when the tokenizer has one)."""
        if self.tokenizer is None:
            raise ConfigError("measuring lengths needs a tokenizer (or config.train_model_tokenizer_path)")
        converted = to_template_messages(messages)
        if getattr(self.tokenizer, "chat_template", None):
            text = self.tokenizer.apply_chat_template(converted, tokenize=False, add_generation_prompt=True)
            return len(self.tokenizer.encode(text, add_special_tokens=False))
        return sum(len(self.tokenizer.encode(m["content"], add_special_tokens=False)) for m in converted)

    def update_config(self, config: dict[str, Any] | None) -> None:
        """Apply field updates (validated).

        Raises:
            ConfigError: if `config` is not a dict or a value is invalid.
        """
        if config is None:
            return
        if not isinstance(config, dict):
            raise ConfigError(f"config must be a dict of MemoryConfig fields, got {type(config).__name__}")
        self.config = MemoryConfig(**{**self.config.model_dump(), **config})

    def _raw_bounds(self, n: int) -> tuple[int, int]:
        """Index range [start, stop) of the messages that may be summarized or simplified."""
        start = min(self.config.before_raw_message, n)
        stop = max(start, n + self.config.end_raw_message)
        return start, stop

    def _simplified(self, messages: list[dict[str, str]]) -> list[dict[str, str]]:
        if not self.config.simplify_thinking:
            return messages
        start, stop = self._raw_bounds(len(messages))
        out = list(messages)
        for i in range(start, stop):
            stripped = _THINK_BLOCK.sub("", out[i]["content"]).strip()
            out[i] = {"role": out[i]["role"], "content": stripped or "(thinking omitted)"}
        return out

    def _warn_if_long(self, messages: list[dict[str, str]]) -> None:
        if self.tokenizer is None:
            return
        length = self.count_tokens(messages)
        if length > self.config.max_prompt_length:
            logger.warning("PROMPT_TRUNCATION: prompt has %d tokens, max_prompt_length is %d", length,
                           self.config.max_prompt_length)  # fmt: skip

    def get_prompt_messages(self, config: dict[str, Any] | None = None) -> list[dict[str, str]]:
        """The messages to prompt with: `{"role", "content"}` only, non-empty, roles in system/user/assistant/tool/summary.

        Raises:
            ConfigError: if `config` is not a dict or holds invalid values, or the memory is empty.
        """
        self.update_config(config)
        if not self.messages:
            raise ConfigError("the memory holds no messages")
        out = self._simplified(list(self.messages))
        self._warn_if_long(out)
        return out


class MemorySummary(MemorySimple):
    """`MemorySimple` that summarizes the middle of an over-long history with `chat_client`.

    The summary replaces the summarized messages in the memory itself, so later calls only add to it. When the
    summary client fails or is too slow, the oldest middle messages are dropped instead (with a warning) and the
    trajectory continues.

    Args:
        chat_client: a `SummaryClient`, or a `ChatClient` (e.g. an `EngineChatClient`) that writes the summaries
            through a `ChatSummaryClient`; built from `config.oai_client` when None and that is set.
    """

    def __init__(self, config: MemoryConfig | dict[str, Any] | None = None, *,
                 chat_client: SummaryClient | ChatClient | None = None, tokenizer: Any = None,
                 messages: Sequence[dict[str, str]] = ()) -> None:  # fmt: skip
        super().__init__(config, tokenizer=tokenizer, messages=messages)
        if chat_client is None and self.config.oai_client is not None:
            chat_client = OpenAISummaryClient(client=self.config.oai_client, model=self.config.oai_model_name)
        if chat_client is not None and not isinstance(chat_client, SummaryClient):
            chat_client = ChatSummaryClient(chat_client)
        self.chat_client = chat_client
        self.summaries = 0
        self.fallbacks = 0

    def get_prompt_messages(self, config: dict[str, Any] | None = None) -> list[dict[str, str]]:
        """Synchronous form of `aget_prompt_messages` (runs its own event loop: not for use inside one)."""
        import anyio

        return anyio.run(self.aget_prompt_messages, config)

    async def aget_prompt_messages(self, config: dict[str, Any] | None = None) -> list[dict[str, str]]:
        """Summarize if needed, simplify, and return the prompt messages (see `MemorySimple.get_prompt_messages`)."""
        self.update_config(config)
        if not self.messages:
            raise ConfigError("the memory holds no messages")
        if self.config.use_summary and self.count_tokens(self.messages) > self.config.max_prompt_length:
            await self._compress()
        out = self._simplified(list(self.messages))
        self._warn_if_long(out)
        return out

    async def _compress(self) -> None:
        start, stop = self._raw_bounds(len(self.messages))
        middle = self.messages[start:stop]
        if not middle:
            return
        head, tail = self.messages[:start], self.messages[stop:]
        try:
            if self.chat_client is None:
                raise ConfigError("no summary client configured")
            system_prompt = self.config.summary_system_prompt.format(max_summary_length=self.config.max_summary_length)
            summary = await self.chat_client.summarize(middle, system_prompt=system_prompt,
                                                       max_tokens=self.config.max_summary_length)  # fmt: skip
            self.messages = [*head, {"role": "summary", "content": summary}, *tail]
            self.summaries += 1
        except Exception as exc:  # a failing summary must not end the trajectory (cancellation is not caught)
            self.fallbacks += 1
            logger.warning("summary failed (%s: %s); dropping the oldest middle messages instead", type(exc).__name__, exc)
            while middle and self.count_tokens([*head, *middle, *tail]) > self.config.max_prompt_length:
                middle.pop(0)
            self.messages = [*head, *middle, *tail]
