"""Exact token bookkeeping across turns, and a check of it against a full chat-template render.

The prompt of turn k+1 is the prompt of turn k, plus the ids the engine sampled, plus the ids of what the
environment adds (observations and the template glue around them). Sampled text is never decoded and re-encoded:
that changes ids for many tokenizers (SmolLM2 re-encodes two sampled `Ċ` tokens as one `ĊĊ`).

- `renderer`: `ChatRenderer`, the template's text and ids turn by turn, checked at start-up against a scripted tool
  loop (`probe`);
- `special_text`: text that is not the template's own (contents, tool schemas) kept from becoming special tokens;
- `probe`: the scripted tool loop every template must follow, and what a template that fails it does instead;
- `alignment`: `check_alignment`, a trajectory's ids against a full re-render of its conversation.
"""

from agentic_rl.chat.alignment import AlignmentReport, check_alignment
from agentic_rl.chat.renderer import ChatRenderer, Segment

__all__ = ["AlignmentReport", "ChatRenderer", "Segment", "check_alignment"]
