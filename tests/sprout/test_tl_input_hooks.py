"""TransformerLens' hook flags and input hooks (`set_use_split_qkv_input`, `set_use_attn_in`,
`set_use_hook_mlp_in`, `set_use_attn_result`) on Sprout and the walkthrough GPT, checked against
hand-written hooks that recompute one head's query, key or value from the raw module weights, and
TransformerLens' own `patching.get_act_patch_direct_path` against the same."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformer_lens import patching

from sprout import Sprout
from sprout.walkthrough import build_step
from tests.conftest import TINY, needs_tl4, randomize_gains


@pytest.fixture
def model():
    torch.manual_seed(0)
    return randomize_gains(Sprout(TINY).eval())


def walkthrough_model():
    torch.manual_seed(0)
    m = build_step("4.10").eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.dim() == 1 and name.startswith(("blocks", "ln_final")):
                p.add_(0.3 * torch.randn_like(p))
    return m


def tokens_for(model, batch=2, pos=8, seed=1):
    return torch.randint(0, model.cfg.d_vocab, (batch, pos), generator=torch.Generator().manual_seed(seed))


# --- independent recomputation of one head's q, k or v from the raw modules ---------------------------

def head_input(model, layer, component, head, x):
    """Head `head`'s `component` ("q", "k", "v") [batch, pos, d_head] from stream x [batch, pos, d_model],
    through the block's first norm and the raw projection weights (no TransformerLens layout)."""
    block = model.blocks[layer]
    part = "qkv".index(component)
    if isinstance(model, Sprout):
        normed = torch.nn.functional.rms_norm(x, (x.size(-1),), block.norm1.weight, block.norm1.eps)
        d, dh = model.cfg.d_model, model.cfg.d_head
        W = block.attn.qkv.weight[part * d + head * dh: part * d + (head + 1) * dh]
        return normed @ W.T
    normed = block.ln1.without_hooks(x)
    return normed @ getattr(block.attn.heads[head], ("query", "key", "value")[part]).weight.T


def patched_by_hand(model, tokens, layer, component, head, delta):
    """Logits when head (layer, head) alone computes its `component` from resid_pre + delta."""
    seen = {}

    def keep(x, hook):
        seen["resid_pre"] = x.clone()

    def replace(act, hook):
        act = act.clone()
        act[:, :, head] = head_input(model, layer, component, head, seen["resid_pre"] + delta)
        return act

    return model.run_with_hooks(tokens, fwd_hooks=[(f"blocks.{layer}.hook_resid_pre", keep),
                                                   (f"blocks.{layer}.attn.hook_{component}", replace)])


# --- flags ---------------------------------------------------------------------------------------------

def test_flags_are_off_by_default_and_input_hooks_do_not_fire(model):
    cfg = model.cfg
    assert not (cfg.use_split_qkv_input or cfg.use_attn_in or cfg.use_hook_mlp_in or cfg.use_attn_result)
    _, cache = model.run_with_cache(tokens_for(model))
    assert not [k for k in cache.keys() if k.endswith(("_input", "attn_in", "mlp_in"))]
    with pytest.raises(ValueError, match="use_split_qkv_input"):
        model.add_hook("blocks.0.hook_q_input", lambda x, hook: x)
    with pytest.raises(ValueError, match="use_hook_mlp_in"):
        model.add_hook("blocks.1.hook_mlp_in", lambda x, hook: x)


class OpNames(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


def ops_of(model, tokens):
    with torch.inference_mode(), OpNames() as seen:
        model(tokens)
    return seen.ops


@pytest.mark.parametrize("build", [lambda: Sprout(TINY).eval(), walkthrough_model], ids=["sprout", "walkthrough"])
def test_flags_off_add_no_work(build):
    model = build()
    tokens = tokens_for(model)
    plain = ops_of(model, tokens)
    assert not {"aten.repeat", "aten.clone", "aten.einsum", "aten.bmm"} & set(plain)
    for setter in ("set_use_split_qkv_input", "set_use_attn_in", "set_use_hook_mlp_in"):
        getattr(model, setter)(True)
        assert ops_of(model, tokens) != plain  # the flag does change the work ...
        getattr(model, setter)(False)
        assert ops_of(model, tokens) == plain  # ... and leaves nothing behind when off


@pytest.mark.parametrize("build", [lambda: randomize_gains(Sprout(TINY).eval()), walkthrough_model],
                         ids=["sprout", "walkthrough"])
def test_split_inputs_are_per_head_copies_and_change_nothing_unedited(build):
    model = build()
    tokens = tokens_for(model)
    base = model(tokens)
    for setter, names in (("set_use_split_qkv_input", ("hook_q_input", "hook_k_input", "hook_v_input")),
                          ("set_use_attn_in", ("hook_attn_in",))):
        getattr(model, setter)(True)
        logits, cache = model.run_with_cache(tokens)
        torch.testing.assert_close(logits, base, atol=1e-5, rtol=0)
        for l in range(model.cfg.n_layers):
            for name in names:
                act = cache[f"blocks.{l}.{name}"]
                assert act.shape == (*tokens.shape, model.cfg.n_heads, model.cfg.d_model)
                want = cache[f"blocks.{l}.hook_resid_pre"][:, :, None].expand_as(act)
                torch.testing.assert_close(act, want, atol=0, rtol=0)
            assert cache[f"blocks.{l}.ln1.hook_scale"].shape == (*tokens.shape, 1)  # ln1 still reports the stream
        getattr(model, setter)(False)


def test_flags_are_read_from_cfg_and_exclusive(model):
    model.cfg.use_split_qkv_input = True  # as HookedTransformer code sometimes sets it
    _, cache = model.run_with_cache(tokens_for(model), names_filter=lambda n: n.endswith("q_input"))
    # issue 23.6: each layer's input under its name and TransformerLens 4's (`attn.hook_q_input`), one tensor
    assert sorted(cache.keys()) == sorted(f"blocks.{l}.{a}hook_q_input" for l in range(TINY.n_layer) for a in ("", "attn."))
    assert all(cache[f"blocks.{l}.hook_q_input"] is cache[f"blocks.{l}.attn.hook_q_input"] for l in range(TINY.n_layer))
    with pytest.raises(ValueError, match="mutually exclusive"):
        model.set_use_attn_in(True)
    model.set_use_split_qkv_input(False)
    model.set_use_attn_result(True)
    _, cache = model.run_with_cache(tokens_for(model))
    assert "blocks.0.attn.hook_result" in cache.keys()


# --- edits reach exactly one head ------------------------------------------------------------------------

@pytest.mark.parametrize("component", ["q", "k", "v"])
def test_editing_one_heads_input_reaches_that_head_alone(model, component):
    model.set_use_split_qkv_input(True)
    tokens, layer, head = tokens_for(model), 1, 2
    delta = torch.randn(TINY.d_model, generator=torch.Generator().manual_seed(5))

    def add(act, hook):
        act[:, :, head] += delta

    # TransformerLens 4 names the hook under attn; both names reach the same hook point.
    name = f"blocks.{layer}.attn.hook_{component}_input" if component == "k" else f"blocks.{layer}.hook_{component}_input"
    got = model.run_with_hooks(tokens, fwd_hooks=[(name, add)])
    model.set_use_split_qkv_input(False)
    torch.testing.assert_close(got, patched_by_hand(model, tokens, layer, component, head, delta), atol=1e-5, rtol=1e-5)


def test_attn_in_edit_reaches_q_k_and_v_of_one_head(model):
    model.set_use_attn_in(True)
    tokens, layer, head = tokens_for(model), 1, 0
    delta = torch.randn(TINY.d_model, generator=torch.Generator().manual_seed(6))

    def add(act, hook):
        act[:, :, head] += delta

    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n.startswith(f"blocks.{layer}."))
    model.add_hook(f"blocks.{layer}.hook_attn_in", add)
    _, edited = model.run_with_cache(tokens, names_filter=lambda n: n.startswith(f"blocks.{layer}.attn.hook_"))
    model.reset_hooks()
    x = cache[f"blocks.{layer}.hook_resid_pre"]
    for c in "qkv":
        act = edited[f"blocks.{layer}.attn.hook_{c}"]
        torch.testing.assert_close(act[:, :, head], head_input(model, layer, c, head, x + delta), atol=1e-5, rtol=1e-5)
        others = [h for h in range(TINY.n_head) if h != head]
        torch.testing.assert_close(act[:, :, others], cache[f"blocks.{layer}.attn.hook_{c}"][:, :, others], atol=1e-6, rtol=0)


@pytest.mark.parametrize("build", [lambda: randomize_gains(Sprout(TINY).eval()), walkthrough_model],
                         ids=["sprout", "walkthrough"])
def test_mlp_in_edit_reaches_the_mlp_not_the_stream(build):
    model = build()
    model.set_use_hook_mlp_in(True)
    tokens, layer = tokens_for(model), 0
    delta = torch.randn(model.cfg.d_model, generator=torch.Generator().manual_seed(7))
    _, cache = model.run_with_cache(tokens)

    def add(act, hook):
        act += delta

    model.add_hook(f"blocks.{layer}.hook_mlp_in", add)
    _, edited = model.run_with_cache(tokens, names_filter=lambda n: n.startswith(f"blocks.{layer}."))
    model.reset_hooks()
    block, mid = model.blocks[layer], cache[f"blocks.{layer}.hook_resid_mid"]
    with torch.no_grad():
        if isinstance(model, Sprout):
            mlp_out = block.ffn(block.norm2(mid + delta))
        else:
            mlp_out = block.mlp(block.ln2.without_hooks(mid + delta))
    torch.testing.assert_close(edited[f"blocks.{layer}.hook_resid_mid"], mid, atol=1e-6, rtol=0)  # the stream: unedited
    torch.testing.assert_close(edited[f"blocks.{layer}.hook_mlp_out"], mlp_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(edited[f"blocks.{layer}.hook_resid_post"], mid + mlp_out, atol=1e-5, rtol=1e-5)


# --- TransformerLens' direct path patching --------------------------------------------------------------

@pytest.mark.parametrize("build", [lambda: randomize_gains(Sprout(TINY).eval()), walkthrough_model],
                         ids=["sprout", "walkthrough"])
@pytest.mark.parametrize("component", ["q", "k", "v"])
@needs_tl4
def test_direct_path_patching_matches_hand_written_hooks(build, component):
    model = build()
    clean = tokens_for(model, seed=3)
    corrupted = clean.clone()
    corrupted[:, 2] = (clean[:, 2] + 5) % model.cfg.d_vocab
    _, clean_cache = model.run_with_cache(clean)
    _, corrupted_cache = model.run_with_cache(corrupted)

    def metric(logits):
        return logits[:, -1, 3].mean()

    src_layer, src_head = 0, 1
    got = patching.get_act_patch_direct_path(model, corrupted, clean_cache, corrupted_cache, metric,
                                             src_layer, src_head, component=component, verbose=False)
    assert not model.cfg.use_split_qkv_input  # TransformerLens restored the flag
    W_O = model.blocks[src_layer].attn.W_O[src_head]
    z = f"blocks.{src_layer}.attn.hook_z"
    delta = (clean_cache[z][:, :, src_head] - corrupted_cache[z][:, :, src_head]) @ W_O
    want = torch.zeros_like(got)
    for layer in range(src_layer + 1, model.cfg.n_layers):
        for head in range(model.cfg.n_heads):
            with torch.no_grad():
                want[layer, head] = metric(patched_by_hand(model, corrupted, layer, component, head, delta))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert (got[src_layer + 1:] != metric(model(corrupted))).any()  # the patch moves the metric
