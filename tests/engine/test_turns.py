"""`read_turn` on hand-built generations: the cases a real engine rarely or never produces on this CPU."""

from __future__ import annotations

import pytest

from agentic_rl.chat import ChatRenderer
from agentic_rl.engine.base import Generation
from agentic_rl.engine.turns import ABORTED, COMPLETE, CUT, TurnEnd, read_turn


@pytest.fixture(scope="module")
def renderer(tokenizer):
    return ChatRenderer(tokenizer)


def _gen(ids, finish, stop_reason=None):
    return Generation(token_ids=list(ids), logprobs=[-0.1] * len(ids), finish_reason=finish, stop_reason=stop_reason)


def test_a_multi_token_stop_string_leaves_out_every_token_that_holds_it(renderer):
    head = renderer.encode("<tool_call>\n{}\n")
    ids = head + renderer.encode("</tool_call>")
    assert len(ids) - len(head) > 1
    assert read_turn(_gen(ids, "stop", "</tool_call>"), renderer) == TurnEnd(COMPLETE, "<tool_call>\n{}\n", len(head))


def test_the_first_match_that_ends_in_the_last_token_is_the_stop(renderer):
    ids = renderer.encode("a. b. c.")  # with min_tokens, vLLM skips earlier matches: only the last one stopped it
    end = read_turn(_gen(ids, "stop", "."), renderer)
    assert end.content == "a. b. c" and renderer.decode(ids[: end.kept]) + renderer.decode(end.tail_ids) == "a. b. c"


def test_a_stop_string_missing_from_the_text_keeps_the_whole_text(renderer, caplog):
    ids = renderer.encode("no match here")
    assert read_turn(_gen(ids, "stop", "zzz"), renderer) == TurnEnd(COMPLETE, "no match here", len(ids))
    assert "not found" in caplog.text


def test_an_end_of_sequence_stop_other_than_end_of_turn_is_left_out(renderer, tokenizer):
    ids = [*renderer.encode("Hi"), tokenizer.convert_tokens_to_ids("<|endoftext|>")]
    assert read_turn(_gen(ids, "stop"), renderer) == TurnEnd(COMPLETE, "Hi", len(ids) - 1, closed=False)
    ids[-1] = renderer.end_of_turn_id
    assert read_turn(_gen(ids, "stop"), renderer) == TurnEnd(COMPLETE, "Hi", len(ids), closed=True)


def test_an_empty_stopped_generation_is_an_empty_complete_turn(renderer):
    assert read_turn(_gen([], "stop"), renderer) == TurnEnd(COMPLETE, "", 0)


@pytest.mark.parametrize(("finish", "kind"), [("length", CUT), ("repetition", CUT), ("abort", ABORTED),
                                               ("error", ABORTED), ("unknown", ABORTED)])  # fmt: skip
def test_turns_that_did_not_stop_keep_every_id_and_say_why(renderer, finish, kind):
    ids = [*renderer.encode("cut off"), renderer.end_of_turn_id]
    end = read_turn(_gen(ids, finish), renderer)
    assert end == TurnEnd(kind, renderer.decode(ids), len(ids))
