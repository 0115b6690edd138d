"""Server-side trajectory capture: calls tagged with a trajectory id are recorded token-exactly.

An agent written against the OpenAI API sends its whole history as text on every call. Re-rendering that text
would re-tokenize earlier model output (and drift). Instead, when a chat request extends the previous call of the
same trajectory (same messages, then the assistant message this server returned, then new observation messages),
its prompt is built as: previous prompt ids + the ids the engine sampled + the template glue of the new messages
(after a turn cut by `max_tokens`, the glue starts with the end-of-turn token the engine did not sample, and the
ids of a call left unfinished by the cut stay in the run although the reply leaves that call out). The assistant
message recorded is the one the client received, tool-call ids included, so the ids a client echoes back (the
assistant message's `tool_calls[].id`, the tool messages' `tool_call_id`) are the recorded ones.
Otherwise (history rewritten, e.g. summarized, or new messages the template cannot append exactly, such as a user
message after a Qwen3 thinking turn) the prompt is rendered from the messages and a new run begins; the trajectory
then has several runs, each exact. The runs are built by the same `RunRecorder` the rollout's turn loop uses. Message contents are encoded as plain text either way: only the
template's own glue becomes special tokens. For chat templates without `tools` support, the tool
schemas of a request are described in the system message.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agentic_rl.chat import ChatRenderer
from agentic_rl.parser import HERMES, action_text, find_tool_calls, format_tool_calls, tool_call_format
from agentic_rl.tools.prompt import tools_system_prompt
from agentic_rl.types import RunRecorder, Step, StepTrajectory, TerminationReason, TokenRun

__all__ = ["CapturedTurn", "TrajectoryRecorder", "rendered_messages", "template_messages"]


@dataclass(slots=True)
class CapturedTurn:
    """One recorded call.

    Attributes:
        prompt_ids: the exact prompt the engine saw (given to `TrajectoryRecorder.record`, which moves the ids into
            the trajectory's token runs and keeps the call's `run` and `span` instead).
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
        weight_version: the engine's weight version when the call was prepared.
        weight_versions: the weight version that sampled each of `response_ids` (they differ when the weights
            changed while the call was sampled); None: `weight_version` for all. Moved into the run by `record`.
        run: index of the trajectory's token run the call was sampled in (set by `record`).
        span: `[start, end)` of its sampled ids in that run's `response_ids` (set by `record`).
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
    weight_version: int = 0
    weight_versions: list[int] | None = None
    run: int = 0
    span: tuple[int, int] = (0, 0)


@dataclass(slots=True)
class _Captured:
    """What one trajectory id holds: its token runs and its calls (without their ids, which live in the runs)."""

    recorder: RunRecorder = field(default_factory=RunRecorder)
    turns: list[CapturedTurn] = field(default_factory=list)


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


def template_messages(
    messages: Sequence[dict[str, Any]], renderer: ChatRenderer | None, call_format: str | None = None
) -> list[dict[str, Any]]:
    """Messages in the form the chat template takes.

    Assistant `tool_calls` get their `arguments` as objects for templates that render tool calls; for templates
    that do not (or `renderer=None`), the calls are written into the content after it (`parser.format_tool_calls`)
    in the format the model produced (`call_format`; None: the one `renderer`'s template teaches, `HERMES` without a
    renderer; Mistral's calls keep their ids), giving plain `{"role", "content"}` messages.
    """
    if call_format is None:
        call_format = tool_call_format(renderer.tokenizer.chat_template) if renderer is not None else HERMES
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
            out.append(
                {
                    "role": "assistant",
                    "content": m.get("content") or "",
                    "tool_calls": [
                        {
                            **({"id": c["id"]} if c.get("id") else {}),
                            "type": "function",
                            "function": {"name": f.get("name"), "arguments": _arguments(f.get("arguments"))},
                        }
                        for c, f in zip(calls, functions, strict=True)
                    ],
                }
            )
        else:
            written = format_tool_calls(
                [
                    (f.get("name"), _arguments(f.get("arguments")), c.get("id"))
                    for c, f in zip(calls, functions, strict=True)
                ],
                call_format,
                ensure_ascii=True,
            )
            content = "\n".join([*([m["content"]] if m.get("content") else []), written])
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
        self._captured: OrderedDict[str, _Captured] = OrderedDict()
        self._lock = threading.Lock()

    def ids(self) -> list[str]:
        with self._lock:
            return list(self._captured)

    def _last(self, trajectory_id: str | None) -> tuple[CapturedTurn, list[int], list[int]] | None:
        """The last call of a trajectory, with its run's prompt and response ids so far (copies)."""
        if trajectory_id is None:
            return None
        with self._lock:
            captured = self._captured.get(trajectory_id)
            if captured is None or not captured.turns:
                return None
            run = captured.recorder.current
            return captured.turns[-1], list(run.prompt_ids), list(run.response_ids)

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
        last = self._last(trajectory_id)
        if last is not None:
            prev, prompt, response = last
            continued = self._continuation(prev, response, messages, tools, renderer, template_kwargs)
            if continued is not None:
                return prompt + response + continued, True
        return renderer.prompt_ids(rendered_messages(messages, tools, renderer), tools), False

    @staticmethod
    def _continuation(
        prev: CapturedTurn,
        response: list[int],
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        renderer: ChatRenderer,
        template_kwargs: dict[str, Any] | None,
    ) -> list[int] | None:
        """The ids that append `messages` to the previous call's run, or None when they do not extend it."""
        if prev.messages is None or prev.response_message is None:
            return None
        k = len(prev.messages)
        closed = prev.span[1] > prev.span[0] and response[prev.span[1] - 1] == renderer.end_of_turn_id
        # Cut by max_tokens: the client holds the sampled text (or the calls completed before the cut), without an
        # ending; the run keeps every sampled id, the unfinished call's too, as the engine saw them.
        cut = prev.finish_reason == "length"
        new = messages[k + 1 :]
        if not (
            (closed or cut)
            and len(messages) > k + 1
            and prev.tools == tools
            and (prev.template_kwargs or None) == (template_kwargs or None)
            and [_normalize(m) for m in messages[:k]] == [_normalize(m) for m in prev.messages]
            and _normalize(messages[k]) == _normalize(prev.response_message)
            and all(m["role"] != "assistant" for m in new)
        ):
            return None
        observation = template_messages(new, renderer)
        if renderer.append_problem(observation) is not None:  # the template rewrites the history
            return None
        ending = [] if closed else [renderer.end_of_turn_id]
        return ending + renderer.observation_ids(observation, tools)

    def completion_continues(self, trajectory_id: str | None, prompt_ids: list[int]) -> bool:
        """Whether raw prompt ids start with the trajectory's previous prompt + response ids."""
        last = self._last(trajectory_id)
        if last is None:
            return False
        _, prompt, response = last
        return TokenRun(prompt, response).extends(prompt_ids)

    def record(self, trajectory_id: str, turn: CapturedTurn) -> None:
        """Add one call: its ids extend the trajectory's current run (`turn.continued`) or start a new one."""
        with self._lock:
            captured = self._captured.setdefault(trajectory_id, _Captured())
            recorder = captured.recorder
            if turn.continued and recorder.runs and recorder.current.extends(turn.prompt_ids):
                recorder.insert(turn.prompt_ids[recorder.current.total_length :])  # the observation and its glue
            else:
                recorder.start(turn.prompt_ids)
            versions = turn.weight_version if turn.weight_versions is None else turn.weight_versions
            _, span = recorder.sample(turn.response_ids, turn.logprobs, versions)
            captured.turns.append(
                dataclasses.replace(
                    turn,
                    prompt_ids=[],
                    response_ids=[],
                    logprobs=[],
                    weight_versions=None,
                    run=len(recorder.runs) - 1,
                    span=span,
                )
            )
            self._captured.move_to_end(trajectory_id)
            while len(self._captured) > self.max_trajectories:
                self._captured.popitem(last=False)

    def build(self, trajectory_id: str, *, pop: bool = False, idx: int = 0) -> StepTrajectory:
        """Assemble the captured calls of one trajectory.

        Its `runs` hold every call's ids (the top-level token fields the last run: its first prompt, then sampled
        ids with mask 1 and observation glue with mask 0); each step points at its call's run and span.

        Raises:
            KeyError: if nothing was captured under `trajectory_id`.
        """
        with self._lock:
            captured = self._captured.pop(trajectory_id) if pop else self._captured[trajectory_id]
            runs = [run.copy() for run in captured.recorder.runs]
            turns = list(captured.turns)
        call_format = tool_call_format(self.renderer.tokenizer.chat_template)
        steps = [_step(t, runs[t.run], call_format) for t in turns]
        if steps:
            steps[-1].done = True
        last = turns[-1]
        reply = [self._recorded_reply(last, runs[last.run])] if last.response_message else []
        chat = [*(last.messages or []), *reply]
        return StepTrajectory.from_runs(
            runs,
            idx=idx,
            chat_completions=template_messages(chat, None, call_format),
            metrics={"steps": len(turns), "generated_tokens": sum(run.num_sampled for run in runs)},
            termination_reason=TerminationReason.CAPTURED,
            task={"trajectory_id": trajectory_id},
            steps=steps,
        )

    def _recorded_reply(self, turn: CapturedTurn, run: TokenRun) -> dict[str, Any]:
        """The last call's reply as the record keeps it: as returned, except a chat reply cut by `max_tokens` while
        it wrote a tool call, which the client got as the text before the call; the record keeps all it sampled
        (the call's start included, decoded from `run` when the call recorded no text), so that a reward reads it
        as a turn that was calling a tool, not as a final answer."""
        reply = turn.response_message
        assert reply is not None
        if turn.finish_reason != "length" or reply.get("tool_calls"):
            return reply
        ids = run.response_ids[turn.span[0] : turn.span[1]]
        sampled = turn.text or self.renderer.tokenizer.decode(ids, skip_special_tokens=False)
        call_format = tool_call_format(self.renderer.tokenizer.chat_template)
        return {**reply, "content": sampled} if find_tool_calls(sampled, None, call_format)[0] >= 0 else reply


def _written(turn: CapturedTurn, call_format: str) -> str:
    """What the model wrote in a call: the completion's text, or the chat reply with its tool calls written as the
    model produced them (in `call_format`)."""
    if turn.response_message is None:
        return turn.text
    return str(template_messages([turn.response_message], None, call_format)[0]["content"])


def _step(turn: CapturedTurn, run: TokenRun, call_format: str) -> Step:
    """The `Step` of one captured call."""
    info = {
        "finish_reason": turn.finish_reason,
        "continued": turn.continued,
        "streamed": turn.streamed,
        "weight_version": turn.weight_version,
        **({"tools": turn.tools} if turn.tools else {}),
        **({"chat_template_kwargs": turn.template_kwargs} if turn.template_kwargs else {}),
    }
    versions = (run.weight_versions or [])[turn.span[0] : turn.span[1]]
    if versions:  # [min, max] of its tokens: they differ when the weights changed while the call was sampled
        info["weight_versions"] = [min(versions), max(versions)]
    return Step(
        chat_completions=[*(turn.messages or []), *([turn.response_message] if turn.response_message else [])],
        action=action_text(_written(turn, call_format), call_format),
        observation=(turn.messages or [{}])[-1].get("content", "") if turn.messages else "",
        model_response=turn.text,
        info=info,
        run=run,
        span=turn.span,
    )
