"""`VLLMEngine.stream`: the sampled tokens as the engine steps, and an early close that aborts the request."""

from __future__ import annotations

import anyio
import pytest

from agentic_rl.engine.base import StreamingEngine
from agentic_rl.errors import EngineError


def _prompt(tokenizer, text="Count from one to five."):
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(rendered, add_special_tokens=False)


async def test_stream_yields_each_step_and_the_last_item_carries_the_finish(engine, tokenizer):
    assert isinstance(engine, StreamingEngine)
    items = [d async for d in engine.stream(_prompt(tokenizer), {"max_tokens": 8, "min_tokens": 8, "logprobs": 2})]
    assert len(items) > 1  # one item per engine step, not the whole generation at the end
    assert [d.finish_reason for d in items[:-1]] == [""] * (len(items) - 1) and items[-1].finish_reason == "length"
    ids = [t for d in items for t in d.token_ids]
    assert len(ids) == 8 == sum(len(d.logprobs) for d in items)
    assert all(lp <= 0.0 for d in items for lp in d.logprobs)
    tops = [top for d in items for top in d.top_logprobs]
    assert len(tops) == 8 and all(token in top for token, top in zip(ids, tops, strict=True))


async def test_closing_a_stream_early_aborts_its_request(engine, tokenizer):
    stream = engine.stream(_prompt(tokenizer), {"max_tokens": 1500, "min_tokens": 1500})
    first = await stream.__anext__()
    assert first.token_ids and engine.in_flight_requests == 1
    await stream.aclose()
    with anyio.fail_after(60):
        while engine.in_flight_requests:
            await anyio.sleep(0.02)
    after = await engine.generate(_prompt(tokenizer), {"max_tokens": 2})  # the engine keeps serving
    assert len(after.token_ids) <= 2


async def test_a_rejected_stream_raises_before_any_item(engine):
    with pytest.raises(EngineError, match="rejected"):
        async for _ in engine.stream([10**9], {"max_tokens": 2}):
            pass
