"""Requests as OpenAI clients send them: nulls, real fields without effect, message forms, stop strings, logprob
tokens, prompt special tokens and template variables; and bad values, each a 400 naming the field, never a 500."""

from __future__ import annotations

import json
import re
import sys
import uuid

import httpx
import pytest
from support.exact import assert_captured_exactly
from support.server import MODEL_NAME

from agentic_rl.server.app import create_app
from agentic_rl.server.serving import OpenAIServing
from agentic_rl.server.thread import ServerThread

USER = [{"role": "user", "content": "Say hello."}]
CALL = {"id": "call_1", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "2 + 2"}'}}
TOOLS = [{"type": "function", "function": {"name": "calculator",
          "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}}]  # fmt: skip


def _post(base_url: str, path: str, body, **kw) -> httpx.Response:
    return httpx.post(f"{base_url}{path}", json=body, timeout=300, **kw)


def _ok(base_url: str, path: str, body: dict, **kw) -> dict:
    r = _post(base_url, path, {"model": MODEL_NAME, **body}, **kw)
    assert r.status_code == 200, r.text
    return r.json()


# ---- nulls and real OpenAI fields -------------------------------------------------------------------------------


def test_null_stands_for_the_default(base_url):
    nulls = dict.fromkeys(("n", "temperature", "top_p", "seed", "stop", "frequency_penalty", "presence_penalty",
                           "stream", "stream_options", "user", "logprobs", "min_tokens", "top_k"))  # fmt: skip
    chat = _ok(base_url, "/v1/chat/completions", {
        "messages": USER, **nulls, "max_tokens": None, "max_completion_tokens": None, "top_logprobs": None,
        "tools": None, "tool_choice": None, "response_format": None, "parallel_tool_calls": None})  # fmt: skip
    completion = _ok(base_url, "/v1/completions", {"prompt": "Hello,", **nulls, "max_tokens": None, "echo": None})
    for body in (chat, completion):
        (choice,) = body["choices"]  # n=1
        assert choice["logprobs"] is None and 1 <= body["usage"]["completion_tokens"] <= 128


def test_integers_are_numbers_and_a_trajectory_id_is_named_once(base_url):
    body = {"prompt": "Hello,", "max_tokens": 2, "temperature": 0, "top_p": 1, "presence_penalty": 0, "min_p": 0}
    assert _ok(base_url, "/v1/completions", body)["choices"]
    for headers, field, agree in (({"X-Trajectory-Id": "a"}, "a", True), ({"X-Trajectory-Id": "a"}, "b", False),
                                  ({"X-Trajectory-Id": ""}, None, False), ({"X-Trajectory-Id": "x" * 257}, None, False)):
        sent = {**body, "n": 1} if field is None else {**body, "trajectory_id": field}
        r = _post(base_url, "/v1/completions", sent, headers=headers)
        assert r.status_code == (200 if agree else 400), r.text[:300]
        if not agree:
            assert r.json()["error"]["param"] == "trajectory_id"


def test_openai_fields_that_do_not_change_the_output_are_accepted(base_url):
    ignored = {"user": "u-1", "metadata": {"run": "a"}, "store": False, "service_tier": "auto",
               "prompt_cache_key": "k", "prompt_cache_retention": "24h", "safety_identifier": "s"}  # fmt: skip
    _ok(base_url, "/v1/chat/completions", {"messages": USER, "max_tokens": 2, **ignored, "modalities": ["text"],
                                           "logit_bias": {}, "stream_options": {"include_usage": True}})  # fmt: skip
    _ok(base_url, "/v1/completions", {"prompt": "Hi", "max_tokens": 2, "user": "u", "echo": False, "best_of": 1,
                                      "suffix": None, "logit_bias": {}})  # fmt: skip


@pytest.mark.parametrize(
    ("path", "field", "value"),
    [
        ("/v1/chat/completions", "audio", {"voice": "alloy", "format": "wav"}),
        ("/v1/chat/completions", "modalities", ["text", "audio"]),
        ("/v1/chat/completions", "prediction", {"type": "content", "content": "x"}),
        ("/v1/chat/completions", "web_search_options", {}),
        ("/v1/chat/completions", "functions", [{"name": "f"}]),
        ("/v1/chat/completions", "function_call", "auto"),
        ("/v1/chat/completions", "reasoning_effort", "low"),
        ("/v1/chat/completions", "verbosity", "low"),
        ("/v1/chat/completions", "logit_bias", {"50": 10}),
        ("/v1/completions", "echo", True),
        ("/v1/completions", "best_of", 2),
        ("/v1/completions", "suffix", "end"),
        ("/v1/completions", "logit_bias", {"50": 10}),
    ],
)
def test_openai_fields_this_server_does_not_implement_are_400s(base_url, path, field, value):
    base = {"messages": USER} if "chat" in path else {"prompt": "Hi"}
    r = _post(base_url, path, {**base, field: value})
    assert r.status_code == 400 and r.json()["error"]["param"] == field
    assert "does not implement" in r.json()["error"]["message"]


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions", {"messages": USER, "max_token": 3}, "max_token"),
        ("/v1/completions", {"prompt": "x", "temprature": 0.5}, "temprature"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi", "contnet": "x"}]}, "messages.0.contnet"),
        ("/v1/chat/completions", {"messages": USER, "tools": [{"type": "function", "function": {
            "name": "f", "paramters": {}}}]}, "tools.0.function.paramters"),  # fmt: skip
        ("/v1/chat/completions", {"messages": USER, "stream_options": {"include_usages": True}},
         "stream_options.include_usages"),
        ("/v1/chat/completions", {"messages": USER, "chat_template_kwargs": {"tokenize": True}}, "chat_template_kwargs"),
    ],
)
def test_unknown_fields_are_400s_naming_them(base_url, path, body, param):
    r = _post(base_url, path, body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and param.split(".")[-1] in r.json()["error"]["message"]


# ---- message forms ----------------------------------------------------------------------------------------------


def _prompt_ids(base_url: str, messages: list, **extra) -> list[int]:
    return _ok(base_url, "/v1/chat/completions", {"messages": messages, "max_tokens": 1, **extra})["prompt_token_ids"]


def test_text_parts_and_developer_role_render_like_strings_and_system(base_url):
    as_string = _prompt_ids(base_url, [{"role": "system", "content": "Be brief.\nBe kind."}, *USER])
    as_parts = _prompt_ids(base_url, [
        {"role": "developer", "content": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}]},
        {"role": "user", "content": [{"type": "text", "text": "Say hello."}]}])  # fmt: skip
    assert as_parts == as_string


def test_empty_and_null_contents_are_accepted_where_openai_accepts_them(base_url):
    messages = [
        {"role": "user", "content": "What is 2 + 2?", "name": "alice"},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": ""},
        {"role": "assistant", "content": None, "tool_calls": [{**CALL, "id": "call_2"}], "refusal": None,
         "reasoning_content": None, "reasoning": None},  # verifiers sends `reasoning_content` on every message
        {"role": "tool", "tool_call_id": "call_2", "content": None},
        {"role": "user", "content": ""},
    ]
    _prompt_ids(base_url, messages, tools=TOOLS)


def test_an_assistant_message_echoed_as_the_openai_client_assembled_it_is_accepted(base_url):
    """`message.model_dump()` of a streamed completion carries output-only fields (`index`, `parsed`, ...)."""
    echoed = {"content": None, "refusal": None, "role": "assistant", "annotations": None, "audio": None,
              "function_call": None, "parsed": None, "tool_calls": [{"id": "call_1", "type": "function", "index": 0,
              "function": {"arguments": '{"expression": "2 + 2"}', "name": "calculator", "parsed_arguments": None}}]}  # fmt: skip
    plain = {"role": "assistant", "content": None, "tool_calls": [CALL]}
    tail = [{"role": "tool", "tool_call_id": "call_1", "content": "4"}]
    assert _prompt_ids(base_url, [*USER, echoed, *tail], tools=TOOLS) == _prompt_ids(base_url, [*USER, plain, *tail],
                                                                                      tools=TOOLS)  # fmt: skip


# ---- bad values -------------------------------------------------------------------------------------------------

_DEEP = b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
_SURROGATE = b'{"messages": [{"role": "user", "content": "a\\udc80b"}]}'


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        (b'{"prompt": "x", "max_tokens": ' + b"7" * 5000 + b"}", None),
        (b'{"messages": [{"role": "user", "content": "hi"}], "seed": -' + b"9" * 4400 + b"}", None),
        (_DEEP, None),
        (b'{"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {"name": "f",'
         b' "parameters": ' + b'{"a": ' * 200 + b"1" + b"}" * 200 + b"}}]}", "tools.0.function.parameters.a.a.a.a"),
        (_SURROGATE, "messages.0.content"),
        (b'{"messages": [{"role": "user", "content": "hi", "name": "\\ud800"}]}', "messages.0.name"),
        (b'{"prompt": "hi", "\\udfff": 1}', "\udfff"),
        (b'{"messages": [{"role": "assistant", "tool_calls": [{"function": "calculator"}]}]}',
         "messages.0.tool_calls.0.function"),
        (b'{"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]}]}',
         "messages.0.tool_calls.0.function.arguments"),
        (b'{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}',
         "messages.0.content"),
        (b'{"messages": [{"role": "function", "content": "x"}]}', "messages.0.role"),
        (b'{"messages": [{"role": "assistant", "content": "x", "reasoning_content": "hmm"}]}',
         "messages.0.reasoning_content"),
        (b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}', None),
        (b'{"messages": [{"role": "user", "content": "hi"}], "top_p": Infinity}', None),
        (b'{"messages": [{"role": "user", "content": "hi"}], "top_p": 1e999}', "top_p"),
        (b'{"prompt": "\xff\xfe"}', None),
        (b'{"messages": [{"role": "user", "content": "hi"}], "stop": ["a", 5]}', "stop"),
        (b'{"messages": [{"role": "user", "content": "hi"}], "trajectory_id": ""}', "trajectory_id"),
        (b'{"prompt": "hi", "stop_token_ids": [1000000000]}', "stop_token_ids"),
        # numbers are JSON numbers: no string or bool stands in for one (the OpenAI API rejects them too)
        (b'{"messages": [{"role": "user", "content": "hi"}], "temperature": "0.5"}', "temperature"),
        (b'{"prompt": "hi", "top_p": "1"}', "top_p"),
        (b'{"prompt": "hi", "presence_penalty": true}', "presence_penalty"),
        (b'{"prompt": "hi", "max_tokens": "4"}', "max_tokens"),
        (b'{"messages": [{"role": "user", "content": "hi"}], "logprobs": "true"}', "logprobs"),
    ],
)
def test_bad_values_are_400s_never_500s(base_url, raw, param):
    path = "/v1/chat/completions" if b'"messages"' in raw else "/v1/completions"
    r = httpx.post(f"{base_url}{path}", content=raw, headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 400, r.text[:300]
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    if param is not None:
        assert error["param"].startswith(param) if "." in param else error["param"] == param
    assert _ok(base_url, "/v1/completions", {"prompt": "Hi", "max_tokens": 1})["choices"]  # the server is fine


def test_a_lone_surrogate_the_model_writes_in_tool_arguments_stays_an_escape(base_url, serving):
    """The model writes `\\udc80` inside a JSON string: the arguments decode to a lone surrogate, which is not text."""
    regex = r'<tool_call>\n\{"name": "calculator", "arguments": \{"expression": "\\udc80"\}\}\n</tool_call>'
    tid = f"surrogate-{uuid.uuid4().hex}"
    headers = {"X-Trajectory-Id": tid}
    messages = [{"role": "user", "content": "Compute."}]
    for stream in (False, True):
        r = _post(base_url, "/v1/chat/completions", {"model": MODEL_NAME, "messages": messages, "tools": TOOLS,
                  "max_tokens": 48, "structured_outputs": {"regex": regex}, "stream": stream}, headers=headers)  # fmt: skip
        assert r.status_code == 200 and r.content.decode("utf-8")  # valid UTF-8 on the wire
        if stream:
            events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
            fragments = [d["tool_calls"][0]["function"]["arguments"] for e in events
                         for d in [e["choices"][0]["delta"]] if "tool_calls" in d]  # fmt: skip
            arguments = "".join(fragments)
        else:
            message = r.json()["choices"][0]["message"]
            arguments = message["tool_calls"][0]["function"]["arguments"]
        assert arguments == '{"expression": "\\udc80"}' and json.loads(arguments) == {"expression": "\udc80"}
    # The agent sends the call back with a result: the arguments string is plain ASCII, so it is accepted.
    messages += [message, {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": "error"}]
    _ok(base_url, "/v1/chat/completions", {"messages": messages, "tools": TOOLS, "max_tokens": 2}, headers=headers)
    record = httpx.get(f"{base_url}/v1/trajectories/{tid}")
    assert record.status_code == 200 and record.json()["metrics"]["steps"] == 3


# ---- stop strings, logprobs -------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_stop_strings_are_cut_from_the_text(base_url, tokenizer, path):
    base = {"prompt": "Once upon a time"} if "chat" not in path else {"messages": [
        {"role": "user", "content": "Tell me a story."}]}  # fmt: skip
    body = _ok(base_url, path, {**base, "max_tokens": 24, "temperature": 0.0, "stop": ["e", "zzz"]})
    choice = body["choices"][0]
    text = choice["text"] if "chat" not in path else choice["message"]["content"]
    full = tokenizer.decode(choice["token_ids"])
    assert "e" not in text
    if choice["finish_reason"] == "stop":
        assert text == full[: full.index("e")]


def _forced(base_url: str, path: str, text: str, **extra) -> dict:
    base = {"prompt": "Write:"} if "chat" not in path else {"messages": USER}
    return _ok(base_url, path, {**base, "max_tokens": 32, "structured_outputs": {"regex": re.escape(text)}, **extra})


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_logprobs_come_only_when_asked_and_name_tokens_by_text_and_bytes(base_url, path):
    text = "Café crème, 東京"
    assert _forced(base_url, path, text)["choices"][0]["logprobs"] is None
    choice = _forced(base_url, path, text, logprobs=3 if "chat" not in path else True,
                     **({"top_logprobs": 3} if "chat" in path else {}))["choices"][0]  # fmt: skip
    if "chat" in path:
        entries = choice["logprobs"]["content"]
        assert b"".join(bytes(e["bytes"]) for e in entries) == text.encode() + b"<|im_end|>"  # exact, to the byte
        assert all(bytes(e["bytes"]).decode("utf-8", "replace") == e["token"] for e in entries)
        assert all(len(e["top_logprobs"]) == 3 for e in entries)
        tokens = [e["token"] for e in entries]
    else:
        assert choice["text"] == text
        tokens = choice["logprobs"]["tokens"]
        offsets = choice["logprobs"]["text_offset"]
        assert offsets == [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
    assert "".join(tokens).startswith("Café crème, ") and not any("Ã" in t or "Ġ" in t for t in tokens)


# ---- prompt special tokens and template variables ---------------------------------------------------------------


@pytest.fixture(scope="module")
def bos_server(engine, model_dir):
    """A server whose tokenizer adds a BOS (`<|im_start|>`, id 1) to every encoded text, as Llama-style ones do."""
    from tokenizers.processors import TemplateProcessing
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    tokenizer.backend_tokenizer.post_processor = TemplateProcessing(
        single="<|im_start|> $A", pair="<|im_start|> $A $B", special_tokens=[("<|im_start|>", 1)])  # fmt: skip
    thread = ServerThread(create_app(OpenAIServing(engine, tokenizer, model_name=MODEL_NAME)))
    thread.start()
    yield f"http://{thread.address}"
    thread.stop()


def test_a_prompt_that_starts_with_the_bos_gets_no_second_one(bos_server):
    rendered = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    ids = _ok(bos_server, "/v1/completions", {"prompt": rendered, "max_tokens": 1})["prompt_token_ids"]
    assert ids[:2] == [1, 4093]
    plain = _ok(bos_server, "/v1/completions", {"prompt": "Hi there", "max_tokens": 1})["prompt_token_ids"]
    assert plain[0] == 1 and plain.count(1) == 1
    bare = _ok(bos_server, "/v1/completions", {"prompt": "Hi there", "max_tokens": 1, "add_special_tokens": False})
    assert bare["prompt_token_ids"] == plain[1:]


# A template with a variable, as Qwen3's `enable_thinking`: off, every assistant turn opens with an empty think block.
_NO_THINK = "{% if enable_thinking is defined and not enable_thinking %}{{ '<think>\n\n</think>\n\n' }}{% endif %}"
THINKING_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['role'] == 'assistant' %}" + _NO_THINK + "{% endif %}{{ message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}" + _NO_THINK + "{% endif %}"
)


@pytest.fixture(scope="module")
def thinking_tokenizer(model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    tokenizer.chat_template = THINKING_TEMPLATE
    return tokenizer


def test_chat_template_kwargs_reach_the_template_and_capture(engine, thinking_tokenizer):
    serving = OpenAIServing(engine, thinking_tokenizer, model_name=MODEL_NAME)
    thread = ServerThread(create_app(serving))
    thread.start()
    base_url = f"http://{thread.address}"
    try:
        no_think = {"enable_thinking": False}
        suffix = thinking_tokenizer.encode("<|im_start|>assistant\n<think>\n\n</think>\n\n", add_special_tokens=False)
        assert _prompt_ids(base_url, USER, chat_template_kwargs=no_think)[-len(suffix):] == suffix
        assert _prompt_ids(base_url, USER)[-len(suffix):] != suffix
        tid = f"kwargs-{uuid.uuid4().hex}"
        headers = {"X-Trajectory-Id": tid}
        messages = list(USER)
        for _ in range(2):
            body = _ok(base_url, "/v1/chat/completions", {"messages": messages, "max_tokens": 6,
                       "chat_template_kwargs": no_think}, headers=headers)  # fmt: skip
            messages += [body["choices"][0]["message"], {"role": "user", "content": "Again."}]
        record = httpx.get(f"{base_url}/v1/trajectories/{tid}").json()
        assert_captured_exactly(record, thinking_tokenizer, calls=2)
        _ok(base_url, "/v1/chat/completions", {"messages": messages, "max_tokens": 2}, headers=headers)
        assert len(serving.recorder.build(tid).runs) > 1  # other variables: a new run
    finally:
        thread.stop()


def test_the_rollout_renders_with_chat_template_kwargs_too(engine, thinking_tokenizer):
    from agentic_rl import ToolAgentEngineWrapper

    wrapper = ToolAgentEngineWrapper("thinking_off", thinking_tokenizer, engine=engine, serve=False,
                                     chat_template_kwargs={"enable_thinking": False})  # fmt: skip
    wrapper.initialize()
    text = wrapper.renderer.render(USER, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_a_deep_body_is_refused_unread_whatever_the_recursion_limit():
    """Libraries raise the process's recursion limit; past it the C decoder would overflow the thread's stack."""
    from agentic_rl.errors import RequestError
    from agentic_rl.server.json_body import MAX_JSON_DEPTH, parse_json

    before = sys.getrecursionlimit()
    sys.setrecursionlimit(1_000_000)
    try:
        with pytest.raises(RequestError, match=f"the request body nests deeper than {MAX_JSON_DEPTH} levels"):
            parse_json(_DEEP)
    finally:
        sys.setrecursionlimit(before)
    assert parse_json(b'{"a": ' + b"[" * (MAX_JSON_DEPTH - 1) + b"]" * (MAX_JSON_DEPTH - 1) + b"}")["a"]
