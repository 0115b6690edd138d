"""The check that a captured trajectory is one exact token sequence, shared by the capture and framework tests."""

from __future__ import annotations

from typing import Any

from agentic_rl.chat import ChatRenderer, Segment, check_alignment
from agentic_rl.server.capture import rendered_messages


def assert_captured_exactly(
    record: dict[str, Any],
    tokenizer: Any,
    *,
    calls: int,
) -> None:
    """Check a record of `GET /v1/trajectories/{id}` against its steps and a full re-render of the conversation.

    Each call's prompt must be the previous call's prompt and sampled ids plus inserted template glue; the record's
    token fields must join the steps with mask 1 on sampled ids only; and the whole sequence must be what the chat
    template writes for the final conversation (sampled text where the model wrote it, the template's own
    tokenization everywhere else).
    """
    steps = record["steps"]
    assert len(steps) == calls and record["metrics"]["steps"] == calls
    assert "runs" not in record, [s["info"] for s in steps]  # one exact run
    response: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    segments = [Segment(tuple(steps[0]["prompt_ids"]), sampled=False)]
    for i, step in enumerate(steps):
        assert len(step["response_ids"]) == len(step["response_logprobs"]) > 0
        if i:
            head = steps[i - 1]["prompt_ids"] + steps[i - 1]["response_ids"]
            assert step["prompt_ids"][: len(head)] == head, f"call {i} does not extend call {i - 1}"
            glue = step["prompt_ids"][len(head) :]
            assert glue
            response += glue
            mask += [0] * len(glue)
            logprobs += [0.0] * len(glue)
            segments.append(Segment(tuple(glue), sampled=False))
        response += step["response_ids"]
        mask += [1] * len(step["response_ids"])
        logprobs += step["response_logprobs"]
        segments.append(Segment(tuple(step["response_ids"]), sampled=True))
    assert record["prompt_ids"] == steps[0]["prompt_ids"]
    assert record["response_ids"] == response
    assert record["response_mask"] == mask
    assert record["response_logprobs"] == logprobs

    tools = steps[-1]["info"].get("tools")
    renderer = ChatRenderer(tokenizer, template_kwargs=steps[-1]["info"].get("chat_template_kwargs"))
    sampled_texts = [_sampled_text(step["response_ids"], renderer) for step in steps]
    conversation = []
    assistant_turn = 0
    for message in steps[-1]["chat_completions"][:-1]:
        if message["role"] == "assistant":  # the client's copy; the template gets the text the model wrote
            message = {"role": "assistant", "content": sampled_texts[assistant_turn]}
            assistant_turn += 1
        conversation.append(message)
    assert assistant_turn == calls - 1
    conversation.append({"role": "assistant", "content": sampled_texts[-1]})
    report = check_alignment(renderer, rendered_messages(conversation, tools, renderer), segments, tools)
    assert report.mismatches == 0, report.detail


def _sampled_text(ids: list[int], renderer: ChatRenderer) -> str:
    if ids and ids[-1] == renderer.end_of_turn_id:
        ids = ids[:-1]
    return renderer.decode(ids)
