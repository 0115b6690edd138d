"""The shared-prefix and length-bucketed forwards: the same logprobs and gradients as the full forward, for fewer
token passes."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentic_rl.train.buckets import length_buckets
from agentic_rl.train.loss import response_logprobs
from agentic_rl.train.packing import pack_trajectories
from agentic_rl.train.shared_prefix import MIN_SHARED_PREFIX, shared_prefix_length
from agentic_rl.types import Trajectory

PAD = 2


@pytest.fixture(scope="module")
def tiny():
    from transformers import AutoModelForCausalLM

    from agentic_rl.models import resolve_model

    return AutoModelForCausalLM.from_pretrained(str(resolve_model("tiny-random-smollm2")), dtype=torch.float32)


def _ids(seed: int, n: int) -> list[int]:
    return torch.randint(100, 4000, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _trajectory(prompt: list[int], response: list[int], mask: list[int], idx: int) -> Trajectory:
    logprobs = [-0.5] * len(response)
    return Trajectory(prompt_tokens=prompt, response_tokens=response, response_masks=mask,
                      response_logprobs=logprobs, idx=idx, trajectory_reward=float(idx % 2))  # fmt: skip


def _rows(shared: int) -> list[Trajectory]:
    """Four rows opening with the same `shared` tokens, then prompts and responses of different lengths (one row's
    prompt is the shared part and a single token more)."""
    system = _ids(0, shared)
    tails = [_ids(1, 9), _ids(2, 1), _ids(3, 23), _ids(4, 5)]
    responses = [_ids(10 + i, n) for i, n in enumerate((7, 12, 3, 9))]
    masks = [[1, 1, 0, 0, 1, 1, 1], [1] * 12, [1, 1, 1], [1, 0, 1, 0, 1, 0, 1, 1, 1]]
    return [_trajectory(system + t, r, m, i) for i, (t, r, m) in enumerate(zip(tails, responses, masks, strict=True))]


def _logprobs_and_grads(model, batch, share: bool):
    model.zero_grad()
    logprobs = response_logprobs(model, batch, share_prefix=share)
    (logprobs * batch.response_mask).sum().backward()
    return logprobs.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("shared", [MIN_SHARED_PREFIX, 80])
def test_the_shared_prefix_forward_gives_the_full_forwards_logprobs_and_gradients(tiny, shared):
    model = copy.deepcopy(tiny).train()
    batch = pack_trajectories(_rows(shared), pad_token_id=PAD)
    assert shared_prefix_length(batch.input_ids, batch.attention_mask, batch.prompt_width) == shared
    full, full_grads = _logprobs_and_grads(model, batch, share=False)
    kept, kept_grads = _logprobs_and_grads(model, batch, share=True)
    on = batch.response_mask.bool()
    torch.testing.assert_close(kept[on], full[on], rtol=0, atol=1e-5)
    for a, b in zip(kept_grads, full_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    trimmed = batch.select(torch.tensor([0, 2]), trim=True)  # a micro-batch: its rows share the same prefix
    with torch.no_grad():
        part = response_logprobs(model, trimmed)
    r = trimmed.responses.shape[1]
    torch.testing.assert_close(part[trimmed.response_mask.bool()], full[[0, 2], :r][trimmed.response_mask.bool()],
                               rtol=0, atol=1e-5)  # fmt: skip


def test_rows_that_part_early_take_the_plain_forward(tiny):
    rows = _rows(40)
    rows[1] = _trajectory([7, *rows[1].prompt_tokens[1:]], rows[1].response_tokens, rows[1].response_masks, 1)
    batch = pack_trajectories(rows, pad_token_id=PAD)
    assert shared_prefix_length(batch.input_ids, batch.attention_mask, batch.prompt_width) == 0
    with torch.no_grad():
        a = response_logprobs(tiny.eval(), batch, share_prefix=True)
        b = response_logprobs(tiny.eval(), batch, share_prefix=False)
    assert torch.equal(a, b)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=8), min_size=1, max_size=5))
def test_shared_prefix_length_is_the_common_opening_less_one_token_of_the_shortest_prompt(prompts):
    width = max(map(len, prompts))
    ids = torch.tensor([[PAD] * (width - len(p)) + p + [5] for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * (len(p) + 1) for p in prompts])
    common = 0
    while all(len(p) > common + 1 for p in prompts) and len({p[common] for p in prompts}) == 1:
        common += 1
    expected = common if len(prompts) > 1 else 0
    assert shared_prefix_length(ids, mask, width) == expected


def test_length_buckets_give_the_full_forwards_logprobs_and_gradients(tiny):
    """Rows of very different lengths run as separate passes (with and without the shared prefix): same result."""
    system = _ids(0, 40)
    lengths = [(3, 4), (150, 90), (5, 2), (140, 100), (1, 6)]  # (prompt tail, response) tokens
    rows = [_trajectory(system + _ids(20 + i, a), _ids(30 + i, b), [1, 0] * (b // 2) + [1] * (b % 2), i)
            for i, (a, b) in enumerate(lengths)]  # fmt: skip
    batch = pack_trajectories(rows, pad_token_id=PAD)
    assert len(length_buckets(batch.attention_mask, batch.prompt_width)) >= 2
    model = copy.deepcopy(tiny).train()

    def run(share: bool, bucket: bool):
        model.zero_grad()
        logprobs = response_logprobs(model, batch, share_prefix=share, bucket=bucket)
        assert logprobs.shape == batch.responses.shape
        (logprobs * batch.response_mask).sum().backward()
        return logprobs.detach(), [p.grad.clone() for p in model.parameters()]

    full, full_grads = run(share=False, bucket=False)
    on = batch.response_mask.bool()
    for share in (False, True):
        got, grads = run(share=share, bucket=True)
        torch.testing.assert_close(got[on], full[on], rtol=0, atol=1e-5)
        for a, b in zip(grads, full_grads, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def _cost(prompts, responses, group, skip, overhead):
    return len(group) * (max(prompts[i] for i in group) + max(responses[i] for i in group) - skip) + overhead


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 60), st.integers(0, 60)), min_size=1, max_size=7),
       st.sampled_from([0, 8, 64]))  # fmt: skip
def test_length_buckets_cover_every_row_once_at_the_least_cost_of_any_split_of_the_length_order(rows, overhead):
    prompts = [p for p, _ in rows]
    responses = [r for _, r in rows]
    width = max(prompts)
    mask = torch.tensor([[0] * (width - p) + [1] * p + [1] * r + [0] * (max(responses) - r) for p, r in rows])
    skip = min(prompts) - 1
    groups = [g.tolist() for g in length_buckets(mask, width, skip=skip, overhead=overhead)]
    assert sorted(i for g in groups for i in g) == list(range(len(rows)))
    got = sum(_cost(prompts, responses, g, skip, overhead) for g in groups)
    order = sorted(range(len(rows)), key=lambda i: (prompts[i] + responses[i], i))
    cheapest = min(
        sum(_cost(prompts, responses, order[a:b], skip, overhead) for a, b in itertools.pairwise((0, *cuts, len(rows))))
        for n in range(len(rows)) for cuts in itertools.combinations(range(1, len(rows)), n)
    )  # fmt: skip
    assert got == cheapest
    assert got <= _cost(prompts, responses, list(range(len(rows))), skip, overhead)


def test_a_sliding_window_model_gets_each_rows_own_logprobs():
    """Sliding-window layers neither crop nor see the prefix across pad columns: such a model runs rows whole."""
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    config = MistralConfig(vocab_size=4096, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=32, sliding_window=48,
                           max_position_embeddings=1024)  # fmt: skip
    model = MistralForCausalLM(config).eval()
    system = _ids(0, 40)
    lengths = [(3, 4), (150, 90), (5, 2), (140, 100), (1, 6)]
    rows = [_trajectory(system + _ids(20 + i, a), _ids(30 + i, b), [1] * b, i) for i, (a, b) in enumerate(lengths)]
    batch = pack_trajectories(rows, pad_token_id=PAD)
    with torch.no_grad():
        got = response_logprobs(model, batch)
        for i in range(len(rows)):  # each row alone: no padding, no prefix sharing, no grouping
            one = batch.select(torch.tensor([i]), trim=True)
            alone = response_logprobs(model, one, share_prefix=False, bucket=False)[0]
            width = one.responses.shape[1]
            on = one.response_mask[0].bool()
            torch.testing.assert_close(got[i, :width][on], alone[on], rtol=0, atol=1e-5)
