"""Agent memory: the message history a model is prompted with, kept under `max_prompt_length` tokens.

`MemorySimple` holds messages and can drop `<think>` blocks. `MemorySummary` also replaces the middle of a long
history by one `{"role": "summary"}` message written by a summary client (e.g. `ChatSummaryClient` over an
`EngineChatClient`: the run's own engine, called in process; or `OpenAISummaryClient`: an HTTP endpoint), and falls
back to dropping the oldest middle turns when the summary client fails.

What is never summarized, dropped or simplified: by default (`keep_task`) the system message(s) and the first user
message (the task's question), which open every prompt verbatim; the first `before_raw_message` and the last
`-end_raw_message` messages. Compression works on whole turns only: an assistant message and the tool messages that
answer its calls go together, so a `tool` message always follows its call. Lengths are measured on the prompt as the
chat template renders it, tool schemas included, once the harness hands the memory its renderer (`render_with`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from pydantic import Field, model_validator

from agentic_rl.config import Config
from agentic_rl.engine.chat_client import ChatClient
from agentic_rl.errors import ConfigError
from agentic_rl.limits import MaxPromptLength
from agentic_rl.parser import strip_thoughts

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

PromptIds = Callable[[Sequence[dict[str, str]], Sequence[dict[str, Any]] | None], Sequence[int]]
"""`(messages, tools) -> prompt token ids`, e.g. `ChatRenderer.prompt_ids`: the prompt as the template renders it."""

ROLES = ("system", "user", "assistant", "tool", "summary")

DEFAULT_SUMMARY_PROMPT = (
    "You compress the middle of an agent's conversation so the agent can continue its task. Write a faithful, "
    "structured summary of at most {max_summary_length} tokens with these sections: Goal; Facts found (with exact "
    "numbers, names and tool results); Actions taken; Open questions; Next step. Do not invent anything."
)


class MemoryConfig(Config):
    """Memory settings (validated again on every assignment).

    Attributes:
        simplify_thinking: drop the reasoning (`parser.strip_thoughts`) of assistant messages between the raw head
            and tail.
        use_summary: summarize the middle of the history when the prompt exceeds `max_prompt_length`.
        max_summary_length: target length of a summary in tokens, in [1, max_prompt_length].
        max_prompt_length: prompt budget in tokens, in [1, 131072], measured on the rendered prompt.
        keep_task: keep the system message(s) and the first user message (the task's question) verbatim at the
            start of every prompt, never summarized, dropped or simplified. False: only `before_raw_message`
            protects the start of the history.
        before_raw_message: >= 0; this many first messages are never summarized or simplified (extended to the end
            of the turn it cuts into, so a call and its tool results stay together).
        end_raw_message: <= 0; the last `-end_raw_message` messages are never summarized or simplified (extended
            back to the start of the turn it cuts into).
        max_summary_request_length: most tokens of the summary request's rendered prompt, >= 1; the contents of
            a longer request's longest messages are cut. None: the summary model's window minus
            `max_summary_length` when the client knows its window (a `ChatClient` over an engine, e.g. the run's
            own `EngineChatClient`); no limit when it does not (an HTTP endpoint: set it there).
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
    keep_task: bool = True
    before_raw_message: int = Field(default=0, ge=0)
    end_raw_message: int = Field(default=0, le=0)
    max_summary_request_length: int | None = Field(default=None, ge=1)
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
    return [
        {"role": "system", "content": system_prompt},
        {"role": "user", "content": f"Conversation to summarize:\n\n{transcript}"},
    ]


def _task_length(messages: Sequence[dict[str, str]]) -> int:
    """How many first messages state the task: the leading system message(s) through the first user message (the
    question); only the leading system messages when no user message comes before an assistant turn."""
    for i, m in enumerate(messages):
        if m["role"] == "user":
            return i + 1
        if m["role"] != "system":
            return i
    return len(messages)


def _split_turns(messages: Sequence[dict[str, str]]) -> list[list[dict[str, str]]]:
    """`messages` as whole turns: each non-`tool` message with the `tool` messages right after it (an assistant
    message with the results of all its tool calls). A leading run of `tool` messages forms its own group."""
    turns: list[list[dict[str, str]]] = []
    for m in messages:
        if m["role"] == "tool" and turns:
            turns[-1].append(m)
        else:
            turns.append([m])
    return turns


def _cut_contents(messages: Sequence[dict[str, str]], max_chars: int) -> list[dict[str, str]]:
    """`messages` with every content longer than `max_chars` characters cut to its first `max_chars` and a note
    of how many characters were cut."""
    return [
        m
        if len(m["content"]) <= max_chars
        else {
            "role": m["role"],
            "content": f"{m['content'][:max_chars]}\n[... {len(m['content']) - max_chars} characters cut]",
        }
        for m in messages
    ]


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

    @property
    def window(self) -> int | None:
        """The summary model's context window in tokens when the chat client runs over an engine (its
        `max_model_len`), else None."""
        window = getattr(getattr(self.chat_client, "engine", None), "max_model_len", None)
        return window if isinstance(window, int) else None


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

    def __init__(
        self,
        config: MemoryConfig | dict[str, Any] | None = None,
        *,
        tokenizer: Any = None,
        messages: Sequence[dict[str, str]] = (),
    ) -> None:
        self.config = config if isinstance(config, MemoryConfig) else MemoryConfig(**(config or {}))
        if self.config.train_model_tokenizer_path:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(self.config.train_model_tokenizer_path)
        self.tokenizer = tokenizer
        self._prompt_ids: PromptIds | None = None
        self._tools: list[dict[str, Any]] | None = None
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

    def render_with(self, prompt_ids: PromptIds, tools: Sequence[dict[str, Any]] | None = None) -> None:
        """Measure every length on the prompt as it is rendered: `len(prompt_ids(messages, tools))`.

        Args:
            prompt_ids: `(template messages, tools) -> token ids` of the prompt with the generation prompt, e.g. a
                `ChatRenderer`'s `prompt_ids`: the same rendering the prompt is sent with.
            tools: the OpenAI function schemas the template renders into agent prompts (the trajectory's
                `Sample.tools`); summary requests are rendered without them.
        """
        self._prompt_ids = prompt_ids
        self._tools = list(tools) if tools else None

    def count_tokens(self, messages: Sequence[dict[str, str]]) -> int:
        """Prompt length of `messages` in tokens, with the generation prompt: as `render_with`'s `prompt_ids`
        renders them with the tools; without it, by the tokenizer's chat template (when it has one).

        Raises:
            ConfigError: with neither `render_with` nor a tokenizer.
        """
        return self._length(to_template_messages(messages), self._tools)

    def _length(self, messages: Sequence[dict[str, str]], tools: Sequence[dict[str, Any]] | None) -> int:
        """Tokens of the prompt that renders template-ready `messages` with `tools`."""
        if self._prompt_ids is not None:
            return len(self._prompt_ids(messages, tools))
        if self.tokenizer is None:
            raise ConfigError("measuring lengths needs render_with(), a tokenizer or config.train_model_tokenizer_path")
        if getattr(self.tokenizer, "chat_template", None):
            text = self.tokenizer.apply_chat_template(
                list(messages), tools=tools, tokenize=False, add_generation_prompt=True
            )
            return len(self.tokenizer.encode(text, add_special_tokens=False))
        return sum(len(self.tokenizer.encode(m["content"], add_special_tokens=False)) for m in messages)

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

    def _raw_bounds(self, messages: Sequence[dict[str, str]]) -> tuple[int, int]:
        """Index range [start, stop) of the messages that may be summarized, dropped or simplified: whole turns
        after the task (`keep_task`) and the raw head, before the raw tail."""
        n = len(messages)
        start = min(max(self.config.before_raw_message, _task_length(messages) if self.config.keep_task else 0), n)
        while start < n and messages[start]["role"] == "tool":  # the head keeps the results of its last call
            start += 1
        stop = max(start, n + self.config.end_raw_message)
        while start < stop < n and messages[stop]["role"] == "tool":  # the tail keeps the call of its first results
            stop -= 1
        return start, stop

    def _simplified(self, messages: list[dict[str, str]]) -> list[dict[str, str]]:
        if not self.config.simplify_thinking:
            return messages
        start, stop = self._raw_bounds(messages)
        out = list(messages)
        for i in range(start, stop):
            if out[i]["role"] != "assistant":  # only the model reasons; a tool result may quote a tag
                continue
            stripped = strip_thoughts(out[i]["content"])
            out[i] = {"role": out[i]["role"], "content": stripped or "(thinking omitted)"}
        return out

    def _warn_if_long(self, messages: list[dict[str, str]]) -> None:
        if self._prompt_ids is None and self.tokenizer is None:
            return
        length = self.count_tokens(messages)
        if length > self.config.max_prompt_length:
            logger.warning(
                "PROMPT_TRUNCATION: prompt has %d tokens, max_prompt_length is %d",
                length,
                self.config.max_prompt_length,
            )

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

    The summary replaces the summarized turns in the memory itself, so later calls only add to it: the history
    stays task, summary, newer turns, and a later summary takes in the earlier one. The summary request is cut to
    fit its budget (`max_summary_request_length`): the longest message contents (e.g. one huge tool result) are
    shortened first. When the summary client fails or is too slow, the oldest middle turns are dropped instead
    (with a warning) and the trajectory continues.

    Args:
        chat_client: a `SummaryClient`, or a `ChatClient` (e.g. an `EngineChatClient`) that writes the summaries
            through a `ChatSummaryClient`; built from `config.oai_client` when None and that is set.
    """

    def __init__(
        self,
        config: MemoryConfig | dict[str, Any] | None = None,
        *,
        chat_client: SummaryClient | ChatClient | None = None,
        tokenizer: Any = None,
        messages: Sequence[dict[str, str]] = (),
    ) -> None:
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
        import asyncio

        import anyio

        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return anyio.run(self.aget_prompt_messages, config)
        raise RuntimeError("get_prompt_messages blocks: inside an event loop use `await aget_prompt_messages(...)`")

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
        """Replace the middle turns by one summary, or drop the oldest of them when the summary fails."""
        start, stop = self._raw_bounds(self.messages)
        middle = self.messages[start:stop]
        if not middle:
            return
        head, tail = self.messages[:start], self.messages[stop:]
        try:
            summary = await self._summarize(middle)
            self.messages = [*head, {"role": "summary", "content": summary}, *tail]
            self.summaries += 1
        except Exception as exc:  # a failing summary must not end the trajectory (cancellation is not caught)
            self.fallbacks += 1
            logger.warning("summary failed (%s: %s); dropping the oldest middle turns instead", type(exc).__name__, exc)
            self.messages = [*head, *self._newest_turns_that_fit(head, middle, tail), *tail]

    def _newest_turns_that_fit(
        self, head: list[dict[str, str]], middle: list[dict[str, str]], tail: list[dict[str, str]]
    ) -> list[dict[str, str]]:
        """The newest whole turns of `middle` that fit in `max_prompt_length` between `head` and `tail`."""
        turns = _split_turns(middle)
        kept = [m for turn in turns for m in turn]
        while turns and self.count_tokens([*head, *kept, *tail]) > self.config.max_prompt_length:
            kept = kept[len(turns.pop(0)) :]
        return kept

    async def _summarize(self, middle: list[dict[str, str]]) -> str:
        """The summary client's summary of `middle`, asked with a request that fits its budget.

        Raises:
            ConfigError: without a summary client, or when the request cannot fit; anything the client raises.
        """
        if self.chat_client is None:
            raise ConfigError("no summary client configured")
        system_prompt = self.config.summary_system_prompt.format(max_summary_length=self.config.max_summary_length)
        fitting = self._fitting_request(middle, system_prompt)
        return await self.chat_client.summarize(
            fitting, system_prompt=system_prompt, max_tokens=self.config.max_summary_length
        )

    def summary_request_budget(self) -> int | None:
        """The summary request's budget (see `MemoryConfig.max_summary_request_length`).

        Returns:
            Most tokens of the summary request's rendered prompt, or None for no limit.
        """
        if self.config.max_summary_request_length is not None:
            return self.config.max_summary_request_length
        window = getattr(self.chat_client, "window", None)
        if isinstance(window, int):
            return max(1, window - self.config.max_summary_length)
        return None

    def _fitting_request(self, middle: list[dict[str, str]], system_prompt: str) -> list[dict[str, str]]:
        """`middle`, or a copy with its longest contents cut (as little as needed) so that the summary request
        renders within `summary_request_budget()` tokens (measured as `count_tokens` measures, without tools).

        Raises:
            ConfigError: if the request does not fit even with every content cut to nothing.
        """
        budget = self.summary_request_budget()
        if budget is None:
            return middle

        def fits(messages: list[dict[str, str]]) -> bool:
            return self._length(summary_request(messages, system_prompt), None) <= budget

        if fits(middle):
            return middle
        if not fits(_cut_contents(middle, 0)):
            raise ConfigError(f"the summary request of {len(middle)} messages does not fit in {budget} tokens")
        low, high = 0, max(len(m["content"]) for m in middle)  # fits when cut to `low` characters, not at `high`
        while high - low > 1:
            mid = (low + high) // 2
            low, high = (mid, high) if fits(_cut_contents(middle, mid)) else (low, mid)
        return _cut_contents(middle, low)
