"""Exact token bookkeeping and the template re-render check, on SmolLM2's ChatML and Qwen2.5's tools template."""

from __future__ import annotations

import pytest

from agentic_rl.chat import ChatRenderer, Segment, check_alignment
from agentic_rl.errors import TemplateError

TOOLS = [{"type": "function", "function": {"name": "calculator", "description": "math",
          "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}}]  # fmt: skip


def _conversation(renderer: ChatRenderer, answer_ids: list[int], call_ids: list[int], tools=None):
    """Build messages and segments the way the harness does: sampled ids kept, glue from the renderer."""
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+3?"}]
    prompt = renderer.prompt_ids(messages, tools)
    eot = renderer.end_of_turn_id
    segments = [Segment(tuple(prompt), False), Segment(tuple(call_ids + [eot]), True)]
    messages.append({"role": "assistant", "content": renderer.decode(call_ids)})
    observation = [{"role": "tool", "content": "5"}]
    segments.append(Segment(tuple(renderer.observation_ids(observation, tools)), False))
    messages.extend(observation)
    segments.append(Segment(tuple(answer_ids + [eot]), True))
    messages.append({"role": "assistant", "content": renderer.decode(answer_ids)})
    return messages, segments


@pytest.mark.parametrize("template", ["chatml", "qwen25"])
def test_recorded_ids_match_a_full_template_render(template, tokenizer, qwen_tokenizer):
    tok = tokenizer if template == "chatml" else qwen_tokenizer
    renderer = ChatRenderer(tok)
    tools = TOOLS if renderer.supports_tools else None
    call = tok.encode('<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+3"}}\n</tool_call>',
                      add_special_tokens=False)  # fmt: skip
    messages, segments = _conversation(renderer, tok.encode("The answer is 5.", add_special_tokens=False), call, tools)

    report = check_alignment(renderer, messages, segments, tools)
    assert report.mismatches == 0, report.detail
    assert report.retokenize_drift == 0
    full = [i for s in segments for i in s.token_ids]
    rendered = tok.encode(renderer.render(messages, tools), add_special_tokens=False)
    assert rendered[: len(full)] == full  # with drift-free text the ids equal the tokenized render
    assert rendered[len(full) :] == tok.encode(renderer.after_end_of_turn, add_special_tokens=False)


def test_qwen25_tool_turn_is_a_user_turn_with_tool_response(qwen_tokenizer):
    renderer = ChatRenderer(qwen_tokenizer)
    assert renderer.supports_tools
    glue = qwen_tokenizer.decode(
        renderer.observation_ids([{"role": "tool", "content": "5"}, {"role": "tool", "content": "7"}], TOOLS)
    )
    assert glue == (
        "\n<|im_start|>user\n<tool_response>\n5\n</tool_response>\n<tool_response>\n7\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_chatml_glue_starts_with_the_newline_after_end_of_turn(tokenizer):
    renderer = ChatRenderer(tokenizer)
    assert renderer.end_of_turn_text == "<|im_end|>"
    assert renderer.after_end_of_turn == "\n"
    ids = renderer.observation_ids([{"role": "tool", "content": "42"}])
    assert tokenizer.decode(ids) == "\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"
    assert renderer.closing_ids() == tokenizer.encode("<|im_end|>\n", add_special_tokens=False)


def test_sampled_ids_that_re_encode_differently_count_as_drift_not_mismatch(tokenizer):
    renderer = ChatRenderer(tokenizer)
    newline = tokenizer.convert_tokens_to_ids("Ċ")
    double_newline = tokenizer.convert_tokens_to_ids("ĊĊ")
    assert tokenizer.encode("\n\n", add_special_tokens=False) == [double_newline]  # SmolLM2 merges two newlines
    answer = tokenizer.encode("Five", add_special_tokens=False) + [newline, newline]  # sampled before <|im_end|>
    call = tokenizer.encode("Let me think.", add_special_tokens=False)
    messages, segments = _conversation(renderer, answer, call)

    report = check_alignment(renderer, messages, segments)
    assert report.mismatches == 0, report.detail
    assert report.retokenize_drift == 1
    # Rebuilding from text would have changed the sampled ids:
    assert tokenizer.encode(renderer.decode(answer), add_special_tokens=False) != answer


def test_wrong_glue_ids_are_counted_as_mismatches(tokenizer):
    renderer = ChatRenderer(tokenizer)
    call = tokenizer.encode("Hmm.", add_special_tokens=False)
    messages, segments = _conversation(renderer, tokenizer.encode("5", add_special_tokens=False), call)
    broken = list(segments)
    glue = list(broken[2].token_ids)
    broken[2] = Segment(tuple(glue[1:]), False)  # drop the newline after <|im_end|>, as a naive loop would
    report = check_alignment(renderer, messages, broken)
    assert report.mismatches > 0
    assert report.detail


def test_render_of_an_unclosed_final_turn_is_accepted_only_with_its_closing(tokenizer):
    renderer = ChatRenderer(tokenizer)
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]
    prompt = renderer.prompt_ids(messages)
    cut = tokenizer.encode("The answer", add_special_tokens=False)
    messages.append({"role": "assistant", "content": renderer.decode(cut)})
    report = check_alignment(renderer, messages, [Segment(tuple(prompt), False), Segment(tuple(cut), True)])
    assert report.mismatches == 0, report.detail


def test_template_without_chat_template_is_rejected(tokenizer):
    import copy

    tok = copy.deepcopy(tokenizer)
    tok.chat_template = None
    with pytest.raises(TemplateError, match="no chat template"):
        ChatRenderer(tok)


def test_template_that_rewrites_history_is_rejected(tokenizer):
    import copy

    tok = copy.deepcopy(tokenizer)
    # Renders only the last message: adding an observation changes what came before.
    tok.chat_template = (
        "{{ '<|im_start|>' + messages[-1]['role'] + '\\n' + messages[-1]['content'] + '<|im_end|>\\n' }}"
    )
    renderer = ChatRenderer(tok)
    with pytest.raises(TemplateError, match="rewrites earlier turns"):
        renderer.observation_ids([{"role": "tool", "content": "1"}])


def test_fast_path_encodes_and_decodes_like_the_tokenizer(tokenizer):
    renderer = ChatRenderer(tokenizer)
    assert renderer._backend is not None  # SmolLM2 ships a fast tokenizer: the Rust path is the one exercised
    texts = ["", " 12 + 7 = 19\n\n", "<|im_start|>tool\n42<|im_end|>\n", "naïve café 数学 🙂", "  two  spaces\tand tab"]
    for text in texts:
        ids = renderer.encode(text)
        assert ids == tokenizer.encode(text, add_special_tokens=False)
        expected = tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        assert renderer.decode(ids) == expected


def test_observation_ids_do_not_depend_on_which_tools_came_first(qwen_tokenizer):
    renderer = ChatRenderer(qwen_tokenizer)
    other = [{"type": "function", "function": {"name": "search", "description": "web",
              "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}}]  # fmt: skip
    observation = [{"role": "tool", "content": "5"}]
    with_calc = renderer.observation_ids(observation, TOOLS)
    with_search = renderer.observation_ids(observation, other)
    # the cached stand-in render is per tool set: each call must equal a fresh renderer's answer
    assert with_calc == ChatRenderer(qwen_tokenizer).observation_ids(observation, TOOLS)
    assert with_search == ChatRenderer(qwen_tokenizer).observation_ids(observation, other)
    assert renderer.observation_ids(observation, TOOLS) == with_calc
