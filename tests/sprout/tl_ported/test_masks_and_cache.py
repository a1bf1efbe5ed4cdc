"""TransformerLens' tests/integration/test_attention_mask.py, test_left_padding.py (with masks built by hand:
these models have no tokenizer; `hook_pos_embed` is the walkthrough's only), test_cache_pos_slice.py and
test_cache_hook_names.py, on tiny models. TL 4's `utilities.get_act_name` (TL 3's `utils`) spells the hook names."""
import pytest
import torch
from transformer_lens import utilities as utils

from sprout import Sprout, SproutConfig


def test_attention_mask_sets_masked_scores_to_minus_inf_even_for_low_scores():
    torch.manual_seed(0)
    model = Sprout(SproutConfig(vocab_size=2, context=5, n_layer=1, n_head=6, d_model=12, d_ff=8)).eval()
    tokens = torch.ones((1, 5), dtype=torch.int64)
    masked = torch.triu(torch.ones(5, 5), diagonal=1).bool()
    seen = []

    def attn_scores_hook(attn_scores, hook):
        assert torch.all(attn_scores[:, :, masked] == float("-inf"))
        attn_scores[:, :, ~masked] = 1e-6  # low scores where the mask lets a query attend
        return attn_scores

    def attn_hook(attn, hook):
        assert torch.all(attn[:, :, masked] == 0), "the pattern attends outside the mask"
        seen.append(attn)
        return attn

    model.run_with_hooks(tokens, fwd_hooks=[(utils.get_act_name("attn_scores", 0), attn_scores_hook),
                                            (utils.get_act_name("attn", 0), attn_hook)])
    rows = torch.arange(1, 6, dtype=torch.float32)[:, None]
    torch.testing.assert_close(seen[0][0, 0], (~masked).float() / rows)  # equal scores: uniform rows


@pytest.fixture(params=["small", "walk"])
def model(request):
    return request.getfixturevalue(request.param)


def test_masked_tokens(model):
    tokens = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(2))
    full = torch.ones_like(tokens)
    assert torch.allclose(model(tokens, return_type="logits"), model(tokens, attention_mask=full, return_type="logits"))
    # a column of zeros in the mask is the same as removing that token
    drop = 2
    edited = torch.cat([tokens[:, :drop], tokens[:, drop + 1:]], dim=1)
    mask = full.clone()
    mask[:, drop] = 0
    out = model(tokens, attention_mask=mask, return_type="logits")
    out = torch.cat([out[:, :drop], out[:, drop + 1:]], dim=1)
    assert torch.allclose(model(edited, return_type="logits"), out, atol=1e-4)


def test_left_and_right_padding_give_each_prompt_its_own_logits(model):
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(1, 50, (n,), generator=g) for n in (3, 7, 5)]
    T = max(len(p) for p in prompts)
    left = torch.zeros(3, T, dtype=torch.long)
    right = torch.zeros(3, T, dtype=torch.long)
    left_mask, right_mask = torch.zeros_like(left), torch.zeros_like(right)
    for i, p in enumerate(prompts):
        left[i, T - len(p):], left_mask[i, T - len(p):] = p, 1
        right[i, :len(p)], right_mask[i, :len(p)] = p, 1
    left_logits, left_cache = model.run_with_cache(left, attention_mask=left_mask)
    right_logits, right_cache = model.run_with_cache(right, attention_mask=right_mask)
    for i, p in enumerate(prompts):
        single, single_cache = model.run_with_cache(p[None])
        n = len(p)
        assert torch.allclose(left_logits[i, T - n:], single[0], atol=1e-4)
        assert torch.allclose(right_logits[i, :n], single[0], atol=1e-4)
        for name in (utils.get_act_name("k", 1), utils.get_act_name("pre", 0), "hook_embed",
                     utils.get_act_name("scale", 1, "ln1")):
            assert torch.allclose(left_cache[name][i, T - n:], single_cache[name][0], atol=1e-4), name
            assert torch.allclose(right_cache[name][i, :n], single_cache[name][0], atol=1e-4), name
        if "hook_pos_embed" in model.hook_dict:  # learned positions: each real token keeps its own
            assert torch.equal(left_cache["hook_pos_embed"][i, T - n:], single_cache["hook_pos_embed"][0])


@pytest.mark.parametrize("remove_batch_dim", [False, True])
def test_run_with_cache_pos_slice(model, remove_batch_dim):
    tokens = torch.randint(0, 50, (1, 8), generator=torch.Generator().manual_seed(7))  # the walkthrough's context
    _, full = model.run_with_cache(tokens, return_type=None, remove_batch_dim=remove_batch_dim)
    n_heads, d_head, d_model = model.cfg.n_heads, model.cfg.d_head, model.cfg.d_model
    lead = () if remove_batch_dim else (1,)
    at = (lambda t, i: t[i]) if remove_batch_dim else (lambda t, i: t[0, i])
    for i in (0, 4, 7, -1):
        _, part = model.run_with_cache(tokens, return_type=None, pos_slice=i, remove_batch_dim=remove_batch_dim)
        assert part["embed"].shape == torch.Size([*lead, 1, d_model])
        assert part["q", 0].shape == torch.Size([*lead, 1, n_heads, d_head])
        assert torch.equal(at(full["embed"], i), at(part["embed"], 0))
        for layer in range(model.cfg.n_layers):
            for name in ("resid_pre", "resid_post", "attn_out", "mlp_out", "q", "k", "v", "z"):
                assert torch.equal(at(full[name, layer], i), at(part[name, layer], 0)), (name, layer)
            # patterns and scores slice their query axis
            pattern = full["pattern", layer]
            want = pattern[:, i] if remove_batch_dim else pattern[:, :, i]
            got = part["pattern", layer][:, 0] if remove_batch_dim else part["pattern", layer][:, :, 0]
            assert torch.equal(want, got)


def test_cache_hook_names_in_forward_order():
    torch.manual_seed(0)
    model = Sprout(SproutConfig(vocab_size=50, context=20, n_layer=1, n_head=2, d_model=16, d_ff=32)).eval()
    _, cache = model.run_with_cache(torch.tensor([[1, 2, 3]]))
    block = ["hook_resid_pre", "ln1.hook_scale", "ln1.hook_normalized", "attn.hook_q", "attn.hook_k", "attn.hook_v",
             "attn.hook_q_normed", "attn.hook_k_normed", "attn.hook_rot_q", "attn.hook_rot_k",
             "attn.hook_attn_scores", "attn.hook_pattern", "attn.hook_z", "hook_attn_out", "hook_resid_mid",
             "ln2.hook_scale", "ln2.hook_normalized", "mlp.hook_pre", "mlp.hook_pre_linear", "mlp.hook_post",
             "hook_mlp_out", "hook_resid_post"]
    want = ["hook_embed"] + [f"blocks.0.{n}" for n in block] + ["ln_final.hook_scale", "ln_final.hook_normalized",
                                                                  "unembed.hook_out"]
    assert list(cache.keys()) == want


# --- tests/acceptance/test_activation_cache.py: the final norm's recomputation ---------------------------------

def test_accumulated_resid_layer_variants_and_apply_ln(model):
    from transformer_lens.utilities.slice import Slice

    tokens = torch.randint(0, 50, (3, 8), generator=torch.Generator().manual_seed(8))
    logits, cache = model.run_with_cache(tokens)
    stack = cache.accumulated_resid(layer=-1, incl_mid=True, pos_slice=-1)
    assert torch.equal(stack, cache.accumulated_resid(layer=model.cfg.n_layers, incl_mid=True, pos_slice=-1))
    assert torch.equal(stack, cache.accumulated_resid(layer=None, incl_mid=True, pos_slice=-1))
    ref = cache.apply_ln_to_stack(stack, layer=-1, pos_slice=-1, recompute_ln=True)
    scaled, labels = cache.accumulated_resid(layer=None, incl_mid=True, pos_slice=Slice(-1), apply_ln=True,
                                             return_labels=True)
    assert torch.isclose(ref, scaled, atol=1e-7).all()
    assert labels == [f"{l}_{k}" for l in range(model.cfg.n_layers) for k in ("pre", "mid")] + ["final_post"]
    cached = cache.apply_ln_to_stack(stack, layer=-1, pos_slice=-1, recompute_ln=False)
    assert not torch.isclose(ref, cached, atol=1e-7).all()
    # the last entry, read out with the folded W_U (and b_U), is the logits at the last position
    torch.testing.assert_close(scaled[-1] @ model.W_U + model.b_U, logits[:, -1], atol=1e-5, rtol=0)
