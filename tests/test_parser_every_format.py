"""Properties over every tool-call format at once: reading any text never raises, whatever format it is read in,
and calls written in a format read back as the same calls in that format (pure functions)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentic_rl.parser import (
    HERMES,
    LLAMA3_JSON,
    MISTRAL,
    QWEN3_CODER,
    TOOL_CALL_FORMATS,
    ToolCall,
    ToolCallError,
    action_text,
    find_tool_calls,
    format_tool_calls,
    parse_tool_calls,
    tool_call_format,
)

TEMPLATES = Path(__file__).parent / "fixtures" / "templates"
EXPECTED_FORMATS = {
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": HERMES,
    "Qwen-QwQ-32B.jinja": HERMES,
    "Qwen-Qwen2.5-7B-Instruct.jinja": HERMES,
    "Qwen-Qwen3-0.6B.jinja": HERMES,
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja": HERMES,  # no tools: the tool system prompt's format
    "ibm-granite-granite-3.3-2B-Instruct.jinja": HERMES,
    "meta-llama-Llama-3.1-8B-Instruct.jinja": LLAMA3_JSON,
    "meta-llama-Llama-3.2-3B-Instruct.jinja": LLAMA3_JSON,
    "microsoft-Phi-3.5-mini-instruct.jinja": HERMES,
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": MISTRAL,
    "qwen3-coder-style.jinja": QWEN3_CODER,
    "qwen3.5-style.jinja": QWEN3_CODER,
}


def test_every_fixture_template_is_named_its_format():
    assert sorted(p.name for p in TEMPLATES.glob("*.jinja")) == sorted(EXPECTED_FORMATS)
    assert {name: tool_call_format((TEMPLATES / name).read_text()) for name in EXPECTED_FORMATS} == EXPECTED_FORMATS


def test_named_templates_and_no_template():
    assert tool_call_format(None) == HERMES and tool_call_format("") == HERMES
    llama = (TEMPLATES / "meta-llama-Llama-3.1-8B-Instruct.jinja").read_text()
    assert tool_call_format({"default": llama}) == LLAMA3_JSON
    assert tool_call_format({"default": "{{ '[TOOL_CALLS][' }}"}) == MISTRAL


_NAMES = st.text(alphabet=st.characters(blacklist_characters="<>\n\r", blacklist_categories=("Cs",)), min_size=1,
                 max_size=12).filter(lambda s: s.strip() == s)  # fmt: skip
_STRINGS = st.text(max_size=10).filter(lambda s: not any(t in s for t in ("</parameter>", "<parameter=", "</function>", "</tool_call>")))
_ARGUMENTS = st.dictionaries(
    st.text(alphabet=st.characters(blacklist_characters="<>\n\r", blacklist_categories=("Cs",)), min_size=1, max_size=8)
    .filter(lambda s: s.strip() == s),
    _STRINGS,
    max_size=4,
)  # fmt: skip


@settings(deadline=None, max_examples=300)
@given(st.sampled_from(TOOL_CALL_FORMATS), st.lists(st.tuples(_NAMES, _ARGUMENTS), min_size=1, max_size=3),
       st.booleans())  # fmt: skip
def test_written_calls_read_back_in_their_format(call_format, written, ascii_only):
    text = format_tool_calls(written, call_format, ensure_ascii=ascii_only)
    found = parse_tool_calls(text, call_format=call_format)
    assert all(isinstance(c, ToolCall) for c in found), found
    assert [(c.name, c.arguments) for c in found] == written
    assert action_text(text, call_format) == text.lstrip()


_FRAGMENTS = ["<tool_call>", "</tool_call>", "<function=", "</function>", "<parameter=", "</parameter>", "<think>",
              "</think>", "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "<|python_tag|>", ">", "<", "\n", " ", ";", "f", "{",
              "}", "[", "]", '"', ":", ",", "1", "null", '"name"', '"arguments"', '"parameters"', '{"name": "f"}',
              '{"name": "f", "parameters": {}}']  # fmt: skip


@pytest.mark.parametrize("call_format", [None, *TOOL_CALL_FORMATS])
@settings(deadline=None, max_examples=300)
@given(text=st.lists(st.sampled_from(_FRAGMENTS) | st.text(max_size=4), max_size=40).map("".join))
def test_reading_any_text_in_any_format_never_raises(call_format, text):
    start, found = find_tool_calls(text, None, call_format)
    assert (start >= 0) == bool(found)
    for call in found:
        if isinstance(call, ToolCall):
            assert call.name.strip() == call.name != ""
            assert isinstance(call.arguments, dict) != bool(call.arguments_error)
        else:
            assert isinstance(call, ToolCallError) and call.message
    assert action_text(text, call_format) == (text[start:] if start >= 0 else "")
