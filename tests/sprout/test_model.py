"""The hooked Sprout: equal to Hugging Face's Qwen3 and to a plain implementation, hooks with the right
names and shapes, both attention paths, parameter counts, course-compatible state dict."""
import math

import pytest
import torch
import torch.nn.functional as F

from benchmarks.plain_sprout import PlainSprout
from sprout import Sprout, SproutConfig
from sprout.layers import apply_rope, rope_tables
from tests.conftest import TINY


def qwen3_from(model: Sprout):
    """The same weights in Hugging Face's Qwen3ForCausalLM (an independent implementation)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    c = model.config
    hf = Qwen3ForCausalLM(Qwen3Config(
        vocab_size=c.vocab_size, hidden_size=c.d_model, intermediate_size=c.d_ff, num_hidden_layers=c.n_layer,
        num_attention_heads=c.n_head, num_key_value_heads=c.n_head, head_dim=c.d_head,
        max_position_embeddings=c.context, rms_norm_eps=1e-6, rope_theta=c.rope_base,
        tie_word_embeddings=True, attention_bias=False, hidden_act="silu")).eval()
    sd = {"model.embed_tokens.weight": model.embed.weight, "model.norm.weight": model.norm.weight,
          "lm_head.weight": model.head.weight}
    for l, b in enumerate(model.blocks):
        p = f"model.layers.{l}."
        q, k, v = b.attn.qkv.weight.split(c.d_model, dim=0)
        sd.update({p + "self_attn.q_proj.weight": q, p + "self_attn.k_proj.weight": k,
                   p + "self_attn.v_proj.weight": v, p + "self_attn.o_proj.weight": b.attn.proj.weight,
                   p + "self_attn.q_norm.weight": b.attn.q_norm.weight,
                   p + "self_attn.k_norm.weight": b.attn.k_norm.weight,
                   p + "input_layernorm.weight": b.norm1.weight,
                   p + "post_attention_layernorm.weight": b.norm2.weight,
                   p + "mlp.gate_proj.weight": b.ffn.w1.weight, p + "mlp.up_proj.weight": b.ffn.w3.weight,
                   p + "mlp.down_proj.weight": b.ffn.w2.weight})
    hf.load_state_dict({k: v.detach().clone() for k, v in sd.items()}, strict=True)
    return hf


def test_logits_equal_huggingface_qwen3(tiny_model):
    tokens = torch.randint(0, TINY.vocab_size, (3, TINY.context), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = tiny_model(tokens)
        theirs = qwen3_from(tiny_model)(tokens).logits
    assert (ours - theirs).abs().max().item() <= 1e-5


def test_hooked_paths_equal_huggingface_qwen3(tiny_model):
    """With every hook cached, the materialised attention path still matches Qwen3."""
    tokens = torch.randint(0, TINY.vocab_size, (2, 40), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        logits, cache = tiny_model.run_with_cache(tokens)
        theirs = qwen3_from(tiny_model)(tokens).logits
    assert (logits - theirs).abs().max().item() <= 1e-5
    assert "blocks.1.attn.hook_result" not in cache.cache_dict  # as in TransformerLens: opt in
    tiny_model.cfg.use_attn_result = True
    try:
        logits_with_result, cache = tiny_model.run_with_cache(tokens)
    finally:
        tiny_model.cfg.use_attn_result = False
    assert "blocks.1.attn.hook_result" in cache.cache_dict
    assert (logits_with_result - theirs).abs().max().item() <= 1e-5


def test_state_dict_moves_to_and_from_a_plain_implementation(tiny_model):
    plain = PlainSprout(TINY)
    plain.load_state_dict(tiny_model.state_dict(), strict=True)
    again = Sprout(TINY)
    again.load_state_dict(plain.state_dict(), strict=True)
    tokens = torch.randint(0, TINY.vocab_size, (2, 30))
    with torch.no_grad():
        assert torch.equal(plain(tokens)[0], tiny_model(tokens, return_type="logits"))
        assert torch.equal(again(tokens, return_type="logits"), tiny_model(tokens, return_type="logits"))


def test_state_dict_keys_are_model_py_keys(tiny_cfg):
    sd = Sprout(tiny_cfg).state_dict()
    expected = {"embed.weight", "norm.weight", "head.weight"}
    for l in range(tiny_cfg.n_layer):
        expected |= {f"blocks.{l}.{k}.weight" for k in (
            "norm1", "attn.qkv", "attn.proj", "attn.q_norm", "attn.k_norm", "norm2", "ffn.w1", "ffn.w2", "ffn.w3")}
    assert set(sd) == expected
    d, dh = tiny_cfg.d_model, tiny_cfg.d_head
    assert sd["blocks.0.attn.qkv.weight"].shape == (3 * d, d)
    assert sd["blocks.0.attn.q_norm.weight"].shape == (dh,)
    assert sd["blocks.0.ffn.w1.weight"].shape == (tiny_cfg.d_ff, d)


def test_same_seed_same_initial_weights_as_plain():
    torch.manual_seed(3)
    ours = Sprout(TINY)
    torch.manual_seed(3)
    plain = PlainSprout(TINY)
    for (name, a), (_, b) in zip(ours.state_dict().items(), plain.state_dict().items()):
        assert torch.equal(a, b), name


def test_initialisation_statistics():
    cfg = SproutConfig.preset("gpt-4")
    m = Sprout(cfg)
    assert m.head.weight is m.embed.weight
    assert m.embed.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert m.blocks[0].attn.qkv.weight.std().item() == pytest.approx(0.02, rel=0.05)
    small = 0.02 / math.sqrt(2 * cfg.n_layer)
    assert m.blocks[0].attn.proj.weight.std().item() == pytest.approx(small, rel=0.05)
    assert m.blocks[2].ffn.w2.weight.std().item() == pytest.approx(small, rel=0.05)
    assert torch.all(m.norm.weight == 1)


@pytest.mark.parametrize("name,count", [("sprout", 17_309_056)])
def test_parameter_count(name, count):
    assert Sprout(SproutConfig.preset(name)).num_params() == count


def test_presets_have_the_chapter_shapes():
    for name, layers in [("gpt-1", 1), ("gpt-4", 4)]:
        c = SproutConfig.preset(name)
        assert (c.d_model, c.n_layer, c.n_head, c.d_ff, c.vocab_size, c.context) == (192, layers, 3, 512, 8192, 512)
    c = SproutConfig.preset("sprout")
    assert (c.d_model, c.n_layer, c.n_head, c.d_ff) == (384, 8, 6, 1024)
    with pytest.raises(ValueError, match="unknown preset 'gpt-9'"):
        SproutConfig.preset("gpt-9")


def test_config_round_trip_and_errors():
    c = SproutConfig.preset("gpt-4")
    assert SproutConfig.from_dict(c.to_dict()) == c
    with pytest.raises(ValueError, match="unknown SproutConfig keys \\['n_layers'\\]"):
        SproutConfig.from_dict({"n_layers": 4})
    with pytest.raises(ValueError, match="divisible"):
        SproutConfig(d_model=100, n_head=3)
    with pytest.raises(ValueError, match="even"):
        SproutConfig(d_model=36, n_head=4)


def test_transformer_lens_config_describes_the_model_and_keeps_its_source(tiny_model):
    cfg = tiny_model.cfg
    assert (cfg.n_layers, cfg.n_heads, cfg.d_head, cfg.d_mlp, cfg.d_vocab, cfg.n_ctx) == (2, 4, 16, 128, 256, 64)
    assert cfg.source is tiny_model.config and (cfg.source.n_layer, cfg.source.context) == (2, 64)
    assert cfg.normalization_type == "RMS" and cfg.positional_embedding_type == "rotary"
    assert not hasattr(cfg, "context")  # the course's names are the course config's, not forwarded


def test_reading_cfg_changes_nothing_and_moving_the_model_updates_it(tiny_model):
    model = Sprout(tiny_model.config)
    cfg = model.cfg
    assert model.cfg is cfg and (cfg.device, cfg.dtype) == ("cpu", torch.float32)
    assert all(block.flags is cfg for block in model.blocks)  # the hook flags the blocks read
    model.double()
    assert model.cfg is cfg and cfg.dtype == torch.float64
    model.float()
    assert cfg.dtype == torch.float32


HOOK_SHAPES = {
    "hook_embed": ("B", "T", "d"),
    "blocks.{l}.hook_resid_pre": ("B", "T", "d"),
    "blocks.{l}.ln1.hook_scale": ("B", "T", 1),
    "blocks.{l}.ln1.hook_normalized": ("B", "T", "d"),
    "blocks.{l}.attn.hook_q": ("B", "T", "H", "dh"),
    "blocks.{l}.attn.hook_k": ("B", "T", "H", "dh"),
    "blocks.{l}.attn.hook_v": ("B", "T", "H", "dh"),
    "blocks.{l}.attn.hook_q_normed": ("B", "T", "H", "dh"),
    "blocks.{l}.attn.hook_k_normed": ("B", "T", "H", "dh"),
    "blocks.{l}.attn.hook_rot_q": ("B", "T", "H", "dh"),
    "blocks.{l}.attn.hook_rot_k": ("B", "T", "H", "dh"),
    "blocks.{l}.attn.hook_attn_scores": ("B", "H", "T", "T"),
    "blocks.{l}.attn.hook_pattern": ("B", "H", "T", "T"),
    "blocks.{l}.attn.hook_z": ("B", "T", "H", "dh"),
    "blocks.{l}.attn.hook_result": ("B", "T", "H", "d"),
    "blocks.{l}.hook_attn_out": ("B", "T", "d"),
    "blocks.{l}.hook_resid_mid": ("B", "T", "d"),
    "blocks.{l}.ln2.hook_scale": ("B", "T", 1),
    "blocks.{l}.ln2.hook_normalized": ("B", "T", "d"),
    "blocks.{l}.mlp.hook_pre": ("B", "T", "ff"),
    "blocks.{l}.mlp.hook_pre_linear": ("B", "T", "ff"),
    "blocks.{l}.mlp.hook_post": ("B", "T", "ff"),
    "blocks.{l}.hook_mlp_out": ("B", "T", "d"),
    "blocks.{l}.hook_resid_post": ("B", "T", "d"),
    "ln_final.hook_scale": ("B", "T", 1),
    "ln_final.hook_normalized": ("B", "T", "d"),
    "unembed.hook_out": ("B", "T", "V"),
}
# Input hooks, firing only with TransformerLens' flags (split qkv and attn_in exclude each other).
FLAGGED_HOOK_SHAPES = {
    "blocks.{l}.hook_q_input": ("B", "T", "H", "d"),
    "blocks.{l}.hook_k_input": ("B", "T", "H", "d"),
    "blocks.{l}.hook_v_input": ("B", "T", "H", "d"),
    "blocks.{l}.hook_attn_in": ("B", "T", "H", "d"),
    "blocks.{l}.hook_mlp_in": ("B", "T", "d"),
}


def test_every_hook_present_with_its_shape(tiny_model):
    B, T = 2, 11
    sizes = {"B": B, "T": T, "d": TINY.d_model, "H": TINY.n_head, "dh": TINY.d_head, "ff": TINY.d_ff,
             "V": TINY.vocab_size}
    def expand(shapes):
        return {name.format(l=l): tuple(sizes.get(s, s) for s in shape) for name, shape in shapes.items()
                for l in (range(TINY.n_layer) if "{l}" in name else [None])}

    expected, flagged = expand(HOOK_SHAPES), expand(FLAGGED_HOOK_SHAPES)
    assert set(tiny_model.hook_dict) == set(expected) | set(flagged)
    tokens = torch.randint(0, TINY.vocab_size, (B, T))
    _, cache = tiny_model.run_with_cache(tokens, names_filter=lambda name: True)
    assert {k: tuple(v.shape) for k, v in cache.cache_dict.items()} == expected  # flags off: no input hooks
    tiny_model.set_use_hook_mlp_in(True)
    for setter, names in (("set_use_split_qkv_input", ("q_input", "k_input", "v_input")), ("set_use_attn_in", ("attn_in",))):
        getattr(tiny_model, setter)(True)
        _, cache = tiny_model.run_with_cache(tokens, names_filter=lambda name: True)
        want = {**expected, **{k: v for k, v in flagged.items() if k.endswith(names + ("mlp_in",))}}
        # issue 23.6: the input hooks also under TransformerLens 4's names (blocks.{l}.attn.hook_q_input)
        want.update({k.replace(".hook_", ".attn.hook_"): v for k, v in flagged.items() if k.endswith(names)})
        assert {k: tuple(v.shape) for k, v in cache.cache_dict.items()} == want
        getattr(tiny_model, setter)(False)


def test_cached_activations_are_consistent(tiny_model):
    tokens = torch.randint(0, TINY.vocab_size, (2, 20))
    logits, cache = tiny_model.run_with_cache(tokens, names_filter=lambda name: True)
    c = cache.cache_dict
    for l in range(TINY.n_layer):
        assert torch.allclose(c[f"blocks.{l}.hook_resid_mid"],
                              c[f"blocks.{l}.hook_resid_pre"] + c[f"blocks.{l}.hook_attn_out"])
        assert torch.allclose(c[f"blocks.{l}.attn.hook_result"].sum(2), c[f"blocks.{l}.hook_attn_out"], atol=1e-6)
        scale = c[f"blocks.{l}.ln1.hook_scale"]
        x = c[f"blocks.{l}.hook_resid_pre"]
        assert torch.allclose(scale, x.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt())
        assert torch.allclose(c[f"blocks.{l}.ln1.hook_normalized"], x / scale)
        post = c[f"blocks.{l}.mlp.hook_post"]
        assert torch.allclose(post, F.silu(c[f"blocks.{l}.mlp.hook_pre"]) * c[f"blocks.{l}.mlp.hook_pre_linear"])
    assert torch.equal(c["unembed.hook_out"], logits)
    assert torch.equal(c["hook_embed"], c["blocks.0.hook_resid_pre"])


def test_pattern_rows_sum_to_one_and_are_causal(tiny_model):
    _, cache = tiny_model.run_with_cache(torch.randint(0, TINY.vocab_size, (2, 25)),
                                         names_filter=lambda n: n.endswith("hook_pattern"))
    for l in range(TINY.n_layer):
        pattern = cache[f"blocks.{l}.attn.hook_pattern"]
        assert torch.allclose(pattern.sum(-1), torch.ones(pattern.shape[:-1]), atol=1e-6)
        upper = torch.ones(25, 25, dtype=torch.bool).triu(1)
        assert torch.all(pattern[..., upper] == 0)


def test_the_two_attention_paths_agree(tiny_model):
    tokens = torch.randint(0, TINY.vocab_size, (3, TINY.context))
    fast = tiny_model(tokens)
    slow = tiny_model.run_with_hooks(tokens, fwd_hooks=[(lambda n: n.endswith("hook_pattern"), lambda x, hook: x)])
    assert (fast - slow).abs().max().item() <= 1e-5


def test_hooks_do_not_change_logits(tiny_model):
    tokens = torch.randint(0, TINY.vocab_size, (2, 33))
    plain = tiny_model(tokens)
    hooked = tiny_model.run_with_hooks(tokens, fwd_hooks=[(lambda n: True, lambda x, hook: x)])
    assert (plain - hooked).abs().max().item() <= 1e-5


@pytest.mark.parametrize("name", ["blocks.0.ln1.hook_normalized", "blocks.0.attn.hook_rot_k",
                                  "blocks.0.attn.hook_pattern", "blocks.1.attn.hook_result",
                                  "blocks.0.mlp.hook_post", "blocks.1.hook_resid_mid", "ln_final.hook_scale"])
def test_an_edit_at_a_hook_changes_everything_downstream(tiny_model, name):
    tokens = torch.randint(0, TINY.vocab_size, (1, 12))
    clean, cache = tiny_model.run_with_cache(tokens)

    def perturb(x, hook):
        return x * 1.5 if "pattern" not in name else torch.flip(x, dims=[1])  # swap heads' patterns

    edited = tiny_model.run_with_hooks(tokens, fwd_hooks=[(name, perturb)])
    assert (edited - clean).abs().max().item() > 1e-3
    after = tiny_model(tokens)  # the hook is gone afterwards
    assert (after - clean).abs().max().item() <= 1e-5


def test_zeroing_a_head_through_hook_z_equals_zeroing_its_weights(tiny_model):
    tokens = torch.randint(0, TINY.vocab_size, (2, 16))

    def kill_head_1(z, hook):
        z[:, :, 1] = 0
        return z

    hooked = tiny_model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.attn.hook_z", kill_head_1)])
    dh = TINY.d_head
    with torch.no_grad():
        tiny_model.blocks[0].attn.proj.weight[:, dh:2 * dh] = 0
        direct = tiny_model(tokens)
    assert (hooked - direct).abs().max().item() <= 1e-5


def test_hooks_are_removed_even_when_the_forward_raises(tiny_model):
    def boom(x, hook):
        raise RuntimeError("user hook failed")

    with pytest.raises(RuntimeError, match="user hook failed"):
        tiny_model.run_with_hooks(torch.randint(0, 256, (1, 5)), fwd_hooks=[("blocks.1.hook_resid_mid", boom)])
    assert not any(hp.fwd_hooks or hp._forward_hooks for hp in tiny_model.hook_dict.values())
    tiny_model(torch.randint(0, 256, (1, 5)))  # and the model still runs


def test_loss_and_loss_mask_follow_model_py(tiny_model):
    g = torch.Generator().manual_seed(4)
    x = torch.randint(0, 256, (2, 10), generator=g)
    y = torch.randint(0, 256, (2, 10), generator=g)
    logits, loss = tiny_model(x, return_type="both", targets=y)
    per_token = F.cross_entropy(logits.view(-1, 256), y.view(-1), reduction="none")
    assert loss.item() == pytest.approx(per_token.mean().item(), rel=1e-6)
    mask = torch.zeros(2, 10)
    mask[0, 3:7] = 1
    masked = tiny_model(x, return_type="loss", targets=y, loss_mask=mask)
    assert masked.item() == pytest.approx(per_token.view(2, 10)[0, 3:7].mean().item(), rel=1e-6)
    nothing = tiny_model(x, return_type="loss", targets=y, loss_mask=torch.zeros(2, 10))
    assert nothing.item() == 0


def test_run_with_cache_with_targets_returns_the_loss(tiny_model):
    x = torch.randint(0, 256, (1, 8))
    (logits, loss), cache = tiny_model.run_with_cache(x, "both", targets=x)
    assert loss is not None and logits.shape == (1, 8, 256) and len(cache.cache_dict) > 0


def test_rope_preserves_length_and_depends_on_distance_only():
    cos, sin = rope_tables(16, 200, 10000.0)
    g = torch.Generator().manual_seed(5)
    q, k = torch.randn(1, 1, 1, 16, generator=g), torch.randn(1, 1, 1, 16, generator=g)

    def at(x, pos):
        return apply_rope(x, cos[pos:pos + 1], sin[pos:pos + 1])

    assert torch.allclose(at(q, 77).norm(), q.norm())
    scores = [(at(q, m) * at(k, n)).sum().item() for m, n in [(5, 2), (105, 102), (190, 187)]]
    assert scores == pytest.approx([scores[0]] * 3, abs=1e-4)
    assert (at(q, 5) * at(k, 4)).sum().item() != pytest.approx(scores[0], abs=1e-3)


def test_bad_token_input_is_named(tiny_model):
    with pytest.raises(ValueError, match="token id 256 is out of range for a vocabulary of 256"):
        tiny_model(torch.tensor([[1, 256]]))
    with pytest.raises(ValueError, match="65 tokens is longer than the model's context of 64"):
        tiny_model(torch.zeros(1, 65, dtype=torch.long))
    with pytest.raises(TypeError, match="integer tensor, got dtype torch.float32"):
        tiny_model(torch.zeros(1, 4))
    with pytest.raises(ValueError, match="shape \\[batch, pos\\], got shape \\(1, 2, 3\\)"):
        tiny_model(torch.zeros(1, 2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="no tokenizer"):
        tiny_model("some text")


def test_generate_follows_the_sampler(tiny_model):
    torch.manual_seed(0)
    out = tiny_model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=5, top_k=1)
    assert out.shape == (1, 8) and torch.equal(out[:, :3], torch.tensor([[1, 2, 3]]))
    # top_k=1 is greedy: each new token is the argmax given what came before
    for t in range(3, 8):
        logits = tiny_model(out[:, :t])
        assert logits[0, -1].argmax().item() == out[0, t].item()


def test_stop_at_layer_runs_only_the_blocks_asked_for(tiny_model):
    tokens = torch.randint(0, TINY.vocab_size, (2, 9))
    _, full = tiny_model.run_with_cache(tokens)
    calls = []
    tiny_model.blocks[1].register_forward_pre_hook(lambda m, a: calls.append(1))
    resid, cache = tiny_model.run_with_cache(tokens, names_filter="blocks.0.hook_resid_post", stop_at_layer=1)
    assert calls == []  # block 1 never ran
    assert torch.allclose(resid, full["blocks.1.hook_resid_pre"], atol=1e-6)
    assert torch.allclose(cache["blocks.0.hook_resid_post"], full["blocks.1.hook_resid_pre"], atol=1e-6)
    with pytest.raises(ValueError, match=r"stop_at_layer must be in -2..2 \(negative counts from the end\), got 3"):
        tiny_model(tokens, stop_at_layer=3)


def test_run_with_cache_into_fills_preallocated_buffers(tiny_model):
    tokens = torch.randint(0, TINY.vocab_size, (2, 9))
    _, cache = tiny_model.run_with_cache(tokens)
    buffers = {"blocks.0.hook_resid_post": torch.full((4, 20, TINY.d_model), float("nan"))}
    tiny_model.run_with_cache_into(tokens, buffers)
    assert torch.allclose(buffers["blocks.0.hook_resid_post"][:2, :9], cache["blocks.0.hook_resid_post"], atol=1e-6)
    assert torch.isnan(buffers["blocks.0.hook_resid_post"][2:]).all()
    with pytest.raises(ValueError, match="no hook points named \\['blocks.9.hook_z'\\]"):
        tiny_model.run_with_cache_into(tokens, {"blocks.9.hook_z": torch.zeros(1)})


def test_run_with_cache_incl_bwd_caches_the_loss_gradients(tiny_model):
    x = torch.randint(0, TINY.vocab_size, (2, 10))
    (logits, loss), cache = tiny_model.run_with_cache(x, "both", targets=x, incl_bwd=True, names_filter="blocks.0.hook_resid_post")
    # the same gradient by hand: d loss / d resid_post of block 0
    store = {}

    def keep(t, hook):
        t.retain_grad()
        store["resid"] = t

    tiny_model.zero_grad()
    loss2 = tiny_model.run_with_hooks(x, "loss", targets=x, fwd_hooks=[("blocks.0.hook_resid_post", keep)])
    loss2.backward()
    assert torch.allclose(cache["blocks.0.hook_resid_post_grad"], store["resid"].grad, atol=1e-7)
    assert loss.item() == pytest.approx(loss2.item())
    with pytest.raises(ValueError, match="return_type=.loss."):
        tiny_model.run_with_cache(x, incl_bwd=True)
    assert not any(hp._forward_hooks or hp._backward_hooks for hp in tiny_model.hook_dict.values())
