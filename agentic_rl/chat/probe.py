"""The scripted tool loop every chat template must follow token-exactly, and what a template that fails does instead.

Whether a template can be followed turn by turn is decided once, when a `ChatRenderer` is built: the loop below
(plain turns, then turns with `<think>` blocks) is run through the same steps as a trajectory, and the prompt built
for every turn must equal the template's own render of the conversation so far. A template that fails is named by
what it does (it rewrites earlier turns once later ones follow, drops tool messages, or opens a block in the
generation prompt that it leaves out of the history).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agentic_rl.errors import TemplateError

__all__ = ["PROBE_TOOLS", "TemplateProblem", "probe_problem"]

_PROBE_SYSTEM = "You are a helpful assistant."
_PROBE_USER = "What is (2 + 3) * 4?"
PROBE_TOOLS = (
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string", "description": "e.g. 2 + 3"}},
                "required": ["expression"],
            },
        },
    },
)
_PROBE_TURNS = (
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 + 3"}}\n</tool_call>',
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": "5 * 4"}}\n</tool_call>',
    "(2 + 3) * 4 = 20. The answer is 20.",
)
_PROBE_THINK = "<think>\nThe calculator gives exact results.\n</think>\n\n"
_PROBE_RESULTS = {"tool": (("5",), ("20", "calculator: 1 call left")), "user": (("5",), ("20",))}


@dataclass(frozen=True, slots=True)
class TemplateProblem:
    """Why a chat template cannot be followed turn by turn.

    Attributes:
        message: what the template does instead (for the error).
        rewrites_history: True when the template renders every message but writes earlier turns differently once
            later ones follow (drops `<think>` blocks, opens `<think>` in the generation prompt, re-spaces a turn):
            a trajectory then follows it as several exact runs, each prompted with the template's render of the
            whole conversation. False when it leaves messages out or fails to render them: nothing follows it.
        render_failed: the template raised while rendering the loop (e.g. a tool-use template given no tool
            schemas).
    """

    message: str
    rewrites_history: bool
    render_failed: bool = False


# `render(messages, tools, add_generation_prompt=...)` -> the template's text
Render = Callable[..., str]
# `glue(observation, tools)` -> the template's text after a closed assistant turn, with `observation` added
Glue = Callable[[Sequence[dict[str, Any]], Sequence[dict[str, Any]] | None], str]


def probe_problem(
    render: Render, glue: Glue, end_of_turn_text: str, role: str, tools: list[dict[str, Any]] | None, *, think: bool
) -> TemplateProblem | None:
    """Run the scripted tool loop with observations of `role`: None if the prompt built for every turn equals
    the template's render of the conversation so far, else what the template does instead.

    After a turn whose prompt differs, the loop goes on from the template's own render (as a new exact run
    would), so that a template that rewrites history and also drops a later message is still told apart from one
    that only rewrites it."""
    where = f"a multi-turn loop with {role} messages" + (" and tool schemas" if tools else "")
    head = f"the chat template cannot be followed token-exactly through {where}: "
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": _PROBE_SYSTEM},
        {"role": "user", "content": _PROBE_USER},
    ]
    results = _PROBE_RESULTS.get(role, _PROBE_RESULTS["user"])
    rewrite: TemplateProblem | None = None
    try:
        record = render(messages, tools, add_generation_prompt=True)
        no_generation_prompt = record == render(messages, tools)
        regions = [(0, "system"), (_common_prefix(render(messages, tools), record), "generation")]
        for turn, text in enumerate(_PROBE_TURNS):
            content = (_PROBE_THINK if think else "") + text
            regions.append((len(record), "assistant"))
            messages.append({"role": "assistant", "content": content})
            record += content + end_of_turn_text
            if turn == len(_PROBE_TURNS) - 1:
                return rewrite
            observation = [{"role": role, "content": result} for result in results[turn]]
            observed = glue(observation, tools)
            missing = [m["content"] for m in observation if m["content"] not in observed]
            if missing:
                what = f"it leaves {role} messages out of the render (no {missing[0]!r} in {observed!r})"
                return TemplateProblem(head + what, rewrites_history=False)
            regions.append((len(record), "observation"))
            record += observed
            messages.extend(observation)
            expected = render(messages, tools, add_generation_prompt=True)
            lost = [m["content"] for m in observation if m["content"] not in expected]
            if lost:
                what = f"it leaves {role} messages out of the render once the conversation is longer (no {lost[0]!r})"
                return TemplateProblem(head + what, rewrites_history=False)
            if expected != record and no_generation_prompt:
                what = (
                    "it adds no generation prompt (add_generation_prompt changes nothing), yet writes a header "
                    "before each assistant turn of the history: the model would have to write that header itself"
                )
                return TemplateProblem(head + what, rewrites_history=False)
            if expected != record:
                explained = _explain(record, expected, regions, role, think)
                rewrite = rewrite or TemplateProblem(head + explained, rewrites_history=True)
                record, regions = expected, [(0, "system")]  # a new run: the template's render from here on
            regions.append((_common_prefix(render(messages, tools), expected), "generation"))
    except TemplateError as exc:
        return TemplateProblem(head + str(exc), rewrites_history=False, render_failed=True)
    return rewrite


def _common_prefix(a: str, b: str) -> int:
    """The length of the longest common prefix of `a` and `b`."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _explain(record: str, expected: str, regions: list[tuple[int, str]], role: str, think: bool) -> str:
    """Say where a prompt built turn by turn first differs from the template's render of the same conversation."""
    at = _common_prefix(record, expected)
    regions = sorted(regions)
    kind, start = "observation", 0
    for region_start, region_kind in regions:
        if region_start <= at:
            start, kind = region_start, region_kind
    if kind == "system":
        what = f"it rewrites the first turns once a {role} message follows"
    elif kind == "generation":
        end = next((s for s, _ in regions if s > start), len(record))
        what = (
            f"its generation prompt {record[start:end]!r} is not how it writes that assistant turn once the turn is "
            f"in the history"
        )
        if "<think>" in record[start:end]:
            what += " (it opens a <think> block for the model and drops it from earlier turns)"
    elif kind == "assistant":
        what = (
            f"it drops or rewrites the <think> blocks of earlier assistant turns once a {role} message follows"
            if think
            else f"it rewrites the text of earlier assistant turns once a {role} message follows"
        )
    else:
        what = f"it writes a {role} message differently once a later turn follows"
    lo = max(0, at - 24)
    return f"{what}: the prompt had {record[lo : at + 24]!r}, the full render has {expected[lo : at + 24]!r}"
