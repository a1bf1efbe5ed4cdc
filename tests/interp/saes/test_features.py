"""Feature reports against brute force: every latent's activations on every token, computed at once."""
import pytest
import torch
import torch.nn.functional as F

import interp
from interp.saes.features import clamp_effect, feature_report, logit_effects

LAST = "blocks.1.hook_resid_post"


@pytest.fixture
def sae(tiny_cfg):
    sae = interp.SAE(tiny_cfg.d_model, 96, kind="topk", k=6, hook_name="blocks.0.hook_resid_post", seed=4)
    with torch.no_grad():
        sae.b_enc.copy_(torch.randn(96, generator=torch.Generator().manual_seed(0)))
    return sae


@pytest.fixture
def rows():
    g = torch.Generator().manual_seed(8)
    return [torch.randint(0, 256, (n,), generator=g) for n in (64, 64, 40, 17)]


def all_acts(model, sae, rows):
    out = []
    with torch.no_grad():
        for r in rows:
            _, cache = model.run_with_cache(r[None], names_filter=sae.hook_name)
            out.append(sae.encode(cache[sae.hook_name])[0])
    return out


def test_report_equals_brute_force(tiny_model, sae, rows):
    rep = feature_report(tiny_model, sae, rows, n_show=10, n_examples=3, before=4, after=2, batch_size=3)
    acts = all_acts(tiny_model, sae, rows)
    flat = torch.cat(acts)
    on = flat > 0
    t = rep.table
    assert list(t.latent) == list(range(96))
    torch.testing.assert_close(torch.tensor(t.density.values), on.float().mean(0))
    mean = torch.where(on.any(0), (flat * on).sum(0) / on.sum(0).clamp_min(1), 0)
    torch.testing.assert_close(torch.tensor(t.mean_act.values), mean)
    torch.testing.assert_close(torch.tensor(t.max_act.values), flat.max(0).values)
    shown = t.latent[t.shown].tolist()
    assert len(shown) == min(10, int(on.any(0).sum())) >= 5 and all(t.summary[j].startswith("fires on") for j in shown)
    for j in shown:
        ctx = rep.contexts[rep.contexts.latent == j]
        top3 = flat[:, j].topk(3).values
        peaks = ctx[ctx.offset == 0].sort_values("example")
        torch.testing.assert_close(torch.tensor(peaks.activation.values, dtype=torch.float32), top3[: len(peaks)])
        # each context's activations are its row's, token by token, around the example's peak
        got = torch.tensor([float(acts[r][p, j]) for r, p in zip(ctx.row, ctx.pos)])
        torch.testing.assert_close(torch.tensor(ctx.activation.values, dtype=torch.float32), got)
        assert ctx.offset.min() >= -4 and ctx.offset.max() <= 2
        hist = rep.histograms[rep.histograms.latent == j]
        assert hist["count"].sum() == int(on[:, j].sum())
        inside = flat[on[:, j], j]
        assert ((inside[:, None] >= torch.tensor(hist.lo.values)) & (inside[:, None] <= torch.tensor(hist.hi.values))).any(1).all()


def test_logit_effects_are_the_decoder_through_the_raw_final_norm_and_head(tiny_model, sae):
    eff = logit_effects(tiny_model, sae, k=5)
    with torch.no_grad():  # the model.py modules, not the folded W_U
        full = F.linear(sae.W_dec * tiny_model.norm.weight, tiny_model.head.weight)
    for direction, largest in (("top", True), ("bottom", False)):
        part = eff[eff.direction == direction].sort_values(["latent", "rank"])
        vals, ids = full.topk(5, dim=-1, largest=largest)
        torch.testing.assert_close(torch.tensor(part.effect.values, dtype=torch.float32), vals.reshape(-1))
        assert part.token.tolist() == ids.reshape(-1).tolist()


def test_clamping_equals_a_hand_written_edit_and_follows_the_logit_effects(tiny_model, tiny_cfg, rows):
    sae = interp.SAE(tiny_cfg.d_model, 32, kind="topk", k=4, hook_name=LAST, seed=1)
    latent, value = 3, 40.0
    got = clamp_effect(tiny_model, sae, latent, rows[:2], value=value, k=5)

    def hand(x, hook):
        f = sae.encode(x)[..., latent]
        return x + (value - f)[..., None] * sae.W_dec[latent]

    with torch.no_grad():
        ids = torch.stack(rows[:2])
        clean = F.log_softmax(tiny_model(ids, return_type="logits"), -1)
        edited = F.log_softmax(tiny_model.run_with_hooks(ids, fwd_hooks=[(LAST, hand)], return_type="logits"), -1)
    want = (edited - clean)[..., torch.tensor(got.token.values)].mean((0, 1))
    torch.testing.assert_close(torch.tensor(got.delta_logprob.values, dtype=torch.float32), want, rtol=1e-4, atol=1e-5)
    # after the last block the only effect is direct: promoted tokens gain, suppressed ones lose
    assert got[got.direction == "top"].delta_logprob.min() > got[got.direction == "bottom"].delta_logprob.max()


def test_bad_latents_are_refused(tiny_model, sae, rows):
    with pytest.raises(ValueError, match="latent 96 is out of range"):
        feature_report(tiny_model, sae, rows, latents=[96])
    with pytest.raises(ValueError, match="latent -1 is out of range"):
        clamp_effect(tiny_model, sae, -1, rows)
