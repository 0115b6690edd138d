"""How one generation ends as an assistant turn: read from the engine's `finish_reason` and `stop_reason`.

The last sampled token alone cannot say it. A turn that stopped (on the template's end-of-turn token, on another
stop token id or end-of-sequence token, or on a stop string) is complete; a turn cut by `max_tokens` is not; an
aborted request is neither. A complete turn's content never holds what stopped it, and what is recorded of it is
what the chat template renders for that content, so the next prompt stays exactly the template's render:

- ended on the end-of-turn token (ChatML's `<|im_end|>`): every sampled id is kept; the end-of-turn token is the
  template's own, so the next turn's glue follows it directly.
- ended on another stop id or end-of-sequence token (e.g. `<|endoftext|>`): that id is not part of the turn. It is
  left out of the record (and so out of the loss); the template's end-of-turn token is inserted in its place with
  the next turn's glue.
- ended on a stop string: vLLM's ids run up to the token that completes it, while the content ends before it.
  The sampled ids whose text lies inside the content are kept; when the stop string began inside a token, the
  part of that token before it is inserted (re-encoded, mask 0) so that the record spells the content exactly.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agentic_rl.engine.base import Generation

if TYPE_CHECKING:
    from agentic_rl.chat import ChatRenderer

__all__ = ["TurnEnd", "read_turn"]

logger = logging.getLogger(__name__)

COMPLETE, CUT, ABORTED = "complete", "cut", "aborted"


@dataclass(frozen=True, slots=True)
class TurnEnd:
    """What one generation is as an assistant turn.

    Attributes:
        kind: `complete` (it stopped: finish_reason `stop`), `cut` (`length`, or `repetition`: the text is not
            finished and a half-written tool call must not run) or `aborted` (`abort`, `error` or anything else:
            the request did not end as a turn and must not be trained).
        content: the assistant message content: the decoded text without the stop token or stop string.
        kept: how many leading sampled ids belong to the turn (recorded with mask 1 and their logprobs).
        tail_ids: ids to insert right after the kept ones (mask 0) so that the record spells `content`: the text of
            a token in which a stop string began, before the stop string. Usually empty.
        closed: the last kept id is the template's end-of-turn token. A complete turn that is not closed needs the
            end-of-turn token inserted before whatever follows it.
    """

    kind: str
    content: str
    kept: int
    tail_ids: tuple[int, ...] = ()
    closed: bool = False


def read_turn(generation: Generation, renderer: ChatRenderer) -> TurnEnd:
    """Read `generation` as an assistant turn of `renderer`'s chat template (see the module docstring)."""
    ids = generation.token_ids
    finish = generation.finish_reason
    if finish == "stop":
        if isinstance(generation.stop_reason, str) and generation.stop_reason:
            return _stopped_on_string(ids, generation.stop_reason, renderer)
        if not ids:
            return TurnEnd(COMPLETE, "", 0)
        closed = ids[-1] == renderer.end_of_turn_id
        return TurnEnd(COMPLETE, renderer.decode(ids[:-1]), len(ids) if closed else len(ids) - 1, closed=closed)
    kind = CUT if finish in ("length", "repetition") else ABORTED
    return TurnEnd(kind, renderer.decode(ids), len(ids))


def _stopped_on_string(ids: list[int], stop: str, renderer: ChatRenderer) -> TurnEnd:
    text = renderer.decode(ids)
    head = renderer.decode(ids[:-1])
    # vLLM stops on the token that completes the stop string: its first match ends inside that last token.
    at = text.find(stop, max(len(head) - len(stop) + 1, 0)) if text.startswith(head) else -1
    if at < 0:
        at = text.find(stop)
    if at < 0:  # not in the text as decoded here (e.g. vLLM matched it across skipped special tokens)
        logger.warning("stop string %r not found in the sampled text; the whole text is kept as the content", stop)
        return TurnEnd(COMPLETE, text, len(ids))
    content = text[:at]
    kept = len(ids) - 1  # the last token holds (the end of) the stop string
    while kept > 0 and not content.startswith(renderer.decode(ids[:kept])):
        kept -= 1
    rest = content[len(renderer.decode(ids[:kept])) :]
    return TurnEnd(COMPLETE, content, kept, tuple(renderer.encode(rest)) if rest else ())
