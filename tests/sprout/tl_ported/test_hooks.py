"""TransformerLens' tests/integration/test_hooks.py and test_main_demo_pattern_hooks.py on a tiny Sprout
(TL runs solu-1l on "Hello World!"; these models have no tokenizer, so the prompt is 4 ids).

Differences, each architectural or Sprout's contract: the prepending test reads logits equal to `b_U`
when the last block's stream is zero, which holds here too (b_U is zero and the final norm of a zero
vector is zero); `blocks.0.hook_q_input` etc. also answer to TransformerLens 4's `attn.` names."""
from typing import Any

import einops
import pytest
import torch

PROMPT = torch.tensor([[3, 14, 15, 9]])
embed = lambda name: name == "hook_embed"  # noqa: E731


class Counter:
    def __init__(self):
        self.count = 0

    def inc(self, *args, **kwargs):
        self.count += 1


@pytest.fixture
def model(small):
    yield small
    small.remove_all_hook_fns(including_permanent=True)


def n_fwd(model, name="hook_embed"):
    return len(model.hook_dict[name].fwd_hooks)


def test_hook_attaches_normally(model):
    c = Counter()
    model.run_with_hooks(PROMPT, fwd_hooks=[(embed, c.inc)])
    assert all(len(hp.fwd_hooks) == 0 for hp in model.hook_dict.values())
    assert c.count == 1


def test_perma_hook_attaches_normally(model):
    c = Counter()
    model.add_perma_hook(embed, c.inc)
    assert n_fwd(model) == 1
    model.run_with_hooks(PROMPT, fwd_hooks=[])
    assert n_fwd(model) == 1 and c.count == 1


def test_hook_context_manager(model):
    c = Counter()
    with model.hooks(fwd_hooks=[(embed, c.inc)]):
        assert n_fwd(model) == 1
        model.forward(PROMPT)
    assert n_fwd(model) == 0 and c.count == 1


def test_nested_hook_context_manager(model):
    c = Counter()
    with model.hooks(fwd_hooks=[(embed, c.inc)]):
        model.forward(PROMPT)
        assert c.count == 1
        with model.hooks(fwd_hooks=[(embed, c.inc)]):
            assert n_fwd(model) == 2
            model.forward(PROMPT)
            assert c.count == 3  # 2 from outer, 1 from inner
        assert n_fwd(model) == 1
    assert n_fwd(model) == 0 and c.count == 3


def test_context_manager_run_with_cache(model):
    c = Counter()
    with model.hooks(fwd_hooks=[(embed, c.inc)]):
        model.run_with_cache(PROMPT)
        assert n_fwd(model) == 1
    assert n_fwd(model) == 0 and c.count == 1


def test_backward_hook_runs_successfully(model):
    c = Counter()

    def skip_grad(output_grad: torch.Tensor, hook: Any):
        c.inc()
        return (output_grad,)  # PyTorch's one-tuple, as TransformerLens accepts

    with model.hooks(bwd_hooks=[(embed, skip_grad)]):
        assert len(model.hook_dict["hook_embed"].bwd_hooks) == 1
        out = model(PROMPT)
        assert c.count == 0
        out.sum().backward()
        assert len(model.hook_dict["hook_embed"].bwd_hooks) == 1
    assert len(model.hook_dict["hook_embed"].bwd_hooks) == 0
    assert c.count == 1


@pytest.mark.parametrize("wrap", [lambda g: g, lambda g: (g,), lambda g: None], ids=["bare", "tuple", "none"])
def test_backward_hook_return_conventions(model, wrap):
    c, seen = Counter(), {}

    def hook(grad, hook):
        c.inc()
        seen["grad"] = grad.clone()
        return wrap(grad * 2)

    grads = {}
    with model.hooks(bwd_hooks=[("blocks.0.hook_resid_post", hook),
                                ("blocks.0.hook_resid_mid", lambda g, hook: grads.__setitem__("mid", g.clone()))]):
        model(PROMPT).sum().backward()
    assert c.count == 1
    # a returned gradient replaces it (doubled); None leaves it: resid_mid gets it through the skip path
    direct = grads["mid"]
    model.zero_grad(set_to_none=True)
    with model.hooks(bwd_hooks=[("blocks.0.hook_resid_mid", lambda g, hook: grads.__setitem__("ref", g.clone()))]):
        model(PROMPT).sum().backward()
    factor = 1 if wrap(torch.zeros(())) is None else 2
    torch.testing.assert_close(direct, grads["ref"] * factor)


def test_backward_hook_of_another_shape_is_refused(model):
    with model.hooks(bwd_hooks=[("blocks.0.hook_resid_post", lambda g, hook: (g[..., :1],))]):
        out = model(PROMPT)
        with pytest.raises(ValueError, match="blocks.0.hook_resid_post"):
            out.sum().backward()


def test_hook_context_manager_with_permanent_hook(model):
    c = Counter()
    model.add_perma_hook(embed, c.inc)
    with model.hooks(fwd_hooks=[(embed, c.inc)]):
        assert n_fwd(model) == 2
        model.forward(PROMPT)
    assert n_fwd(model) == 1 and c.count == 2


def test_nested_context_manager_with_failure(model):
    def fail_hook(z, hook):
        raise ValueError("fail")

    c = Counter()
    with model.hooks(fwd_hooks=[(embed, c.inc)]):
        with pytest.raises(ValueError):
            with model.hooks(fwd_hooks=[(embed, fail_hook)]):
                assert n_fwd(model) == 2
                model.forward(PROMPT)
        assert n_fwd(model) == 1 and c.count == 1
    assert n_fwd(model) == 0


def test_reset_hooks_in_context_manager(model):
    c = Counter()
    with model.hooks(fwd_hooks=[(embed, c.inc)]):
        model.reset_hooks()
        assert n_fwd(model) == 0
    assert n_fwd(model) == 0


def test_remove_hook(model):
    c = Counter()
    model.add_perma_hook(embed, c.inc)
    model.remove_all_hook_fns()
    assert n_fwd(model) == 1  # permanent not removed without the flag
    model.remove_all_hook_fns(including_permanent=True)
    assert n_fwd(model) == 0
    model.run_with_hooks(PROMPT, fwd_hooks=[])
    assert c.count == 0


def test_conditional_hooks(model):
    """Hooks that fire only with a flag on can be added only with it on."""
    def identity_hook(z, hook):
        return z

    for hook_name, set_flag in [("blocks.0.attn.hook_result", model.set_use_attn_result),
                                ("blocks.0.hook_q_input", model.set_use_split_qkv_input),
                                ("blocks.0.hook_mlp_in", model.set_use_hook_mlp_in),
                                ("blocks.0.hook_attn_in", model.set_use_attn_in)]:
        model.reset_hooks()
        set_flag(False)
        with pytest.raises(AssertionError):
            model.add_hook(hook_name, identity_hook)
        set_flag(True)
        model.add_hook(hook_name, identity_hook)
        set_flag(False)

    d_model, n_heads = model.cfg.d_model, model.cfg.n_heads
    correct_shapes = {3: (1, 4, d_model), 4: (1, 4, n_heads, d_model)}
    for hook_name, set_flag, dims in [("blocks.0.hook_q_input", model.set_use_split_qkv_input, 4),
                                      ("blocks.0.hook_attn_in", model.set_use_attn_in, 4),
                                      ("blocks.0.hook_mlp_in", model.set_use_hook_mlp_in, 3)]:
        model.reset_hooks()
        set_flag(True)
        cache = model.run_with_cache(PROMPT, names_filter=lambda x: x == hook_name)[1]
        assert list(cache.keys()) == [hook_name]
        assert cache[hook_name].shape == correct_shapes[dims]
        set_flag(False)


@pytest.mark.parametrize("zero_attach_pos,prepend", [(z, p) for z in range(2) for p in [True, False]])
def test_prepending_hooks(model, zero_attach_pos, prepend):
    def set_to_zero(z, hook):
        z[:] = 0.0
        return z

    def set_to_randn(z, hook):
        return torch.randn_like(z) * 0.1

    model.reset_hooks()
    last = f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"
    for hook_idx in range(2):
        model.add_hook(last, set_to_zero if hook_idx == zero_attach_pos else set_to_randn, prepend=prepend)
    with torch.no_grad():
        logits = model(torch.arange(5)[None, :])
    logits_are_unembed_bias = (zero_attach_pos == 1) != prepend
    assert torch.allclose(logits, model.unembed.b_U[None, :]) == logits_are_unembed_bias


# --- tests/integration/test_main_demo_pattern_hooks.py -------------------------------------------------------

SEQ = 8
REPEATED = torch.tensor([[0] + list(range(1, SEQ)) * 2])


def test_pattern_filter_hook_computes_every_heads_induction_score(model):
    store = torch.zeros(model.cfg.n_layers, model.cfg.n_heads)

    def induction_score_hook(pattern, hook):
        stripe = pattern.diagonal(dim1=-2, dim2=-1, offset=1 - SEQ)
        store[hook.layer(), :] = einops.reduce(stripe, "batch head_index position -> head_index", "mean")
        return pattern

    model.run_with_hooks(REPEATED, return_type=None, fwd_hooks=[(lambda n: n.endswith("pattern"), induction_score_hook)])
    assert (store != 0).all()
    # the same numbers from a cache
    _, cache = model.run_with_cache(REPEATED)
    for l in range(model.cfg.n_layers):
        want = cache[f"blocks.{l}.attn.hook_pattern"].diagonal(dim1=-2, dim2=-1, offset=1 - SEQ).mean((0, 2))
        torch.testing.assert_close(store[l], want)


def test_pattern_hooks_called_once_per_layer_and_layer_method(model):
    calls, layers = {}, []

    def tracking_hook(pattern, hook):
        calls[hook.name] = calls.get(hook.name, 0) + 1
        layers.append(hook.layer())
        return pattern

    model.run_with_hooks(PROMPT, return_type=None, fwd_hooks=[(lambda n: n.endswith("pattern"), tracking_hook)])
    assert calls == {f"blocks.{l}.attn.hook_pattern": 1 for l in range(model.cfg.n_layers)}
    assert layers == list(range(model.cfg.n_layers))


def test_identity_pattern_hook_leaves_the_logits_allclose(model):
    """Issue 23.7: no more than torch.allclose's defaults from the unhooked forward (in fact bit-equal)."""
    ids = torch.randint(0, 50, (3, 20), generator=torch.Generator().manual_seed(3))
    plain = model(ids, return_type="logits")
    hooked = model.run_with_hooks(ids, return_type="logits",
                                  fwd_hooks=[(lambda n: n.endswith("hook_pattern"), lambda p, hook: p)])
    assert torch.allclose(hooked, plain)
    assert torch.equal(hooked, plain)
    edited = model.run_with_hooks(ids, return_type="logits",
                                  fwd_hooks=[("blocks.0.attn.hook_pattern", lambda p, hook: p.flip(1))])
    assert not torch.allclose(edited, plain, atol=1e-3)  # an edit still takes effect


# --- tests/unit/test_hook_introspection.py: list_hooks on the model ------------------------------------------

def _my_named_hook(x, hook):
    return None


def _other_hook(x, hook):
    return None


def test_list_hooks_reports_the_users_callables(model):
    assert model.list_hooks() == {}
    model.add_hook("blocks.0.hook_resid_pre", _my_named_hook)
    model.add_hook("blocks.1.hook_resid_pre", _other_hook, dir="bwd", is_permanent=True)
    result = model.list_hooks()
    assert set(result) == {"blocks.0.hook_resid_pre", "blocks.1.hook_resid_pre"}
    assert [h.user_hook for h in result["blocks.0.hook_resid_pre"]] == [_my_named_hook]
    assert set(model.list_hooks(name_filter="blocks.0.hook_resid_pre")) == {"blocks.0.hook_resid_pre"}
    assert set(model.list_hooks(name_filter=lambda n: n.startswith("blocks.1"))) == {"blocks.1.hook_resid_pre"}
    assert set(model.list_hooks(dir="bwd")) == {"blocks.1.hook_resid_pre"}
    assert set(model.list_hooks(including_permanent=False)) == {"blocks.0.hook_resid_pre"}
    with model.hooks(fwd_hooks=[("hook_embed", _other_hook)]):
        assert [h.user_hook for h in model.list_hooks()["hook_embed"]] == [_other_hook]
