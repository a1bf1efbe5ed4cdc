"""Hooks that edit activations in place, with autograd on, at every hook point of Sprout and the
walkthrough GPT: the same logits and gradients as the same edit made out of place. And the hooked
attention path (scores and pattern materialised) against scaled_dot_product_attention: both as close
to a float64 run as each other."""
import copy

import pytest
import torch

from sprout import Sprout
from sprout.walkthrough import build_step
from tests.conftest import TINY, randomize_gains

FLAGS = {"split": "set_use_split_qkv_input", "attn_in": "set_use_attn_in"}


def sprout_model():
    torch.manual_seed(0)
    return randomize_gains(Sprout(TINY).eval())


def walkthrough_model():
    torch.manual_seed(0)
    model = build_step("4.10").eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and name.startswith(("blocks", "ln_final")):
                p.add_(0.3 * torch.randn_like(p))
    return model


def scale_in_place(act, hook):
    act.mul_(0.9)  # returns None: the edited tensor flows on


def scale_out_of_place(act, hook):
    return act * 0.9


def run_and_grad(model, tokens, name, hook):
    model.zero_grad(set_to_none=True)
    logits = model.run_with_hooks(tokens, fwd_hooks=[(name, hook)])
    logits.float().square().mean().backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def hook_names(model, flag):
    """Every hook point that fires with this flag set (the input hooks each fire under one flag)."""
    skip = {"split": ("hook_attn_in",), "attn_in": ("hook_q_input", "hook_k_input", "hook_v_input")}[flag]
    return [n for n in model.hook_dict if not n.endswith(skip)]


@pytest.mark.parametrize("build", [sprout_model, walkthrough_model], ids=["sprout", "walkthrough"])
@pytest.mark.parametrize("flag", ["split", "attn_in"])
def test_in_place_edits_at_every_hook_point_with_grad(build, flag):
    model = build()
    getattr(model, FLAGS[flag])(True)
    model.set_use_hook_mlp_in(True)
    vocab = model.cfg.d_vocab
    tokens = torch.randint(0, vocab, (2, 8), generator=torch.Generator().manual_seed(1))
    names = hook_names(model, flag)
    assert len(names) > 20
    for name in names:
        logits, grads = run_and_grad(model, tokens, name, scale_in_place)
        want_logits, want_grads = run_and_grad(model, tokens, name, scale_out_of_place)
        torch.testing.assert_close(logits, want_logits, atol=1e-6, rtol=0, msg=name)
        assert grads.keys() == want_grads.keys(), name
        for n in grads:
            torch.testing.assert_close(grads[n], want_grads[n], atol=1e-6, rtol=1e-5, msg=f"{name}: {n}")


def test_in_place_edits_without_flags_and_on_a_single_token():
    model = sprout_model()  # the fused q/k/v path (flags off), and a batch of one token: views everywhere
    for tokens in (torch.tensor([[5]]), torch.tensor([[5, 9, 11]])):
        for name in ("blocks.0.attn.hook_q", "blocks.1.attn.hook_v", "blocks.0.attn.hook_z", "blocks.1.ln2.hook_scale"):
            logits, grads = run_and_grad(model, tokens, name, scale_in_place)
            want_logits, want_grads = run_and_grad(model, tokens, name, scale_out_of_place)
            torch.testing.assert_close(logits, want_logits, atol=1e-6, rtol=0)
            for n in grads:
                torch.testing.assert_close(grads[n], want_grads[n], atol=1e-6, rtol=1e-5)


# --- the hooked attention path against scaled_dot_product_attention ------------------------------------

def identity(act, hook):
    return act


@pytest.mark.parametrize("build", [sprout_model, walkthrough_model], ids=["sprout", "walkthrough"])
def test_hooked_pattern_path_is_as_accurate_as_sdpa(build):
    """An identity hook on hook_pattern switches every layer to the materialised path (scores, softmax,
    pattern @ v). That path and scaled_dot_product_attention round differently in float32, so the
    logits move; the claim tested is that both are equally close to a float64 run of the same model
    (the hooked path's error at most twice SDPA's), and that the move is float32 rounding of the
    logits' size (under 1e-5 of the largest logit)."""
    model = build()
    tokens = torch.randint(0, model.cfg.d_vocab, (4, model.cfg.n_ctx), generator=torch.Generator().manual_seed(2))
    every_pattern = [(lambda n: n.endswith("hook_pattern"), identity)]
    with torch.no_grad():
        sdpa = model(tokens)
        hooked = model.run_with_hooks(tokens, fwd_hooks=every_pattern)
        exact = copy.deepcopy(model).double().run_with_hooks(tokens, fwd_hooks=every_pattern).float()
    sdpa_error, hooked_error = (sdpa - exact).abs().max(), (hooked - exact).abs().max()
    assert hooked_error <= 2 * sdpa_error + 1e-7
    assert (hooked - sdpa).abs().max() <= 1e-5 * sdpa.abs().max()


def test_hooks_that_edit_nothing_leave_sprouts_logits_and_gradients_as_unhooked():
    """Sprout's norms and attention give the unhooked forward's numbers bit for bit when hooks only read:
    a full `run_with_cache`, an identity hook on every norm's scale and normalized output, backward hooks
    on the scales. (The walkthrough's LayerNorm is F.layer_norm's own kernel unhooked: not bit for bit.)"""
    model = sprout_model()
    tokens = torch.randint(0, model.cfg.d_vocab, (3, model.cfg.n_ctx), generator=torch.Generator().manual_seed(4))
    norms = lambda n: n.endswith(("hook_scale", "hook_normalized"))  # noqa: E731
    with torch.no_grad():
        plain = model(tokens)
        assert torch.equal(model.run_with_cache(tokens)[0], plain)
        assert torch.equal(model.run_with_hooks(tokens, fwd_hooks=[(norms, identity)]), plain)
        assert not torch.equal(model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.ln1.hook_scale", scale_out_of_place)]),
                               plain)

    def embed_grad(bwd_hooks):
        model.zero_grad()
        for name, hook in bwd_hooks:
            model.add_hook(name, hook, dir="bwd")
        model(tokens).logsumexp(-1).sum().backward()
        model.reset_hooks()
        return model.embed.weight.grad.clone()

    seen = set()
    plain_grad = embed_grad([])
    hooked_grad = embed_grad([(lambda n: n.endswith("hook_scale"), lambda g, hook: seen.add(hook.name))])
    assert len(seen) == 2 * model.cfg.n_layers + 1  # every norm's scale is still in the graph
    torch.testing.assert_close(hooked_grad, plain_grad, rtol=1e-5, atol=1e-6)
