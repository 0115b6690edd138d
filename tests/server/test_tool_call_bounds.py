"""How many tool calls a turn holds, and what a reply returns of a turn cut by `max_tokens`.

A constrained turn (`tool_choice` `required`, a named function, `parallel_tool_calls=false`, `allowed_tools`) holds at
most `max_tool_calls` calls and then only the end of the turn; a cut turn returns the calls it completed as
`tool_calls` and leaves out the one being written. The grammar checks compile the server's constraint with xgrammar
on the model's tokenizer; the engine checks assert what a reply must hold for any sample.
"""

from __future__ import annotations

import json

import httpx
import pytest
from support.server import MODEL_NAME

from agentic_rl.parser import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, ToolCall, parse_tool_calls

PING = {"type": "function", "function": {"name": "ping", "description": "Check the connection.",
        "parameters": {"type": "object", "properties": {}, "additionalProperties": False}}}  # fmt: skip
CALCULATOR = {"type": "function", "function": {"name": "calculator", "description": "Evaluate arithmetic.",
              "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                             "required": ["expression"]}}}  # fmt: skip
TOOLS = [PING, CALCULATOR]
ASK = [{"role": "user", "content": "Ping the server three times, then compute 2 + 2."}]
PING_CALL = '<tool_call>\n{"name": "ping", "arguments": {}}\n</tool_call>'
CALC_CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 + 2"}}\n</tool_call>'
# Two whole calls, then a call far longer than any max_tokens below: the turn is cut inside the third call.
TWO_CALLS_THEN_CUT = (
    r'<tool_call>\n\{"name": "calculator", "arguments": \{"expression": "2 \+ 2"\}\}\n</tool_call>\n'
    r'<tool_call>\n\{"name": "ping", "arguments": \{\}\}\n</tool_call>\n'
    r'<tool_call>\n\{"name": "calculator", "arguments": \{"expression": "(1 \+ ){300}1"\}\}\n</tool_call>'
)
TEXT_THEN_CUT = r'Let me see\. <tool_call>\n\{"name": "calculator", "arguments": \{"expression": "(1 \+ ){300}1"\}\}'
MOST = 3


# ---- the grammar ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def accepts(tokenizer):
    """`accepts(body, text)`: whether the server's constraint for a chat `body` lets a turn be `text`, then end."""
    import xgrammar

    from agentic_rl.server.constraints import output_constraint
    from agentic_rl.server.protocol import ChatCompletionRequest, parse_request

    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    compiler = xgrammar.GrammarCompiler(xgrammar.TokenizerInfo.from_huggingface(tokenizer, stop_token_ids=[end]))

    def check(body: dict, text: str) -> bool:
        request = parse_request(ChatCompletionRequest, {"messages": ASK, "tools": TOOLS, **body})
        tag = output_constraint(request, max_tool_calls=MOST).params.structural_tag
        matcher = xgrammar.GrammarMatcher(compiler.compile_structural_tag(tag))
        return matcher.accept_string(text) and matcher.accept_token(end)

    return check


def _calls(k: int) -> str:
    return "\n".join([CALC_CALL, *[PING_CALL] * (k - 1)][:k])


ALLOWED_AUTO = {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [
    {"type": "function", "function": {"name": "ping"}}, {"type": "function", "function": {"name": "calculator"}}]}}  # fmt: skip


@pytest.mark.parametrize(
    ("body", "most", "text_first"),
    [
        ({"tool_choice": "required"}, MOST, False),
        ({"tool_choice": "required", "parallel_tool_calls": False}, 1, False),
        ({"tool_choice": {"type": "function", "function": {"name": "ping"}}}, 1, False),
        ({"parallel_tool_calls": False}, 1, True),
        ({"tool_choice": ALLOWED_AUTO}, MOST, True),
        ({"response_format": {"type": "json_object"}}, MOST, False),
    ],
    ids=["required", "required_one", "named", "auto_one", "allowed_auto", "auto_json"],
)
def test_a_constrained_turn_holds_at_most_its_calls_and_then_ends(accepts, body, most, text_first):
    named = "tool_choice" in body and isinstance(body["tool_choice"], dict) and body["tool_choice"]["type"] == "function"
    call = (lambda k: "\n".join([PING_CALL] * k)) if named else _calls
    for k in range(1, most + 1):
        assert accepts(body, call(k)), k
        if text_first:
            assert accepts(body, "Sure. " + call(k)), k
    assert not accepts(body, call(most + 1))  # one call too many
    assert not accepts(body, call(most) + "\nDone.")  # nothing after the calls but the end of the turn
    assert not accepts(body, call(1) + "\n")


def test_max_tool_calls_sets_the_bound_of_tool_choice_outputs():
    from agentic_rl.server.constraints import MAX_TOOL_CALLS, tool_choice_outputs

    def repeats(tag: str) -> list[int]:
        found: list[int] = []

        def walk(node):
            if isinstance(node, dict):
                if node.get("type") == "repeat":
                    found.append(node["max"])
                for value in node.values():
                    walk(value)
            elif isinstance(node, list):
                for value in node:
                    walk(value)

        walk(json.loads(tag))
        return found

    assert repeats(tool_choice_outputs(TOOLS).structural_tag) == [MAX_TOOL_CALLS - 1]
    assert repeats(tool_choice_outputs(TOOLS, max_tool_calls=2).structural_tag) == [1]
    assert repeats(tool_choice_outputs(TOOLS, parallel_tool_calls=False, max_tool_calls=5).structural_tag) == []
    with pytest.raises(ValueError, match="max_tool_calls"):
        tool_choice_outputs(TOOLS, max_tool_calls=0)


# ---- replies from the engine ------------------------------------------------------------------------------------


def _chat(base_url: str, body: dict) -> dict:
    r = httpx.post(f"{base_url}/v1/chat/completions", timeout=300,
                   json={"model": MODEL_NAME, "messages": ASK, "tools": TOOLS, **body})  # fmt: skip
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def _chat_streamed(base_url: str, body: dict) -> dict:
    """A streamed reply assembled as OpenAI clients do: content, tool calls by index, the finish reason, the ids."""
    content, calls, finish, ids = "", {}, None, []
    with httpx.stream("POST", f"{base_url}/v1/chat/completions", timeout=300, json={
            "model": MODEL_NAME, "messages": ASK, "tools": TOOLS, "stream": True, **body}) as r:  # fmt: skip
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            (choice,) = json.loads(line.removeprefix("data: "))["choices"]
            ids += choice.get("token_ids", [])
            delta = choice.get("delta", {})
            content += delta.get("content") or ""
            for part in delta.get("tool_calls") or []:
                call = calls.setdefault(part["index"], {"id": None, "type": "function",
                                                        "function": {"name": "", "arguments": ""}})  # fmt: skip
                call["id"] = part.get("id") or call["id"]
                call["function"]["name"] += part.get("function", {}).get("name") or ""
                call["function"]["arguments"] += part.get("function", {}).get("arguments") or ""
            finish = choice.get("finish_reason") or finish
    message = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return {"message": message, "finish_reason": finish, "token_ids": ids}


def _assert_reply_holds_the_complete_calls(choice: dict, tokenizer) -> list[ToolCall]:
    """The reply's tool calls are the calls the turn completed; no call markup is left in its content."""
    ids = choice["token_ids"]
    stopped = bool(ids) and ids[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")
    text = tokenizer.decode(ids[:-1] if stopped else ids)
    whole = text if stopped else text[: text.rfind(TOOL_CALL_CLOSE) + len(TOOL_CALL_CLOSE)] * (TOOL_CALL_CLOSE in text)
    expected = [c for c in parse_tool_calls(whole) if isinstance(c, ToolCall)]
    message = choice["message"]
    got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.get("tool_calls") or []]
    assert got == [(c.name, c.arguments) for c in expected]
    if expected:
        assert choice["finish_reason"] == "tool_calls"
        assert len({c["id"] for c in message["tool_calls"]}) == len(expected)
        assert all(c["id"].startswith("call_") for c in message["tool_calls"])
    elif not stopped:
        assert choice["finish_reason"] == "length"
    if not stopped:
        assert TOOL_CALL_OPEN not in (message["content"] or "")
        assert not (message["content"] or "").endswith("<")
    return expected


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_a_turn_cut_inside_a_call_returns_the_calls_it_completed(base_url, tokenizer, stream):
    body = {"max_tokens": 200, "temperature": 0.0, "structured_outputs": {"regex": TWO_CALLS_THEN_CUT}}
    choice = (_chat_streamed if stream else _chat)(base_url, body)
    assert len(choice["token_ids"]) == 200  # cut
    calls = _assert_reply_holds_the_complete_calls(choice, tokenizer)
    assert [c.name for c in calls] == ["calculator", "ping"]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_a_turn_cut_before_any_complete_call_keeps_only_its_text(base_url, tokenizer, stream):
    body = {"max_tokens": 24, "temperature": 0.0, "structured_outputs": {"regex": TEXT_THEN_CUT}}
    choice = (_chat_streamed if stream else _chat)(base_url, body)
    assert _assert_reply_holds_the_complete_calls(choice, tokenizer) == []
    assert choice["finish_reason"] == "length" and "tool_calls" not in choice["message"]
    assert "Let me see.".startswith(choice["message"]["content"] or "")


@pytest.mark.parametrize(
    "body",
    [
        {"tool_choice": "required"},
        {"tool_choice": "required", "parallel_tool_calls": False},
        {"tool_choice": {"type": "function", "function": {"name": "calculator"}}},
        {"parallel_tool_calls": False},
        {},
    ],
    ids=["required", "required_one", "named", "auto_one", "auto"],
)
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_every_reply_returns_the_complete_calls_within_the_bound(base_url, tokenizer, body, stream):
    from agentic_rl.server.constraints import MAX_TOOL_CALLS

    most = MAX_TOOL_CALLS if body.get("parallel_tool_calls", True) and "function" not in str(body) else 1
    constrained = bool(body)
    for seed, max_tokens in ((1, 24), (2, 400)):
        request = {**body, "temperature": 1.0, "seed": seed, "max_tokens": max_tokens}
        choice = (_chat_streamed if stream else _chat)(base_url, request)
        calls = _assert_reply_holds_the_complete_calls(choice, tokenizer)
        if constrained:
            text = tokenizer.decode(choice["token_ids"])
            assert text.count(TOOL_CALL_OPEN) <= most and len(calls) <= most
            if choice["token_ids"][-1] == tokenizer.convert_tokens_to_ids("<|im_end|>") and calls:
                assert text.removesuffix("<|im_end|>").endswith(TOOL_CALL_CLOSE)  # the turn ends after its calls
