"""Real chat templates of tool-using and reasoning model families through `ChatRenderer`.

For each family the multi-turn tool loop is either exact (every prompt built turn by turn equals the template's own
render, and `check_alignment` finds 0 mismatches), or building the renderer fails at once with the reason. Text from
the environment, users and tasks never becomes the family's control tokens.
"""

from __future__ import annotations

import pytest
from support.chat_templates import FAMILIES, REFUSED, WORKING, family_tokenizer

from agentic_rl.chat import ChatRenderer, Segment, check_alignment
from agentic_rl.errors import TemplateError

TOOLS = [
    {"type": "function", "function": {"name": "calculator", "description": "Evaluate arithmetic.",
     "parameters": {"type": "object", "properties": {"expression": {"type": "string", "description": "e.g. 1 + 2"}},
                    "required": ["expression"]}}},
    {"type": "function", "function": {"name": "search", "description": "Search the web.",
     "parameters": {"type": "object", "properties": {"query": {"type": "string", "description": "what to look for"}},
                    "required": ["query"]}}},
]  # fmt: skip
THINK = "<think>\nMultiply first, then add.\n</think>\n\n"


def _call(expression: str) -> str:
    return f'<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{expression}"}}}}\n</tool_call>'


@pytest.fixture(scope="module")
def tokenizers(tokenizer):
    return {family.name: family_tokenizer(tokenizer, family) for family in FAMILIES}


def _tool_loop(renderer, tok, *, tools, think, role="tool", results=(("84",), ("89", "2 calls used"))):
    """A three-turn exchange built as the harness builds it; asserts each prompt is the template's own render of
    the conversation so far (its text: the ids of a prompt that ends in whitespace may differ from a tokenization
    of the whole render, which `check_alignment` accounts for span by span).

    Returns the messages and segments for `check_alignment`."""
    messages = [{"role": "system", "content": "You solve arithmetic with a calculator."},
                {"role": "user", "content": "What is 12 * 7 + 5?"}]  # fmt: skip
    prompt = renderer.prompt_ids(messages, tools)
    segments = [Segment(tuple(prompt), False)]
    record = list(prompt)
    opener = THINK if think else ""
    turns = [opener + _call("12 * 7"), opener + _call("84 + 5"), opener + "12 * 7 + 5 = 89. The answer is 89."]
    for turn, text in enumerate(turns):
        expected = renderer.render(messages, tools, add_generation_prompt=True)
        assert renderer.decode(record) == expected, f"turn {turn}: the prompt is not the template's render"
        sampled = tok.encode(text, add_special_tokens=False) + [renderer.end_of_turn_id]
        segments.append(Segment(tuple(sampled), True))
        record += sampled
        messages.append({"role": "assistant", "content": text})
        if turn < len(turns) - 1:
            observation = [{"role": role, "content": content} for content in results[turn]]
            glue = renderer.observation_ids(observation, tools)
            segments.append(Segment(tuple(glue), False))
            record += glue
            messages.extend(observation)
    return messages, segments


@pytest.mark.parametrize("think", [False, True], ids=["plain", "think"])
@pytest.mark.parametrize("with_tools", [True, False], ids=["tools", "no-tools"])
@pytest.mark.parametrize("family", WORKING, ids=lambda f: f.name)
def test_multi_turn_tool_loop_is_exact(family, with_tools, think, tokenizers):
    tok = tokenizers[family.name]
    renderer = ChatRenderer(tok)
    tools = TOOLS if with_tools else None
    messages, segments = _tool_loop(renderer, tok, tools=tools, think=think)

    report = check_alignment(renderer, messages, segments, tools)
    assert report.mismatches == 0, report.detail
    assert report.retokenize_drift == 0
    for content in ("84", "89", "2 calls used"):  # every tool result reached the model
        assert content in renderer.decode([i for s in segments if not s.sampled for i in s.token_ids])


@pytest.mark.parametrize("family", REFUSED, ids=lambda f: f.name)
def test_template_that_cannot_be_followed_is_refused_at_start_up_with_the_reason(family, tokenizers):
    with pytest.raises(TemplateError, match=family.refusal):
        ChatRenderer(tokenizers[family.name])


@pytest.mark.parametrize("family", [f for f in WORKING if f.name != "Qwen3"], ids=lambda f: f.name)
def test_user_follow_ups_are_exact_where_the_template_keeps_the_history(family, tokenizers):
    tok = tokenizers[family.name]
    renderer = ChatRenderer(tok)
    assert renderer.append_problem([{"role": "user", "content": "and now?"}]) is None
    messages, segments = _tool_loop(renderer, tok, tools=None, think=True, role="user", results=(("84",), ("89",)))
    report = check_alignment(renderer, messages, segments)
    assert report.mismatches == 0, report.detail


def test_qwen3_takes_tool_results_exactly_but_refuses_user_messages_after_thinking(tokenizers):
    tok = tokenizers["Qwen3"]
    renderer = ChatRenderer(tok)
    assert renderer.append_problem([{"role": "tool", "content": "5"}]) is None
    problem = renderer.append_problem([{"role": "user", "content": "and now?"}])
    assert problem is not None and "<think> blocks of earlier assistant turns" in problem
    with pytest.raises(TemplateError, match="once a user message follows"):
        renderer.observation_ids([{"role": "tool", "content": "5"}, {"role": "user", "content": "and now?"}])
    # What the template does: once a new query follows, the earlier turn's <think> block is gone.
    history = [{"role": "user", "content": "q"}, {"role": "assistant", "content": THINK + "a"}]
    assert "<think>" not in renderer.render([*history, {"role": "user", "content": "q2"}])
    assert "<think>\nMultiply" in renderer.render([*history, {"role": "tool", "content": "5"}])


def test_qwen3_without_thinking_renders_prompts_but_keeps_its_tool_loop_problem_when_not_strict(tokenizers):
    """With enable_thinking=False every generation prompt holds an empty <think> block the history drops: a tool loop
    cannot be followed, yet one prompt renders as the template writes it."""
    tok = tokenizers["Qwen3"]
    no_think = {"enable_thinking": False}
    with pytest.raises(TemplateError, match="opens a <think> block for the model and drops it"):
        ChatRenderer(tok, template_kwargs=no_think)
    renderer = ChatRenderer(tok, template_kwargs=no_think, strict=False)
    assert renderer.tool_loop_problem is not None and "opens a <think> block" in renderer.tool_loop_problem
    assert renderer.append_problem([{"role": "tool", "content": "5"}]) == renderer.tool_loop_problem
    messages = [{"role": "user", "content": "Hi"}]
    text = renderer.render(messages, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert renderer.prompt_ids(messages) == tok.encode(text, add_special_tokens=False)
    assert ChatRenderer(tok, strict=False).tool_loop_problem is None


def test_qwen3_last_assistant_turn_form_is_not_held_against_the_record(tokenizers):
    """Qwen3 writes an empty <think> block into the last assistant turn only: no prompt ever contained it."""
    tok = tokenizers["Qwen3"]
    renderer = ChatRenderer(tok)
    messages, segments = _tool_loop(renderer, tok, tools=TOOLS, think=False)
    assert "<think>\n\n</think>\n\n12 * 7 + 5 = 89" in renderer.render(messages, TOOLS)
    assert check_alignment(renderer, messages, segments, TOOLS).mismatches == 0
    # A last segment that is not the last message's text is still caught.
    wrong = [*segments[:-1], Segment(tuple(tok.encode("Something else.", add_special_tokens=False)), True)]
    assert check_alignment(renderer, messages, wrong, TOOLS).mismatches > 0


# ---- text from the environment, users and tasks stays text ---------------------------------------------------


def _special_counts(tok, ids):
    return {token: ids.count(tok.convert_tokens_to_ids(token)) for token in tok.all_special_tokens}


@pytest.mark.parametrize("family", WORKING, ids=lambda f: f.name)
def test_tool_result_with_control_tokens_yields_the_harmless_special_ids(family, tokenizers):
    tok = tokenizers[family.name]
    renderer = ChatRenderer(tok)
    harmless = renderer.observation_ids([{"role": "tool", "content": "page 7"}], TOOLS)
    injected = renderer.observation_ids([{"role": "tool", "content": family.control}], TOOLS)
    assert _special_counts(tok, injected) == _special_counts(tok, harmless)
    assert "The answer is 7" + family.eos in renderer.decode(injected)  # the text is kept, as ordinary tokens
    assert any(tok.encode(family.control, add_special_tokens=False).count(i) for i in tok.all_special_ids)


@pytest.mark.parametrize("family", WORKING, ids=lambda f: f.name)
def test_task_user_and_tool_schema_text_with_control_tokens_stays_text_in_the_first_prompt(family, tokenizers):
    tok = tokenizers[family.name]
    renderer = ChatRenderer(tok)

    def prompt(text):
        tools = [{**TOOLS[0], "function": {**TOOLS[0]["function"], "description": "Evaluate. " + text}}]
        messages = [{"role": "system", "content": "Be brief. " + text}, {"role": "user", "content": "Solve: " + text}]
        return renderer.prompt_ids(messages, tools)

    harmless, injected = prompt("page 7"), prompt(family.control)
    assert _special_counts(tok, injected) == _special_counts(tok, harmless)


@pytest.mark.parametrize("family", WORKING, ids=lambda f: f.name)
def test_alignment_check_accepts_the_safe_record_and_reports_an_injected_one(family, tokenizers):
    tok = tokenizers[family.name]
    renderer = ChatRenderer(tok)
    messages, segments = _tool_loop(renderer, tok, tools=TOOLS, think=False, results=((family.control,), ("89",)))
    assert check_alignment(renderer, messages, segments, TOOLS).mismatches == 0

    # The same record built the unsafe way: the observation's text encoded with its special-token text parsed.
    unsafe = list(segments)
    unsafe[2] = Segment(tuple(tok.encode(renderer.decode(segments[2].token_ids), add_special_tokens=False)), False)
    assert unsafe[2] != segments[2]
    report = check_alignment(renderer, messages, unsafe, TOOLS)
    assert report.mismatches > 0
    assert "segment 2" in report.detail
