"""Where Sprout differs from TransformerLens (docs/reference/differences.md), and the parts of issues 21.4,
21.5 and 23.3-23.8 that TransformerLens' own tests do not reach: each asserted against an independent
computation (the folded weights, a hand-written RMSNorm, a run of the whole model)."""
import warnings

import pytest
import torch
import torch.nn.functional as F

from sprout.layers import apply_rope
from tests.sprout.tl_ported.test_hooks import PROMPT


def rms(x, eps=1e-6):
    return x / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()


# --- no learned positions ------------------------------------------------------------------------------------

def test_positional_names_say_rope(small, ids):
    # no learned position table; torch's Module.__getattr__ words the error (we add no __getattr__ of our own)
    with pytest.raises(AttributeError, match="W_pos"):
        small.W_pos
    with pytest.raises(AttributeError, match="hook_pos_embed"):
        small.hook_pos_embed
    assert not hasattr(small, "W_pos") and getattr(small, "pos_embed", None) is None
    _, cache = small.run_with_cache(ids)
    with pytest.raises(KeyError, match="RoPE"):
        cache["hook_pos_embed"]
    with pytest.raises(KeyError, match="no learned position embedding"):
        small.run_with_hooks(ids, fwd_hooks=[("hook_pos_embed", lambda x, hook: x)])


# --- scores from the rotated query and key ------------------------------------------------------------------

def test_the_readme_score_decomposition_sums_to_the_score(small, ids):
    model, l, b, i, j, h = small, 2, 1, 6, 3, 1
    _, cache = model.run_with_cache(ids)
    parts = cache.decompose_resid(layer=l, apply_ln=True)[:, b, j]
    k = cache[f"blocks.{l}.attn.hook_k"][b, j, h]
    k_parts = parts @ model.W_K[l, h] * model.blocks[l].attn.k_norm.weight / (k.pow(2).mean() + 1e-6).sqrt()
    k_parts = apply_rope(k_parts[:, None, None], model.cos[j:j + 1], model.sin[j:j + 1])[:, 0, 0]
    score_parts = k_parts @ cache[f"blocks.{l}.attn.hook_rot_q"][b, i, h] / model.cfg.d_head ** 0.5
    torch.testing.assert_close(score_parts.sum(), cache[f"blocks.{l}.attn.hook_attn_scores"][b, h, i, j],
                               atol=1e-5, rtol=1e-5)
    # and the QK bilinear form of the stream does not give the score (QK-norm and RoPE)
    resid = cache[f"blocks.{l}.ln1.hook_normalized"][b]
    naive = resid[i] @ model.QK[l, h].AB @ resid[j] / model.cfg.d_head ** 0.5
    assert not torch.isclose(naive, cache[f"blocks.{l}.attn.hook_attn_scores"][b, h, i, j], atol=1e-3)


# --- the effective embedding ---------------------------------------------------------------------------------

def test_effective_embedding_is_W_E_plus_block_0_on_each_token_alone(small):
    model = small
    E = model.effective_embedding(chunk=7)  # several chunks
    W_E = model.W_E
    # a token alone attends to itself: the attention writes its OV image (folded weights, gainless stream)
    attn = torch.einsum("vm,hmn->vn", rms(W_E), model.OV[0].AB)
    mid = W_E + attn
    x = rms(mid)
    mlp = (F.silu(x @ model.W_gate[0]) * (x @ model.W_in[0])) @ model.W_out[0]
    torch.testing.assert_close(E, mid + mlp, atol=1e-5, rtol=1e-5)
    # what block 0 adds is not small next to W_E in a random model: W_E alone would miss it
    assert (E - W_E).norm() > 0.1 * W_E.norm()


def test_effective_embedding_of_the_walkthrough_includes_position_0(walk):
    E = walk.effective_embedding()
    resid = (walk.W_E + walk.W_pos[0])[:, None]
    torch.testing.assert_close(E, walk(resid, start_at_layer=0, stop_at_layer=1, return_type="logits")[:, 0])
    _, cache = walk.run_with_cache(torch.tensor([[7]]))
    torch.testing.assert_close(E[7], cache["blocks.0.hook_resid_post"][0, 0], atol=1e-6, rtol=0)


# --- modules that compute ------------------------------------------------------------------------------------

def test_components_compute_as_transformer_lens_modules(small, ids):
    model = small
    logits, cache = model.run_with_cache(ids)
    final = cache["blocks.2.hook_resid_post"]
    torch.testing.assert_close(model.ln_final(final), rms(final), atol=1e-6, rtol=0)  # gainless: TL's folded ln_final
    torch.testing.assert_close(model.unembed(model.ln_final(final)), logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(model.ln_final(final) @ model.W_U + model.b_U, logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(model.ln_final.normalize(final), cache["ln_final.hook_normalized"], atol=1e-6, rtol=0)
    torch.testing.assert_close(model.ln_final.normalize(final) @ model.W_U, logits, atol=1e-5, rtol=0)
    for l, block in enumerate(model.blocks):
        pre, mid = cache[f"blocks.{l}.hook_resid_pre"], cache[f"blocks.{l}.hook_resid_mid"]
        x = block.ln1(pre)
        torch.testing.assert_close(x, cache[f"blocks.{l}.ln1.hook_normalized"] * block.norm1.weight, atol=1e-6, rtol=0)
        torch.testing.assert_close(block.attn(x), cache[f"blocks.{l}.hook_attn_out"], atol=1e-6, rtol=0)
        torch.testing.assert_close(block.attn(x, x, x), cache[f"blocks.{l}.hook_attn_out"], atol=1e-6, rtol=0)
        heads = x[:, :, None].expand(-1, -1, model.cfg.n_heads, -1)  # each head's own input
        torch.testing.assert_close(block.attn(heads, heads, heads), cache[f"blocks.{l}.hook_attn_out"], atol=1e-5, rtol=0)
        torch.testing.assert_close(block.mlp(block.ln2(mid)), cache[f"blocks.{l}.hook_mlp_out"], atol=1e-6, rtol=0)
    # the cache's final-norm recomputation stays paired with the folded W_U
    stack = cache.accumulated_resid(apply_ln=True)
    torch.testing.assert_close(stack[-1] @ model.W_U, logits, atol=1e-5, rtol=0)


def test_a_direct_attention_call_honours_padding(small):
    model = small
    ids = torch.tensor([[0, 0, 5, 9, 2, 11], [4, 7, 1, 3, 8, 6]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    _, cache = model.run_with_cache(ids, attention_mask=mask)
    x = model.blocks[0].ln1(cache["blocks.0.hook_resid_pre"])
    out = model.blocks[0].attn(x, attention_mask=mask)
    torch.testing.assert_close(out[mask.bool()], cache["blocks.0.hook_attn_out"][mask.bool()], atol=1e-6, rtol=0)
    additive = torch.where(mask.bool(), 0.0, float("-inf"))[:, None, None, :]
    out2 = model.blocks[0].attn(x, additive_attention_mask=additive)
    torch.testing.assert_close(out2[mask.bool()], out[mask.bool()], atol=0, rtol=0)
    with pytest.raises(ValueError, match="past_kv_cache_entry"):
        model.blocks[0].attn(x, past_kv_cache_entry=object())


def test_walkthrough_components_compute(walk, ids):
    logits, cache = walk.run_with_cache(ids)
    final = cache["blocks.2.hook_resid_post"]
    torch.testing.assert_close(walk.unembed(walk.ln_final(final)), logits, atol=1e-5, rtol=0)
    for l, block in enumerate(walk.blocks):
        x = block.ln1(cache[f"blocks.{l}.hook_resid_pre"])
        torch.testing.assert_close(block.attn(x), cache[f"blocks.{l}.hook_attn_out"], atol=1e-6, rtol=0)
        torch.testing.assert_close(block.attn(x, x, x.clone()), cache[f"blocks.{l}.hook_attn_out"], atol=1e-5, rtol=0)
        torch.testing.assert_close(block.mlp(block.ln2(cache[f"blocks.{l}.hook_resid_mid"])),
                                   cache[f"blocks.{l}.hook_mlp_out"], atol=1e-6, rtol=0)
    stack = cache.accumulated_resid(apply_ln=True)
    torch.testing.assert_close(stack[-1] @ walk.W_U + walk.b_U, logits, atol=1e-5, rtol=0)


# --- names TransformerLens tools look for --------------------------------------------------------------------

def test_tokens_to_residual_directions_shapes_as_transformer_lens(small):
    d = small.cfg.d_model
    assert small.tokens_to_residual_directions(5).shape == (d,)
    assert small.tokens_to_residual_directions(torch.tensor(5)).shape == (d,)
    assert small.tokens_to_residual_directions(torch.tensor([5])).shape == (d,)  # one element: [d_model]
    assert small.tokens_to_residual_directions(torch.tensor([5, 6])).shape == (2, d)
    assert small.tokens_to_residual_directions(torch.tensor([[5, 6, 7]] * 2)).shape == (2, 3, d)
    torch.testing.assert_close(small.tokens_to_residual_directions(torch.tensor([5, 6]))[1], small.W_U[:, 6])


def test_to_single_str_token(small):
    from sprout.tokenizer import char_tokenizer

    small.tokenizer = char_tokenizer("abcdefghij")
    assert small.to_single_str_token(3) == "d"
    for bad in (3.0, True, torch.tensor(3)):
        with pytest.raises(TypeError, match="one token id"):
            small.to_single_str_token(bad)
    with pytest.raises(ValueError, match="out of range"):
        small.to_single_str_token(50)


# --- residual input (issue 21.4) -----------------------------------------------------------------------------

@pytest.mark.parametrize("resid, error, words", [
    (torch.zeros(2, 8, 15), ValueError, r"residual stream \[batch, pos, 16\], got shape \(2, 8, 15\)"),
    (torch.zeros(8, 16), ValueError, r"got shape \(8, 16\)"),
    (torch.zeros(2, 8, 16, dtype=torch.float64), TypeError, "in the model's dtype torch.float32, got torch.float64"),
    (torch.zeros(2, 8, 16, dtype=torch.long), TypeError, "floating point numbers, got dtype torch.int64"),
    (torch.zeros(2, 21, 16), ValueError, "sequence of 21 tokens is longer than the model's context of 20 tokens"),
    (torch.zeros(2, 0, 16), ValueError, r"the sequence is empty \(0 tokens\)"),
    (torch.zeros(0, 8, 16), ValueError, "the batch is empty"),
    ([[0.0] * 16], TypeError, "got list"),
])
@pytest.mark.filterwarnings("ignore:hooks. skipped")
def test_residual_input_is_checked_before_any_work(small, resid, error, words):
    fired = []
    with pytest.raises(error, match=words):
        small.run_with_hooks(resid, start_at_layer=1, fwd_hooks=[(lambda n: True, lambda x, hook: fired.append(1))])
    assert fired == []


def test_the_words_for_too_long_match_token_ids(small):
    with pytest.raises(ValueError) as from_ids:
        small(torch.zeros(1, 21, dtype=torch.long))
    with pytest.raises(ValueError) as from_resid:
        small(torch.zeros(1, 21, 16), start_at_layer=0)
    assert str(from_ids.value) == str(from_resid.value)


def test_tokens_for_a_loss_from_the_stream_are_checked(small, ids):
    resid = small(ids, stop_at_layer=1)
    with pytest.raises(ValueError, match=r"tokens has shape \(2, 7\) but the residual stream has \(2, 8\)"):
        small(resid, start_at_layer=1, tokens=ids[:, :7], return_type="loss")
    with pytest.raises(ValueError, match=r"token id \d+ is out of range for a vocabulary of 50"):
        small(resid, start_at_layer=1, tokens=ids + 40, return_type="loss")
    with pytest.raises(TypeError, match="integer tensor"):
        small(resid, start_at_layer=1, tokens=ids.float(), return_type="loss")


@pytest.mark.parametrize("kw, words", [
    (dict(stop_at_layer=4), r"stop_at_layer must be in -3..3"), (dict(stop_at_layer=-4), r"-3..3"),
    (dict(stop_at_layer=1.0), "must be an integer"), (dict(stop_at_layer=True), "must be an integer"),
])
def test_layer_ranges_are_checked(small, ids, kw, words):
    with pytest.raises(ValueError, match=words):
        small(ids, **kw)


# --- hook names and flags (issue 21.5) -----------------------------------------------------------------------

def test_a_filter_skips_flagged_hooks_and_a_name_is_refused_everywhere(small, ids):
    seen = set()
    with pytest.warns(UserWarning, match="skipped .* hook point"):
        small.add_hook(lambda n: True, lambda x, hook: seen.add(hook.name))
    small(ids)
    small.reset_hooks()
    # every hook point but those needing a flag (the input hooks, and for add_hook attn.hook_result)
    assert seen == {n for n in small.hook_dict if small.hook_flags.gated_flag(n) is None and not n.endswith("hook_result")}
    for call in (lambda: small.add_hook("blocks.1.hook_k_input", lambda x, hook: x),
                 lambda: small.run_with_hooks(ids, fwd_hooks=[("blocks.1.hook_k_input", lambda x, hook: x)]),
                 lambda: small.run_with_hooks(ids, bwd_hooks=[("blocks.1.attn.hook_v_input", lambda x, hook: x)]),
                 lambda: small.hooks(fwd_hooks=[("blocks.0.hook_mlp_in", lambda x, hook: x)]).__enter__()):
        with pytest.raises(AssertionError, match="fires only with model.cfg.use_"):
            call()
        assert small.context_level == 0 and not any(p.fwd_hooks or p.bwd_hooks for p in small.hook_dict.values())


def test_gradient_cache_demo_runs_unchanged(small):
    """TransformerLens' gradient-cache recipe: add_hook with a filter that matches every hook point."""
    cache = {}

    def backward_cache_hook(act, hook):
        cache[hook.name] = act.detach()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        small.add_hook(lambda name: True, backward_cache_hook, "bwd")
    small(PROMPT, return_type="loss").backward()
    small.reset_hooks()
    assert "blocks.0.hook_resid_pre" in cache and "hook_embed" in cache
    assert not any(n.endswith(("q_input", "attn_in", "mlp_in")) for n in cache)


def test_hooks_context_leaves_nothing_on_keyboard_interrupt(small, ids):
    def interrupting_filter(name):
        if name == "blocks.1.hook_resid_post":
            raise KeyboardInterrupt
        return name.startswith("blocks.0")

    flags = {k: v for k, v in small.cfg.__dict__.items() if k.startswith("use_")}
    for hooks in ([("hook_embed", lambda x, hook: x), (interrupting_filter, lambda x, hook: x)],
                  [("hook_embed", lambda x, hook: (_ for _ in ()).throw(KeyboardInterrupt))]):
        with pytest.raises(KeyboardInterrupt):
            with small.hooks(fwd_hooks=hooks):
                small(ids)
        assert small.context_level == 0 and not small.is_caching
        assert not any(p.fwd_hooks or p._forward_hooks for p in small.hook_dict.values())
    with pytest.raises(KeyboardInterrupt):
        with small.hooks(fwd_hooks=[("hook_embed", lambda x, hook: x)]):
            small.set_use_split_qkv_input(True)
            small.run_with_cache(ids)
            raise KeyboardInterrupt
    small.set_use_split_qkv_input(False)
    assert {k: v for k, v in small.cfg.__dict__.items() if k.startswith("use_")} == flags
    assert small.context_level == 0 and not small.is_caching
