"""The optimizer both trainers build: fused AdamW on the CPU, the same updates as PyTorch's reference AdamW."""

from __future__ import annotations

import torch

from agentic_rl.train.optim import adamw, load_optimizer_state


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    model[0].bias.requires_grad_(False)  # frozen: the optimizer must leave it out
    return model


def test_adamw_is_fused_on_the_cpu_and_skips_frozen_parameters():
    model = _model(0)
    optimizer = adamw(model.parameters(), lr=1e-3, weight_decay=0.1)
    assert optimizer.param_groups[0]["fused"] is True
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert id(model[0].bias) not in held and len(held) == 3


def test_adamw_updates_match_the_reference_implementation():
    fused, reference = _model(1), _model(1)
    opt_fused = adamw(fused.parameters(), lr=1e-2, weight_decay=0.1)
    opt_reference = torch.optim.AdamW([p for p in reference.parameters() if p.requires_grad], lr=1e-2,
                                      weight_decay=0.1, foreach=False, fused=False)  # fmt: skip
    data = torch.randn(32, 6, generator=torch.Generator().manual_seed(2))
    for _ in range(5):
        for model, optimizer in ((fused, opt_fused), (reference, opt_reference)):
            optimizer.zero_grad()
            model(data).square().mean().backward()
            optimizer.step()
    for a, b in zip(fused.parameters(), reference.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)
    assert not torch.equal(fused[2].weight, _model(1)[2].weight)  # it did move


def test_a_state_saved_by_an_unfused_optimizer_resumes_fused_with_the_same_updates():
    data = torch.randn(16, 6, generator=torch.Generator().manual_seed(3))

    def steps(model, optimizer, n):
        for _ in range(n):
            optimizer.zero_grad()
            model(data).square().mean().backward()
            optimizer.step()

    old, reference = _model(4), _model(4)
    opt_old = torch.optim.AdamW([p for p in old.parameters() if p.requires_grad], lr=1e-2, fused=False)
    opt_reference = torch.optim.AdamW([p for p in reference.parameters() if p.requires_grad], lr=1e-2, fused=False)
    steps(old, opt_old, 2)
    steps(reference, opt_reference, 4)
    resumed = adamw(old.parameters(), lr=1e-2, weight_decay=0.01)
    load_optimizer_state(resumed, opt_old.state_dict())
    assert resumed.param_groups[0]["fused"] is True
    steps(old, resumed, 2)
    for a, b in zip(old.parameters(), reference.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)
