"""Response assembly: what a client reads from a choice's sampled ids, shared by whole and streamed responses.

The text (the stop token and a stop string cut off), the assistant message (tool calls parsed out when the request
allows them), the logprobs in OpenAI's chat and completion shapes, the token usage, the body of a whole response,
and the captured turn of a call tagged with a trajectory id. Streaming builds its chunks from the same parts, so a
streamed call reads and records exactly like a plain one.
"""

from __future__ import annotations

import json
import math
import uuid
from typing import Any

from agentic_rl.chat import ChatRenderer
from agentic_rl.engine.base import Generation, sampled_versions
from agentic_rl.engine.turns import read_turn
from agentic_rl.parser import (
    LLAMA3_JSON,
    MISTRAL,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    ToolCall,
    call_markers,
    find_tool_calls,
    is_mistral_call_id,
    mistral_call_id,
    tool_call_format,
)
from agentic_rl.parser.llama3 import answer_start
from agentic_rl.server.capture import CapturedTurn, TrajectoryRecorder
from agentic_rl.server.prepare import PreparedCall
from agentic_rl.server.protocol import ChatCompletionRequest, CompletionRequest
from agentic_rl.server.tokens import TokenTexts

__all__ = ["ResponseBuilder", "finite_logprobs", "record_call", "token_usage"]

# OpenAI's stand-in for a log-probability of minus infinity (JSON has no infinities).
_NEG_INF_LOGPROB = -9999.0


class ResponseBuilder:
    """Builds the parts of responses of one model.

    Args:
        renderer: the model's chat renderer (decoding, the end-of-turn token).
        token_texts: the text and bytes of single tokens, for logprobs.
        model_name: the `model` every response names.
    """

    def __init__(self, renderer: ChatRenderer, token_texts: TokenTexts, *, model_name: str) -> None:
        self.renderer = renderer
        self.token_texts = token_texts
        self.model_name = model_name
        self.call_format = tool_call_format(renderer.tokenizer.chat_template)

    def response(self, call: PreparedCall, generations: list[Generation]) -> dict[str, Any]:
        """The body of a whole (not streamed) response with one choice per generation, in order."""
        choices = []
        for i, gen in enumerate(generations):
            text = self.final_text(gen.token_ids, gen.finish_reason, gen.stop_reason)
            choice: dict[str, Any] = {"index": i}
            if call.chat:
                message, finish = self.message(call, text, gen.finish_reason)
                choice.update(
                    message=message,
                    finish_reason=finish,
                    logprobs=self.chat_logprobs(call, gen.token_ids, gen.logprobs, gen.top_logprobs),
                )
            else:
                choice.update(
                    text=text,
                    finish_reason=gen.finish_reason,
                    logprobs=self.completion_logprobs(call, gen.token_ids, gen.logprobs, gen.top_logprobs),
                )
            choice.update(token_ids=gen.token_ids, sampled_logprobs=finite_logprobs(gen.logprobs))
            choices.append(choice)
        return {
            "id": call.id,
            "object": "chat.completion" if call.chat else "text_completion",
            "created": call.created,
            "model": self.model_name,
            "choices": choices,
            "usage": token_usage(call, [g.token_ids for g in generations]),
            "prompt_token_ids": call.prompt_ids,
        }

    # ---- text -----------------------------------------------------------------------------------------------

    def final_text(self, ids: list[int], finish_reason: str, stop_reason: Any) -> str:
        """The text a client sees: without the stop token that ended the call, and cut before a stop string."""
        return read_turn(Generation(ids, [0.0] * len(ids), finish_reason, stop_reason), self.renderer).content

    def visible_text(self, call: PreparedCall, ids: list[int]) -> str:
        """The part of a running choice's text that no later token can change in the final text."""
        text = self.renderer.decode(ids).rstrip("\ufffd")  # an incomplete UTF-8 character
        stops = call.request.stop_strings
        if stops:
            text = text[: max(0, len(text) - (max(len(s) for s in stops) - 1))]
        if call.chat and call.constraint.parse_tools:
            at = _call_start(text, self.call_format, streaming=True)
            text = (text if at is None else text[:at]).rstrip()  # content before calls loses trailing whitespace
        return text

    def message(self, call: PreparedCall, text: str, finish_reason: str) -> tuple[dict[str, Any], str]:
        """The assistant message for `text`, and the finish reason (`tool_calls` when it calls tools).

        Calls are read as `parser.find_tool_calls` reads them in the chat template's format (JSON or Qwen3-Coder
        XML inside `<tool_call>`, `[TOOL_CALLS]`, Llama 3's JSON under its template; XML values typed by the
        request's tool schemas, none inside `<think>` reasoning); the content is the text before them. Under
        Mistral's format a call keeps the 9-character id the model wrote (one is derived when it wrote none), so the
        tool results the client sends back render with the ids the model saw.
        A turn cut by `max_tokens` keeps the calls it completed (each closed by `</tool_call>`) as `tool_calls`, with
        finish reason `tool_calls` (what OpenAI clients act on); the call it was writing when cut is left out, and
        so is its markup: a cut turn without a complete call answers with its text before the first `<tool_call>`
        (or before the start of one at its end) and finish reason `length`. The captured turn keeps the engine's
        finish reason (`length`).
        """
        fmt = self.call_format
        at = _call_start(text, fmt) if call.constraint.parse_tools and finish_reason in ("stop", "length") else None
        if at is None:
            return {"role": "assistant", "content": text}, finish_reason
        head = text[:at].rstrip()
        complete = _complete_calls(text, finish_reason)
        calls = [c for c in find_tool_calls(complete, call.tools, fmt)[1] if isinstance(c, ToolCall)]
        if not all(_encodable(c.name) for c in calls):
            calls = []
        if not calls:
            return {"role": "assistant", "content": head if finish_reason == "length" else text}, finish_reason
        tool_calls = [
            {"id": _call_id(c, fmt), "type": "function", "function": {"name": c.name, "arguments": _dumps(c.arguments)}}
            for c in calls
        ]
        return {"role": "assistant", "content": head or None, "tool_calls": tool_calls}, "tool_calls"

    # ---- logprobs -------------------------------------------------------------------------------------------

    def chat_logprobs(
        self, call: PreparedCall, ids: list[int], logprobs: list[float], tops: list[dict[int, float]] | None
    ) -> dict[str, Any] | None:
        """A chat choice's `logprobs` (`{"content": [...], "refusal": None}`), or None if the request asks none."""
        request = call.request
        assert isinstance(request, ChatCompletionRequest)
        if not request.logprobs:
            return None
        k = request.top_logprobs or 0
        content = []
        for pos, (token_id, lp) in enumerate(zip(ids, logprobs, strict=True)):
            ranked = sorted((tops[pos] if tops else {}).items(), key=lambda kv: -kv[1])[:k]
            content.append(
                {
                    **self.token_texts.entry(token_id),
                    "logprob": _finite_one(lp),
                    "top_logprobs": [{**self.token_texts.entry(t), "logprob": _finite_one(v)} for t, v in ranked],
                }
            )
        return {"content": content, "refusal": None}

    def completion_logprobs(
        self,
        call: PreparedCall,
        ids: list[int],
        logprobs: list[float],
        tops: list[dict[int, float]] | None,
        offset: int = 0,
    ) -> dict[str, Any] | None:
        """A completion choice's `logprobs` (tokens, token_logprobs, top_logprobs, text_offset from `offset`
        characters), or None if the request asks none."""
        request = call.request
        assert isinstance(request, CompletionRequest)
        if request.logprobs is None:
            return None
        tokens = [self.token_texts.entry(t)["token"] for t in ids]
        offsets = []
        for token in tokens:
            offsets.append(offset)
            offset += len(token)
        top_list = []
        for pos in range(len(ids)):
            ranked = sorted((tops[pos] if tops else {}).items(), key=lambda kv: -kv[1])[: request.logprobs]
            top = {self.token_texts.entry(t)["token"]: _finite_one(v) for t, v in ranked}
            top.setdefault(tokens[pos], _finite_one(logprobs[pos]))
            top_list.append(top)
        return {
            "tokens": tokens,
            "token_logprobs": finite_logprobs(logprobs),
            "top_logprobs": top_list,
            "text_offset": offsets,
        }


def token_usage(call: PreparedCall, ids: list[list[int]]) -> dict[str, int]:
    """OpenAI's `usage`: the prompt's tokens, and the completion tokens of every choice (`ids`, one list each)."""
    completion = sum(len(x) for x in ids)
    prompt = len(call.prompt_ids)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def record_call(
    recorder: TrajectoryRecorder, call: PreparedCall, gen: Generation, message: dict[str, Any] | None, text: str
) -> None:
    """Record a call tagged with a trajectory id as one turn of its trajectory.

    Args:
        recorder: where the trajectory is captured.
        call: the call (its `trajectory_id` is set).
        gen: the first choice's whole generation.
        message: the assistant message a chat call answered with (None for a completion).
        text: the choice's final text (a whole chat response records `""`, a streamed one its final text).
    """
    assert call.trajectory_id is not None
    recorder.record(
        call.trajectory_id,
        CapturedTurn(
            call.prompt_ids,
            gen.token_ids,
            gen.logprobs,
            call.continued,
            gen.finish_reason,
            messages=call.messages,
            response_message=message,
            tools=call.tools,
            text=text,
            template_kwargs=call.template_kwargs,
            streamed=call.request.stream,
            weight_version=call.weight_version,
            weight_versions=sampled_versions(gen, call.weight_version),
        ),
    )


def _call_start(text: str, call_format: str, *, streaming: bool = False) -> int | None:
    """Where the tool calls of `text` start: its first call outside `<think>` reasoning (`parser.find_tool_calls` in
    `call_format`), or a start of `<tool_call>` at its very end; None if neither. `streaming` (the text so far of a
    running turn): a start of any of the format's call markers at its end too, and under `LLAMA3_JSON` the start of
    an answer that is empty so far or opens with `{`, which may yet be a bare JSON call."""
    at = find_tool_calls(text, None, call_format)[0] if _may_call(text, call_format) else -1
    if at >= 0:
        return at
    if streaming and call_format == LLAMA3_JSON:
        body = answer_start(text)
        if body >= 0 and (body == len(text) or text.startswith("{", body)):
            return body
    for marker in call_markers(call_format) if streaming else (TOOL_CALL_OPEN,):  # a whole turn: as ever
        for k in range(min(len(marker) - 1, len(text)), 0, -1):
            if marker.startswith(text[-k:]):
                return len(text) - k
    return None


def _may_call(text: str, call_format: str) -> bool:
    """Whether `text` can hold a call at all (a marker, or under `LLAMA3_JSON` a `{`): most answers skip the read."""
    return any(m in text for m in call_markers(call_format)) or (call_format == LLAMA3_JSON and "{" in text)


def _call_id(call: ToolCall, call_format: str) -> str:
    """The id a returned call carries: OpenAI's `call_...` shape; under `MISTRAL` the model's own 9-character id
    (one derived at random when it wrote none or another shape), which its template requires of tool results."""
    if call_format != MISTRAL:
        return f"call_{uuid.uuid4().hex[:24]}"
    return call.id if is_mistral_call_id(call.id) else mistral_call_id(uuid.uuid4().hex)


def _complete_calls(text: str, finish_reason: str) -> str:
    """The part of a turn's text that holds only whole calls: all of it, or up to the last `</tool_call>` of a turn
    cut by `max_tokens` (the call being written when the turn was cut is incomplete)."""
    if finish_reason != "length":
        return text
    end = text.rfind(TOOL_CALL_CLOSE)
    return text[: end + len(TOOL_CALL_CLOSE)] if end >= 0 else ""


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _dumps(arguments: Any) -> str:
    """Tool-call arguments as a JSON string; a lone surrogate the model wrote stays an escape (`\\udc80`)."""
    text = json.dumps(arguments, ensure_ascii=False)
    return text if _encodable(text) else json.dumps(arguments)


def _finite_one(value: float) -> float:
    return value if math.isfinite(value) else _NEG_INF_LOGPROB


def finite_logprobs(values: list[float]) -> list[float]:
    """Logprobs fit for JSON: minus infinity (or NaN) becomes OpenAI's -9999.0."""
    return [_finite_one(v) for v in values]
