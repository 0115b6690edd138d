"""Assistant text -> ordered tool calls, in the tool-call formats of the model families people train; and calls
written back in each format.

| format (`call_format`) | families | a call as the model writes it | module |
|---|---|---|---|
| `HERMES` | Hermes, Qwen2.5, Qwen3 | `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` | `hermes` |
| `QWEN3_CODER` | Qwen3-Coder, Qwen3.5 | `<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nvalue\\n</parameter>...` | `qwen3_coder` |
| `LLAMA3_JSON` | Llama 3.1 / 3.2 / 3.3 | `{"name": ..., "parameters": {...}}` as the whole message, or after `<|python_tag|>` | `llama3` |
| `MISTRAL` | Mistral Nemo, Small | `[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": "abcDEF123"}]` | `mistral` |

`tool_call_format(chat_template)` names the format a template teaches. Reading (`find_tool_calls`,
`parse_tool_calls`, `action_text`) takes it as `call_format`: `<tool_call>` blocks (JSON or XML, whatever the
template) and `[TOOL_CALLS]` (a special token of its own) are always read; Llama 3's calls only under
`LLAMA3_JSON`, since without their marker a JSON final answer would otherwise become a call. Under `LLAMA3_JSON` a
message is a call only when, after any leading reasoning and whitespace, it is entirely one or more JSON objects
(separated by `;` and/or whitespace) each with a string `"name"` and a `"parameters"` (or `"arguments"`) key; JSON
without those keys, or text before or after the JSON, is a final answer. After `<|python_tag|>` the model meant a
call: anything malformed there is a `ToolCallError`. Writing (`format_tool_call`, `format_tool_calls`) gives the
text that reading takes back as the same calls, in the layout the family's template renders.

Reasoning is not acted on: a call inside `<think>...</think>`, or inside a `<think>` left open at the end of a cut
turn, is a sketch, not a call. A `</think>` with no `<think>` before it ends reasoning that began before the text (a
template that opens `<think>` in the generation prompt): everything before it is reasoning.

Pure functions: no engine, no I/O. Malformed calls are returned as `ToolCallError` items so the environment can answer
them with error text; nothing here raises on model output (JSON the decoder refuses, nested more than
`MAX_JSON_DEPTH` levels deep or holding an integer too long to convert, is a `ToolCallError` too). A call whose
arguments are not a JSON object (a string that is not one, a list, a number) stays a `ToolCall` holding what the model
wrote, with the reason in `arguments_error`: the environment answers with what the tool expected, the server returns
the call (as vLLM does). Nesting is bounded before decoding (`json_nesting_exceeds`), and every marker is searched
for once over the text, so reading is linear in the text whatever it holds.
"""

from __future__ import annotations

from agentic_rl.parser.calls import (
    HERMES,
    LLAMA3_JSON,
    MISTRAL,
    MISTRAL_CALLS,
    PYTHON_TAG,
    QWEN3_CODER,
    THINK_CLOSE,
    THINK_OPEN,
    TOOL_CALL_CLOSE,
    TOOL_CALL_FORMATS,
    TOOL_CALL_OPEN,
    ParsedToolCall,
    ToolCall,
    ToolCallError,
    to_call,
)
from agentic_rl.parser.json_text import MAX_JSON_DEPTH, json_nesting_exceeds
from agentic_rl.parser.mistral import is_mistral_call_id, mistral_call_id
from agentic_rl.parser.reading import (
    action_text,
    call_markers,
    find_tool_calls,
    parse_tool_calls,
    split_thought,
    strip_thoughts,
)
from agentic_rl.parser.writing import format_tool_call, format_tool_calls, tool_call_format

__all__ = [
    "HERMES",
    "LLAMA3_JSON",
    "MAX_JSON_DEPTH",
    "MISTRAL",
    "MISTRAL_CALLS",
    "PYTHON_TAG",
    "QWEN3_CODER",
    "THINK_CLOSE",
    "THINK_OPEN",
    "TOOL_CALL_CLOSE",
    "TOOL_CALL_FORMATS",
    "TOOL_CALL_OPEN",
    "action_text",
    "call_markers",
    "find_tool_calls",
    "format_tool_call",
    "format_tool_calls",
    "is_mistral_call_id",
    "mistral_call_id",
    "ParsedToolCall",
    "ToolCall",
    "ToolCallError",
    "json_nesting_exceeds",
    "parse_tool_calls",
    "split_thought",
    "strip_thoughts",
    "to_call",
    "tool_call_format",
]
