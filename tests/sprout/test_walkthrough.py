"""The walkthrough's character GPT: the seed's parameter counts, equality with a plain implementation of
its equations, loading its own state dicts, hooks, dropout, configs and our own checkpoints."""
import json
import re

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from sprout.config import STEPS
from sprout.files.walkthrough_keys import from_walkthrough_state_dict, infer_config, to_walkthrough_state_dict
from sprout.tokenizer import char_tokenizer
from sprout.walkthrough import (
    WalkthroughConfig,
    WalkthroughGPT,
    build_step,
    missing_hooks,
    step_config,
)
from tests.conftest import randomize_gains

# The seed's table (C 32, 4 heads, context 8, 65 characters), and karpathy's 10.788929M for the final size.
PARAMS = {"4.2": 8_609, "4.4": 16_961, "4.6": 41_921, "4.7": 41_921, "4.8": 48_257, "4.9": 42_305,
          "4.10": 42_369, "final": 10_788_929}
TOY_STEPS = [s for s in STEPS if s != "final"]
# The final script's architecture (dropout, LayerNorms, 4C ReLU) at a size a test can afford.
SMALL_FINAL = dict(context=16, d_model=48, n_head=3, n_layer=2)


def make(step: str, seed: int = 0, **overrides) -> WalkthroughGPT:
    torch.manual_seed(seed)
    if step == "final":
        overrides = {**SMALL_FINAL, **overrides}
    return randomize_gains(build_step(step, **overrides), seed).eval()


def tokens(model, batch=2, T=None, seed=1):
    T = T or model.config.context
    return torch.randint(0, model.config.vocab_size, (batch, T), generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------- the walkthrough's side


def walkthrough_keys(model: WalkthroughGPT) -> dict:
    """Our weights under the walkthrough's own names, renamed by hand, with its per-head mask buffers."""
    cfg = model.config
    renames = [(r"^embed\.", "token_embedding_table."), (r"^pos_embed\.", "position_embedding_table."),
               (r"^ln_final\.", "final_layer_norm."), (r"^unembed\.", "LM_head."),
               (r"\.attn\.", ".multi_head_attention."), (r"\.mlp\.", ".feed_forward."),
               (r"^blocks\.", "transformer_blocks.")]
    if not cfg.blocks:  # steps 4.2 and 4.4 keep attention and feed-forward on the model itself
        renames.append((r"^transformer_blocks\.0\.", ""))
    sd = {}
    for key, value in model.state_dict().items():
        for pattern, new in renames:
            key = re.sub(pattern, new, key)
        sd[key] = value.clone()
    for l in range(cfg.n_layer):
        prefix = f"transformer_blocks.{l}." if cfg.blocks else ""
        for h in range(cfg.n_head):
            sd[f"{prefix}multi_head_attention.heads.{h}.mask"] = torch.tril(torch.ones(cfg.context, cfg.context))
    return sd


def layer_norm(x, w, name):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return w[name + ".weight"] * (x - mean) / torch.sqrt(var + 1e-5) + w[name + ".bias"]


def linear(x, w, name):
    return x @ w[name + ".weight"].T + w[name + ".bias"]


def head(x, w, name, d_head):
    """One head, one query position at a time: scaled scores over the past, softmax, weighted values."""
    q, k, v = (x @ w[f"{name}.{p}.weight"].T for p in ("query", "key", "value"))
    out = torch.zeros_like(v)
    for t in range(x.size(1)):
        scores = (k[:, : t + 1] @ q[:, t, :, None])[..., 0] * d_head ** -0.5  # (B, t + 1)
        e = torch.exp(scores - scores.max(-1, keepdim=True).values)
        weights = e / e.sum(-1, keepdim=True)
        out[:, t] = (weights[..., None] * v[:, : t + 1]).sum(1)
    return out


def reference_logits(w: dict, cfg: WalkthroughConfig, idx: torch.Tensor) -> torch.Tensor:
    """The seed's equations on the walkthrough's keys, written out without our modules."""
    T = idx.size(1)
    x = w["token_embedding_table.weight"][idx] + w["position_embedding_table.weight"][torch.arange(T) % cfg.context]
    for l in range(cfg.n_layer):
        p = f"transformer_blocks.{l}." if cfg.blocks else ""
        h = layer_norm(x, w, p + "ln1") if cfg.layer_norm else x
        heads = [head(h, w, f"{p}multi_head_attention.heads.{i}", cfg.d_model // cfg.n_head) for i in range(cfg.n_head)]
        a = linear(torch.cat(heads, dim=-1), w, p + "multi_head_attention.projection")
        if cfg.extra_projections:
            a = linear(a, w, p + "attention_projection")
        x = x + a if cfg.residual else a
        if cfg.feed_forward:
            h = layer_norm(x, w, p + "ln2") if cfg.layer_norm else x
            f = linear(torch.clamp(linear(h, w, p + "feed_forward.fc1"), min=0), w, p + "feed_forward.fc2")
            if cfg.extra_projections:
                f = linear(f, w, p + "feedforward_projection")
            x = x + f if cfg.residual else f
    if cfg.final_layer_norm:
        x = layer_norm(x, w, "final_layer_norm")
    return linear(x, w, "LM_head")


# ----------------------------------------------------------------------------- sizes and equality


@pytest.mark.parametrize("step", list(PARAMS))
def test_parameter_counts_match_the_walkthrough(step):
    assert build_step(step).num_params() == PARAMS[step]


def test_final_step_is_the_final_script():
    c = step_config("final")
    assert (c.d_model, c.n_head, c.n_layer, c.context, c.dropout, c.vocab_size) == (384, 6, 6, 256, 0.2, 65)
    assert c.layer_norm and c.final_layer_norm and c.residual and c.feed_forward and not c.extra_projections


@pytest.mark.parametrize("step", TOY_STEPS + ["final"])
def test_forward_equals_the_seeds_equations(step):
    model = make(step)
    w, idx = walkthrough_keys(model), tokens(model)
    with torch.no_grad():
        expected = reference_logits(w, model.config, idx)
        plain = model(idx)
        cached, _ = model.run_with_cache(idx, names_filter=lambda n: True)  # the materialised pattern and per-head result path
        short = model(idx[:, :5])
    assert (plain - expected).abs().max().item() <= 1e-5
    assert (cached - expected).abs().max().item() <= 1e-5
    assert (short - expected[:, :5]).abs().max().item() <= 1e-5  # causal: a prefix sees nothing later


# ----------------------------------------------------------------------------- the walkthrough's state dicts


@pytest.mark.parametrize("step", TOY_STEPS + ["final"])
def test_loads_a_walkthrough_state_dict(step):
    model = make(step)
    sd = walkthrough_keys(model)
    assert set(to_walkthrough_state_dict(model)) == set(sd)
    # 4.6 and 4.7 have the same keys: residual connections leave no trace in the weights.
    config = model.config if step == "4.6" else None
    loaded = from_walkthrough_state_dict(sd, config=config)
    if config is None:
        assert loaded.config == WalkthroughConfig(**{**model.config.to_dict(), "dropout": 0.0})
    idx = tokens(model)
    with torch.no_grad():
        assert torch.equal(loaded(idx, return_type="logits"), model(idx, return_type="logits"))


def test_loads_the_final_scripts_checkpoint_file(tmp_path):
    model = make("final")
    path = tmp_path / "model_epoch_9900.pth"
    torch.save({"model_state_dict": walkthrough_keys(model), "optimizer_state_dict": {}, "epoch": 9900}, path)
    loaded = from_walkthrough_state_dict(path)
    idx = tokens(model)
    with torch.no_grad():
        assert torch.equal(loaded(idx, return_type="logits"), model(idx, return_type="logits"))


def test_bad_walkthrough_state_dicts_are_named():
    model = make("4.10")
    good = walkthrough_keys(model)

    missing = {k: v for k, v in good.items() if k != "transformer_blocks.1.feed_forward.fc1.bias"}
    with pytest.raises(ValueError, match=r"transformer_blocks\.1\.feed_forward\.fc1\.bias"):
        from_walkthrough_state_dict(missing)

    wrong = dict(good, **{"transformer_blocks.0.ln2.weight": torch.ones(31)})
    with pytest.raises(ValueError, match=r"transformer_blocks\.0\.ln2\.weight: expected \(32,\), found \(31,\)"):
        from_walkthrough_state_dict(wrong)

    not_causal = dict(good, **{"transformer_blocks.2.multi_head_attention.heads.3.mask": torch.ones(8, 8)})
    with pytest.raises(ValueError, match=r"heads\.3\.mask.*lower-triangular"):
        from_walkthrough_state_dict(not_causal)

    extra = dict(good, **{"transformer_blocks.0.attention_projectionx.weight": torch.ones(32, 32)})
    del extra["LM_head.bias"]
    with pytest.raises(ValueError) as error:  # one error lists every problem
        from_walkthrough_state_dict(extra)
    assert "transformer_blocks.0.attention_projectionx.weight: unexpected (found (32, 32))" in str(error.value)
    assert "LM_head.bias: missing (expected (65,))" in str(error.value)

    with pytest.raises(ValueError, match="no attention heads"):
        from_walkthrough_state_dict({k: v for k, v in good.items() if "multi_head_attention" not in k})

    with pytest.raises(ValueError, match="tokenizer has 3 characters.*65"):
        from_walkthrough_state_dict(good, tokenizer=char_tokenizer("abc"))


def test_vocabulary_rebuilt_from_the_training_text():
    text = "to be, or not to be\n"
    model = make("4.10", vocab_size=len(set(text)))
    loaded = from_walkthrough_state_dict(walkthrough_keys(model), text=text)
    ids = loaded.to_tokens("to be")
    assert ids.tolist() == [[sorted(set(text)).index(c) for c in "to be"]]  # the walkthrough's stoi
    assert loaded.to_string(ids[0]) == "to be"
    assert loaded.to_str_tokens("be") == ["b", "e"]
    out = loaded.generate("to", max_new_tokens=5)
    assert isinstance(out, str) and out.startswith("to") and len(out) == 7


# ----------------------------------------------------------------------------- hooks


def test_hooks_have_canonical_names_and_shapes():
    model = make("4.10")
    B, T, C, H, D, V = 2, 8, 32, 4, 8, 65
    _, cache = model.run_with_cache(tokens(model, B, T), names_filter=lambda n: True)
    expected = {"hook_embed": (B, T, C), "hook_pos_embed": (B, T, C), "ln_final.hook_scale": (B, T, 1),
                "ln_final.hook_normalized": (B, T, C), "unembed.hook_out": (B, T, V)}
    for l in range(3):
        b = f"blocks.{l}."
        expected.update({b + n: (B, T, C) for n in ("hook_resid_pre", "hook_attn_out", "hook_resid_mid",
                                                     "hook_mlp_out", "hook_resid_post", "ln1.hook_normalized",
                                                     "ln2.hook_normalized")})
        expected.update({b + "ln1.hook_scale": (B, T, 1), b + "ln2.hook_scale": (B, T, 1),
                         b + "attn.hook_q": (B, T, H, D), b + "attn.hook_k": (B, T, H, D),
                         b + "attn.hook_v": (B, T, H, D), b + "attn.hook_z": (B, T, H, D),
                         b + "attn.hook_attn_scores": (B, H, T, T), b + "attn.hook_pattern": (B, H, T, T),
                         b + "attn.hook_result": (B, T, H, C), b + "mlp.hook_pre": (B, T, 4 * C),
                         b + "mlp.hook_post": (B, T, 4 * C)})
    assert {k: tuple(v.shape) for k, v in cache.items()} == expected


def test_hook_values_mean_what_their_names_say():
    model = make("4.10")
    _, cache = model.run_with_cache(tokens(model), names_filter=lambda n: True)
    b = model.blocks[0]
    assert torch.allclose(cache["blocks.0.hook_resid_pre"], cache["hook_embed"] + cache["hook_pos_embed"])
    assert torch.allclose(cache["blocks.0.hook_resid_mid"],
                          cache["blocks.0.hook_resid_pre"] + cache["blocks.0.hook_attn_out"], atol=1e-6)
    assert torch.allclose(cache["blocks.0.attn.hook_result"].sum(2) + b.attn.projection.bias,
                          cache["blocks.0.hook_attn_out"], atol=1e-5)
    assert torch.equal(cache["blocks.0.mlp.hook_post"], cache["blocks.0.mlp.hook_pre"].clamp(min=0))
    resid = cache["blocks.0.hook_resid_mid"]
    centred = resid - resid.mean(-1, keepdim=True)
    assert torch.allclose(cache["blocks.0.ln2.hook_normalized"] * cache["blocks.0.ln2.hook_scale"], centred, atol=1e-5)


def test_pattern_rows_sum_to_one_and_are_causal():
    model = make("4.10")
    _, cache = model.run_with_cache(tokens(model))
    for l in range(3):
        pattern = cache[f"blocks.{l}.attn.hook_pattern"]
        assert torch.allclose(pattern.sum(-1), torch.ones(pattern.shape[:-1]), atol=1e-6)
        causal = torch.ones(8, 8, dtype=torch.bool).tril()
        assert (pattern[..., ~causal] == 0).all() and (pattern[..., causal] > 0).all()


def test_an_edit_at_a_hook_changes_only_what_comes_after():
    model = make("4.10")
    idx = tokens(model)
    with torch.no_grad():
        clean = model(idx)

        def ablate(z, hook):
            z[:, 5, 0] = 0  # head 0 of block 1, query position 5
            return z

        edited = model.run_with_hooks(idx, fwd_hooks=[("blocks.1.attn.hook_z", ablate)])
        same = model.run_with_hooks(idx, fwd_hooks=[("blocks.1.attn.hook_z", lambda z, hook: z)])
    assert torch.equal(edited[:, :5], clean[:, :5])
    assert (edited[:, 5] - clean[:, 5]).abs().max() > 1e-3
    assert torch.allclose(same, clean, atol=1e-5)


def test_steps_without_residuals_or_norms_lack_those_hooks():
    resid = [f"blocks.{l}.hook_resid_{w}" for l in range(3) for w in ("pre", "mid", "post")]
    norms = [f"blocks.{l}.ln{i}.hook_scale" for l in range(3) for i in (1, 2)] + ["ln_final.hook_scale"]
    assert missing_hooks(build_step("4.6"), resid + norms) == resid + norms
    assert missing_hooks(build_step("4.7"), resid + norms) == norms
    assert missing_hooks(build_step("4.9"), resid + norms) == ["ln_final.hook_scale"]
    assert missing_hooks(build_step("4.10"), resid + norms) == []
    assert missing_hooks(build_step("4.2"), ["blocks.0.mlp.hook_post", "blocks.0.attn.hook_pattern"]) == \
        ["blocks.0.mlp.hook_post"]
    assert missing_hooks(build_step("4.4"), "blocks.0.hook_mlp_out") == []


def test_stop_at_layer_returns_the_stream_entering_that_block():
    model = make("4.10")
    idx = tokens(model)
    _, cache = model.run_with_cache(idx)
    with torch.no_grad():
        resid = model(idx, stop_at_layer=2)
    assert torch.allclose(resid, cache["blocks.2.hook_resid_pre"], atol=1e-6)


# ----------------------------------------------------------------------------- training behaviour


def test_dropout_is_off_in_eval_and_on_in_train():
    model = make("final", dropout=0.5)
    idx = tokens(model)
    with torch.no_grad():
        a, b = model(idx, return_type="logits"), model(idx, return_type="logits")
        model.train()
        c, d = model(idx, return_type="logits"), model(idx, return_type="logits")
        _, cache = model.run_with_cache(idx)  # the materialised path drops attention weights too
    assert torch.equal(a, b)
    assert not torch.allclose(c, d) and not torch.allclose(c, a)
    assert not torch.allclose(cache["blocks.0.hook_attn_out"], cache["blocks.0.hook_attn_out"][[1, 0]])


def test_loss_is_mean_cross_entropy_with_an_optional_mask():
    model = make("4.10")
    idx, targets = tokens(model, seed=1), tokens(model, seed=2)
    mask = torch.zeros_like(targets)
    mask[:, 3:] = 1
    logits, loss = model(idx, return_type="both", targets=targets)
    masked = model(idx, return_type="loss", targets=targets, loss_mask=mask)
    per_token = F.cross_entropy(logits.reshape(-1, 65), targets.reshape(-1), reduction="none").view_as(targets)
    assert torch.allclose(loss, per_token.mean())
    assert torch.allclose(masked, per_token[:, 3:].mean())


# ----------------------------------------------------------------------------- configs and our checkpoints


def test_config_round_trips_and_rejects_bad_input():
    cfg = step_config("4.8", vocab_size=40)
    assert WalkthroughConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    with pytest.raises(ValueError, match="n_heads"):
        WalkthroughConfig.from_dict({**cfg.to_dict(), "n_heads": 4})
    with pytest.raises(ValueError, match="divisible"):
        WalkthroughConfig(d_model=30, n_head=4)
    with pytest.raises(ValueError, match="n_layer=1"):
        step_config("4.4", n_layer=3)
    with pytest.raises(ValueError, match="unknown walkthrough step"):
        step_config("4.5")
    with pytest.raises(ValueError, match="dropout"):
        WalkthroughConfig(dropout=1.0)


def test_transformer_lens_config_describes_each_step():
    for step, norm in (("4.7", None), ("4.9", "LN"), ("final", "LN")):
        cfg = step_config(step).transformer_lens_config()
        assert cfg.normalization_type == norm and cfg.act_fn == "relu" and not cfg.gated_mlp
        assert cfg.positional_embedding_type == "standard"
    model = build_step("4.2")
    assert model.cfg.attn_only and model.cfg.d_mlp == 128 and model.cfg.n_ctx == 8 and model.cfg.d_head == 8
    assert model.config.context == 8 and model.cfg.source is model.config  # the walkthrough's names
    assert WalkthroughGPT.family == "walkthrough"


@pytest.mark.parametrize("step", ["4.2", "4.8", "final"])
def test_own_checkpoint_round_trips(tmp_path, step):
    model = make(step)
    save_file(model.state_dict(), tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps({"family": model.family, **model.config.to_dict()}))
    d = json.loads((tmp_path / "config.json").read_text())
    assert d.pop("family") == "walkthrough"
    loaded = WalkthroughGPT(WalkthroughConfig.from_dict(d))
    loaded.load_state_dict(load_file(tmp_path / "model.safetensors"), strict=True)
    idx = tokens(model)
    with torch.no_grad():
        assert torch.equal(loaded.eval()(idx, return_type="logits"), model(idx, return_type="logits"))


def test_infer_config_reads_the_step_from_shapes():
    for step in ("4.2", "4.4", "4.8", "4.9"):
        sd = walkthrough_keys(build_step(step, vocab_size=20))
        assert infer_config(sd) == step_config(step, vocab_size=20)


@pytest.mark.parametrize("step", ["4.7", "4.9", "4.10"])
def test_final_norm_and_unembed_turn_the_last_stream_into_the_logits(step):
    """The logit lens's recipe: `ln_final` (an identity before step 4.10) then `unembed`."""
    model = make(step)
    logits, cache = model.run_with_cache(tokens(model))
    with torch.no_grad():
        assert torch.allclose(model.unembed(model.ln_final(cache["blocks.2.hook_resid_post"])), logits, atol=1e-5)


def test_sprout_save_and_load_round_trip(tmp_path):
    import sprout

    text = "to be, or not to be\n"
    model = make("4.10", vocab_size=len(set(text)))
    model.tokenizer = char_tokenizer(text)
    loaded = sprout.load(sprout.save(model, tmp_path / "ck"))
    assert type(loaded) is WalkthroughGPT and loaded.config == model.config
    assert json.loads((tmp_path / "ck" / "config.json").read_text())["family"] == "walkthrough"
    idx = tokens(model)
    with torch.no_grad():
        assert torch.equal(loaded(idx, return_type="logits"), model(idx, return_type="logits"))
    assert loaded.to_string(loaded.to_tokens("not to")[0]) == "not to"


def walkthrough_modules(cfg: WalkthroughConfig) -> torch.nn.Module:
    """Empty modules named and registered in the walkthrough's order (from the facts note), for init."""
    nn, C = torch.nn, cfg.d_model

    def attention():
        heads = nn.ModuleList()
        for _ in range(cfg.n_head):
            h = nn.Module()
            h.query, h.key, h.value = (nn.Linear(C, C // cfg.n_head, bias=False) for _ in range(3))
            heads.append(h)
        m = nn.Module()
        m.heads, m.projection = heads, nn.Linear(C, C)
        return m

    def feed_forward():
        m = nn.Module()
        m.fc1, m.fc2 = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)
        return m

    top = nn.Module()
    top.token_embedding_table, top.position_embedding_table = nn.Embedding(cfg.vocab_size, C), nn.Embedding(cfg.context, C)
    blocks = nn.ModuleList()
    for _ in range(cfg.n_layer):
        b = top if not cfg.blocks else nn.Module()
        b.multi_head_attention, b.feed_forward = attention(), feed_forward()
        if cfg.extra_projections:
            b.attention_projection, b.feedforward_projection = nn.Linear(C, C), nn.Linear(C, C)
        blocks.append(b)
    top.LM_head = nn.Linear(C, cfg.vocab_size)
    return top if not cfg.blocks else nn.ModuleDict({"top": top, "transformer_blocks": blocks})


@pytest.mark.parametrize("step", ["4.4", "4.8", "4.10"])
def test_a_seed_draws_the_walkthroughs_initial_weights(step):
    """PyTorch's default initialisation in the walkthrough's registration order: same seed, same weights."""
    cfg = step_config(step)
    torch.manual_seed(42)
    theirs = {k.removeprefix("top."): v for k, v in walkthrough_modules(cfg).state_dict().items()}
    torch.manual_seed(42)
    ours = walkthrough_keys(build_step(step))
    for key, value in theirs.items():
        assert torch.equal(ours[key], value), key
