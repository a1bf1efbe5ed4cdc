"""Freezing that survives autograd: a hook that returns a value-equal tensor (a stored copy, or
`act.detach()`, TransformerLens' and circuit-tracer's stop-gradient idiom) replaces the activation for
the values and for the gradients, at every hook point of Sprout and of the walkthrough GPT.

The frozen function is f(eps) = <logits(theta + eps u), w> with the hooked activation held at its
value for eps = 0; its autograd slope at 0 must equal its central finite difference (float64), and a
hook returning `act.detach()` must give the same autograd slope as one returning the stored copy."""
import copy

import pytest
import torch

from sprout import Sprout
from sprout.walkthrough import build_step
from tests.conftest import TINY, randomize_gains


def sprout_model():
    torch.manual_seed(0)
    return randomize_gains(Sprout(TINY).eval()).double()


def walkthrough_model():
    torch.manual_seed(0)
    model = build_step("4.10").eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and name.startswith(("blocks", "ln_final")):
                p.add_(0.3 * torch.randn_like(p))
    return model.double()


def _setup(build):
    model = build()
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, model.cfg.d_vocab, (2, 7), generator=g)
    params = [p for p in model.parameters()]
    u = [torch.randn(p.shape, generator=g, dtype=p.dtype) for p in params]
    norm = sum(d.square().sum() for d in u).sqrt()
    u = [d / norm for d in u]
    w = torch.randn(2, 7, model.cfg.d_vocab, generator=g, dtype=torch.float64)
    return model, tokens, params, u, w


def _objective(model, tokens, w, hooks):
    return (model.run_with_hooks(tokens, fwd_hooks=hooks) * w).sum()


def _shifted(model, params, u, eps):
    """A copy of model with theta + eps u."""
    other = copy.deepcopy(model)
    with torch.no_grad():
        for p, d in zip(other.parameters(), u):
            p.add_(eps * d)
    return other


def _autograd_slope(model, tokens, params, u, w, hooks):
    model.zero_grad(set_to_none=True)
    out = _objective(model, tokens, w, hooks)
    if not out.requires_grad:  # the logits themselves frozen
        return 0.0
    out.backward()
    return sum((p.grad * d).sum() for p, d in zip(params, u) if p.grad is not None).item()


@pytest.mark.parametrize("build", [sprout_model, walkthrough_model], ids=["sprout", "walkthrough"])
@pytest.mark.parametrize("flags", [False, True], ids=["plain", "input-hooks"])
def test_value_equal_freezing_hooks_at_every_hook_point_stop_the_gradient(build, flags):
    model, tokens, params, u, w = _setup(build)
    if flags:  # each head's own q/k/v input and the MLP's input copy are hook points too
        model.set_use_split_qkv_input(True)
        model.set_use_hook_mlp_in(True)
    # every kind of hook point: all of block 0's and those outside the blocks
    names = [n for n in model.hook_dict if not n.endswith("hook_attn_in") and (flags or not n.endswith(("_input", "hook_mlp_in")))
             and not (n.startswith("blocks.") and not n.startswith("blocks.0."))]
    assert len(names) > 15
    h = 1e-5
    up, down = _shifted(model, params, u, h), _shifted(model, params, u, -h)
    live = _autograd_slope(model, tokens, params, u, w, [])
    moved = 0
    for name in names:
        _, cache = model.run_with_cache(tokens, names_filter=name)
        stored = cache[name]
        frozen = [(name, lambda act, hook, s=stored: s.clone())]
        detached = [(name, lambda act, hook: act.detach())]
        fd = (_objective(up, tokens, w, frozen) - _objective(down, tokens, w, frozen)).item() / (2 * h)
        by_copy = _autograd_slope(model, tokens, params, u, w, frozen)
        by_detach = _autograd_slope(model, tokens, params, u, w, detached)
        scale = max(1.0, abs(fd))
        assert abs(by_copy - fd) <= 1e-6 * scale, (name, by_copy, fd)
        assert abs(by_detach - fd) <= 1e-6 * scale, (name, by_detach, fd)
        moved += abs(fd - live) > 1e-3 * scale
    # the test can fail: freezing changes the slope at nearly every point (not e.g. at a last hook_out, nor,
    # with split inputs, at ln1's hooks, whose output the heads do not read: they normalise their own copies)
    assert moved >= len(names) - (4 + 2 * flags)


def test_freezing_the_scales_and_patterns_of_a_prompt_makes_logits_linear_in_the_embeddings():
    """The issue's symptom: freeze every norm scale and attention pattern by returning stored copies,
    and hold the MLPs' outputs; the logits are then linear in the token embeddings, so their second difference along a direction is
    zero and the autograd slope is the finite-difference slope."""
    model = sprout_model()
    tokens = torch.randint(0, TINY.vocab_size, (1, 9), generator=torch.Generator().manual_seed(5))
    names = [n for n in model.hook_dict if n.endswith(("hook_scale", "hook_pattern", "hook_mlp_out"))]
    _, cache = model.run_with_cache(tokens, names_filter=names)
    embed = model.embed.weight[tokens].detach()
    d = torch.randn(embed.shape, generator=torch.Generator().manual_seed(6), dtype=torch.float64)

    def run(delta):
        hooks = [(n, lambda act, hook, s=cache[n]: s.clone()) for n in names]
        hooks.append(("hook_embed", lambda act, hook: act + delta))
        return model.run_with_hooks(tokens, fwd_hooks=hooks)[0, -1].sum()

    e = torch.zeros_like(embed, requires_grad=True)
    run(e).backward()
    slope = (e.grad * d).sum().item()
    with torch.no_grad():
        f0, fp, fm = run(0 * d).item(), run(d).item(), run(-d).item()
    assert abs((fp - fm) / 2 - slope) <= 1e-9 * max(1.0, abs(slope))
    assert abs(fp - 2 * f0 + fm) <= 1e-9 * max(1.0, abs(f0))
