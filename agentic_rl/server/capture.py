"""Server-side trajectory capture: calls tagged with a trajectory id are recorded token-exactly.

An agent written against the OpenAI API sends its whole history as text on every call. Re-rendering that text
would re-tokenize earlier model output (and drift). Instead, when a chat request extends the previous call of the
same trajectory (same messages, then the assistant message this server returned, then new observation messages),
its prompt is built as: previous prompt ids + the ids the engine sampled + the template glue of the new messages
(after a turn cut by `max_tokens`, the glue starts with the end-of-turn token the engine did not sample).
Otherwise (history rewritten, e.g. summarized, or new messages the template cannot append exactly, such as a user
message after a Qwen3 thinking turn) the prompt is rendered from the messages and a new run begins; the trajectory
then has several runs, each exact, kept per step. Message contents are encoded as plain text either way: only the
template's own glue becomes special tokens. For chat templates without `tools` support, the tool
schemas of a request are described in the system message.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agentic_rl.chat import ChatRenderer
from agentic_rl.tools.prompt import tools_system_prompt
from agentic_rl.types import Step, StepTrajectory

__all__ = ["CapturedTurn", "TrajectoryRecorder", "rendered_messages", "template_messages"]


@dataclass(slots=True)
class CapturedTurn:
    """One recorded call.

    Attributes:
        prompt_ids: the exact prompt the engine saw.
        response_ids: the ids it sampled (with the end-of-turn token when it stopped on one).
        logprobs: their logprobs (nats).
        continued: True when `prompt_ids` starts with the previous turn's prompt + response ids.
        finish_reason: the engine's finish reason.
        messages: the request's chat messages (None for `/v1/completions`).
        response_message: the assistant message the server returned (None for completions).
        tools: the request's tool schemas.
        text: the text the client received (completions) or the decoded sampled text (chat).
        template_kwargs: the request's `chat_template_kwargs`.
        streamed: whether the call was answered as a stream.
    """

    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    continued: bool
    finish_reason: str
    messages: list[dict[str, Any]] | None = None
    response_message: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    text: str = ""
    template_kwargs: dict[str, Any] | None = None
    streamed: bool = False


def _arguments(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def _normalize(message: dict[str, Any]) -> tuple[Any, ...]:
    calls = tuple(
        (
            c.get("function", c).get("name"),
            json.dumps(_arguments(c.get("function", c).get("arguments")), sort_keys=True),
        )
        for c in (message.get("tool_calls") or [])
    )
    return message.get("role"), message.get("content") or "", calls


def template_messages(messages: Sequence[dict[str, Any]], renderer: ChatRenderer | None) -> list[dict[str, Any]]:
    """Messages in the form the chat template takes.

    Assistant `tool_calls` get their `arguments` as objects for templates that render tool calls; for templates
    that do not (or `renderer=None`), the calls are written into the content as `<tool_call>` blocks (the format
    the model produced), giving plain `{"role", "content"}` messages.
    """
    out: list[dict[str, Any]] = []
    for m in messages:
        calls = m.get("tool_calls") or []
        if m.get("role") != "assistant" or not calls:
            plain = {"role": m["role"], "content": m.get("content") or ""}
            if m.get("role") == "tool":  # some templates name the call a result answers
                plain.update({k: m[k] for k in ("tool_call_id", "name") if m.get(k) is not None})
            out.append(plain)
            continue
        functions = [c.get("function", c) for c in calls]
        if renderer is not None and renderer.supports_tools:
            out.append({
                "role": "assistant",
                "content": m.get("content") or "",
                "tool_calls": [
                    {**({"id": c["id"]} if c.get("id") else {}), "type": "function",
                     "function": {"name": f.get("name"), "arguments": _arguments(f.get("arguments"))}}
                    for c, f in zip(calls, functions, strict=True)
                ],
            })  # fmt: skip
        else:
            blocks = [
                "<tool_call>\n" + json.dumps({"name": f.get("name"), "arguments": _arguments(f.get("arguments"))}) + "\n</tool_call>"
                for f in functions
            ]  # fmt: skip
            content = "\n".join(([m["content"]] if m.get("content") else []) + blocks)
            out.append({"role": "assistant", "content": content})
    return out


def _with_tools_in_system_prompt(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For templates without `tools` support: describe the tools in the system message (added if missing)."""
    if messages and messages[0]["role"] == "system":
        return [{**messages[0], "content": tools_system_prompt(messages[0]["content"], tools)}, *messages[1:]]
    return [{"role": "system", "content": tools_system_prompt("You are a helpful assistant.", tools)}, *messages]


def rendered_messages(
    messages: Sequence[dict[str, Any]], tools: list[dict[str, Any]] | None, renderer: ChatRenderer
) -> list[dict[str, Any]]:
    """The messages exactly as the chat template receives them for a prompt rendered from scratch."""
    out = template_messages(messages, renderer)
    if tools and not renderer.supports_tools:
        out = _with_tools_in_system_prompt(out, tools)
    return out


class TrajectoryRecorder:
    """Thread-safe store of captured calls, keyed by trajectory id (oldest dropped past `max_trajectories`)."""

    def __init__(self, renderer: ChatRenderer, *, max_trajectories: int = 4096) -> None:
        self.renderer = renderer
        self.max_trajectories = max_trajectories
        self._turns: OrderedDict[str, list[CapturedTurn]] = OrderedDict()
        self._lock = threading.Lock()

    def ids(self) -> list[str]:
        with self._lock:
            return list(self._turns)

    def _last(self, trajectory_id: str | None) -> CapturedTurn | None:
        if trajectory_id is None:
            return None
        with self._lock:
            turns = self._turns.get(trajectory_id)
            return turns[-1] if turns else None

    def chat_prompt(
        self,
        trajectory_id: str | None,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        *,
        renderer: ChatRenderer | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> tuple[list[int], bool]:
        """Prompt ids for a chat request, and whether they continue the trajectory's previous call exactly.

        Args:
            trajectory_id: the capture id (None: no capture, the messages are rendered).
            messages: plain messages (string content, roles system/user/assistant/tool).
            tools: the request's tool schemas.
            renderer: the renderer for the request's `chat_template_kwargs` (default: the recorder's).
            template_kwargs: those kwargs; a call continues only a previous call made with the same ones.
        """
        renderer = renderer or self.renderer
        prev = self._last(trajectory_id)
        if prev is not None and prev.messages is not None and prev.response_message is not None:
            k = len(prev.messages)
            closed = bool(prev.response_ids) and prev.response_ids[-1] == renderer.end_of_turn_id
            cut = prev.finish_reason == "length"  # the client holds all the sampled text, without an ending
            new = messages[k + 1 :]
            if (
                (closed or cut)
                and len(messages) > k + 1
                and prev.tools == tools
                and (prev.template_kwargs or None) == (template_kwargs or None)
                and [_normalize(m) for m in messages[:k]] == [_normalize(m) for m in prev.messages]
                and _normalize(messages[k]) == _normalize(prev.response_message)
                and all(m["role"] != "assistant" for m in new)
            ):
                observation = template_messages(new, renderer)
                if renderer.append_problem(observation) is None:  # else: the template rewrites the history
                    ending = [] if closed else [renderer.end_of_turn_id]
                    glue = renderer.observation_ids(observation, tools)
                    return prev.prompt_ids + prev.response_ids + ending + glue, True
        return renderer.prompt_ids(rendered_messages(messages, tools, renderer), tools), False

    def completion_continues(self, trajectory_id: str | None, prompt_ids: list[int]) -> bool:
        """Whether raw prompt ids start with the trajectory's previous prompt + response ids."""
        prev = self._last(trajectory_id)
        if prev is None:
            return False
        head = prev.prompt_ids + prev.response_ids
        return len(prompt_ids) > len(head) and prompt_ids[: len(head)] == head

    def record(self, trajectory_id: str, turn: CapturedTurn) -> None:
        with self._lock:
            self._turns.setdefault(trajectory_id, []).append(turn)
            self._turns.move_to_end(trajectory_id)
            while len(self._turns) > self.max_trajectories:
                self._turns.popitem(last=False)

    def build(self, trajectory_id: str, *, pop: bool = False, idx: int = 0) -> StepTrajectory:
        """Assemble the captured calls of one trajectory.

        The top-level token fields hold the last continuous run (its first prompt, then sampled ids with mask 1 and
        observation glue with mask 0); every step also keeps its own exact `prompt_ids` / `response_ids`.
        `metrics["continuous"]` is False when the history was rewritten between calls.

        Raises:
            KeyError: if nothing was captured under `trajectory_id`.
        """
        with self._lock:
            turns = list(self._turns.pop(trajectory_id) if pop else self._turns[trajectory_id])
        run_start = max(i for i, t in enumerate(turns) if i == 0 or not t.continued)
        run = turns[run_start:]
        response: list[int] = []
        mask: list[int] = []
        logprobs: list[float] = []
        for i, turn in enumerate(run):
            if i > 0:
                prev = run[i - 1]
                glue = turn.prompt_ids[len(prev.prompt_ids) + len(prev.response_ids) :]
                response += glue
                mask += [0] * len(glue)
                logprobs += [0.0] * len(glue)
            response += turn.response_ids
            mask += [1] * len(turn.response_ids)
            logprobs += turn.logprobs
        steps = [
            Step(
                chat_completions=[*(t.messages or []), *([t.response_message] if t.response_message else [])],
                action=[c["function"] for c in (t.response_message or {}).get("tool_calls") or []],
                observation=(t.messages or [{}])[-1].get("content", "") if t.messages else "",
                model_response=t.text,
                info={"finish_reason": t.finish_reason, "continued": t.continued, "streamed": t.streamed,
                      **({"tools": t.tools} if t.tools else {}),
                      **({"chat_template_kwargs": t.template_kwargs} if t.template_kwargs else {})},
                prompt_ids=t.prompt_ids,
                response_ids=t.response_ids,
                response_logprobs=t.logprobs,
            )
            for t in turns
        ]
        if steps:
            steps[-1].done = True
        last = turns[-1]
        chat = [*(last.messages or []), *([last.response_message] if last.response_message else [])]
        return StepTrajectory(
            prompt_tokens=run[0].prompt_ids,
            response_tokens=response,
            response_masks=mask,
            response_logprobs=logprobs,
            idx=idx,
            chat_completions=template_messages(chat, None),
            metrics={"steps": len(turns), "continuous": run_start == 0,
                     "generated_tokens": sum(len(t.response_ids) for t in turns)},  # every run, like a rollout
            termination_reason="captured",
            task={"trajectory_id": trajectory_id},
            steps=steps,
        )
