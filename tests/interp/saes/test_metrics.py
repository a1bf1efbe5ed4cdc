"""sae_metrics against the same quantities computed by hand, one window at a time."""
import math

import pytest
import torch
import torch.nn.functional as F

import interp
import sprout
from sprout.names import act_name

from .test_splice import LN2, MLP_OUT, RESID, HandSAE


def hand_metrics(model, sae, rows, target, source):
    """Every metric from plain forwards and explicit hooks, one row at a time, in float64."""
    xs, recs, acts, ce, kl = [], [], [], {"clean": [], "spliced": [], "zero": []}, {"spliced": [], "zero": []}
    for ids in rows:
        ids = ids[None]
        with torch.no_grad():
            clean_logits, cache = model.run_with_cache(ids, names_filter=[target, source])
            f = torch.relu(cache[source] @ sae.W_enc + sae.b_enc)
            rec = f @ sae.W_dec + sae.b_dec
            if source == target:
                spliced = model.run_with_hooks(ids, fwd_hooks=[(target, lambda x, hook: rec)])
            else:
                spliced = model.run_with_hooks(ids, fwd_hooks=[(source, lambda x, hook: None), (target, lambda x, hook: rec)])
            zero = model.run_with_hooks(ids, fwd_hooks=[(target, lambda x, hook: torch.zeros_like(x))])
        xs.append(cache[target][0].double()), recs.append(rec[0].double()), acts.append(f[0])
        for name, lg in (("clean", clean_logits), ("spliced", spliced), ("zero", zero)):
            ce[name].append(F.cross_entropy(lg[0, :-1].double(), ids[0, 1:], reduction="none"))
            if name != "clean":
                p = F.log_softmax(clean_logits[0].double(), -1)
                kl[name].append((p.exp() * (p - F.log_softmax(lg[0].double(), -1))).sum(-1))
    x, rec, f = torch.cat(xs), torch.cat(recs), torch.cat(acts)
    fvu = (x - rec).pow(2).sum() / (x - x.mean(0)).pow(2).sum()
    ce = {k: torch.cat(v).mean().item() for k, v in ce.items()}
    freq = (f > 0).double().mean(0)
    return dict(fvu=fvu.item(), l0=(f > 0).sum(-1).double().mean().item(), dead_fraction=(freq == 0).double().mean().item(),
                dense_fraction=(freq > 0.1).double().mean().item(), ce_clean=ce["clean"], ce_spliced=ce["spliced"],
                ce_zero=ce["zero"], ce_loss_recovered=(ce["zero"] - ce["spliced"]) / (ce["zero"] - ce["clean"]),
                kl_spliced=torch.cat(kl["spliced"]).mean().item(), kl_zero=torch.cat(kl["zero"]).mean().item(),
                n_tokens=len(x))


@pytest.fixture
def rows():
    g = torch.Generator().manual_seed(4)
    return [torch.randint(0, 256, (n,), generator=g) for n in (20, 20, 13, 64, 7)]


@pytest.mark.parametrize("kind", ["sae", "transcoder"])
def test_metrics_equal_a_hand_computation(tiny_model, tiny_cfg, rows, kind):
    if kind == "sae":
        sae, target, source = HandSAE(tiny_cfg.d_model, 128, RESID), RESID, RESID
    else:
        sae, target, source = HandSAE(tiny_cfg.d_model, 128, LN2, MLP_OUT), MLP_OUT, LN2
    with torch.no_grad():
        sae.b_enc[:16], sae.b_enc[16:24] = -100.0, 100.0  # some latents dead, some dense
    ours = interp.sae_metrics(tiny_model, sae, rows, batch_size=2)
    assert len(ours) == 1 and ours.kind[0] == kind and ours.hook_out[0] == target
    hand = hand_metrics(tiny_model, sae, rows, target, source)
    for key, value in hand.items():
        if key == "ce_loss_recovered":  # a ratio of small differences on a random model: checked below
            continue
        assert ours[key][0] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    assert ours.explained_variance[0] == pytest.approx(1 - hand["fvu"], rel=1e-4)
    gap = ours.ce_zero[0] - ours.ce_clean[0]
    assert ours.ce_loss_recovered[0] == pytest.approx((ours.ce_zero[0] - ours.ce_spliced[0]) / gap, rel=1e-9)
    assert 16 / 128 <= hand["dead_fraction"] < 1 and 8 / 128 <= hand["dense_fraction"] < 1


def test_a_perfect_dictionary_recovers_everything(tiny_model, tiny_cfg, rows):
    """An SAE whose decoder inverts its encoder on the positive and negative halves: x = relu(x) - relu(-x)."""
    d = tiny_cfg.d_model
    sae = HandSAE(d, 2 * d, RESID)
    with torch.no_grad():
        eye = torch.eye(d)
        sae.W_enc.copy_(torch.cat([eye, -eye], 1)), sae.b_enc.zero_()
        sae.W_dec.copy_(torch.cat([eye, -eye], 0)), sae.b_dec.zero_()
    m = interp.sae_metrics(tiny_model, sae, rows)
    assert m.fvu[0] == pytest.approx(0, abs=1e-9) and m.ce_loss_recovered[0] == pytest.approx(1, abs=1e-4)
    assert m.kl_spliced[0] == pytest.approx(0, abs=1e-6) and m.kl_zero[0] > 0


def test_padding_counts_in_nothing(tiny_model, tiny_cfg, rows):
    sae = HandSAE(tiny_cfg.d_model, 64, RESID)
    short = rows[:3]
    width = max(len(r) for r in short)
    ids = torch.zeros(len(short), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(short):  # right-, left- and un-padded rows
        at = width - len(r) if i == 2 else 0
        ids[i, at:at + len(r)], mask[i, at:at + len(r)] = r, 1
    padded = interp.sae_metrics(tiny_model, sae, ids, attention_mask=mask)
    plain = interp.sae_metrics(tiny_model, sae, short, batch_size=1)
    assert padded.n_tokens[0] == plain.n_tokens[0] == sum(len(r) for r in short)
    for key in ("fvu", "l0", "ce_clean", "ce_spliced", "ce_zero", "kl_spliced", "dead_fraction"):
        assert padded[key][0] == pytest.approx(plain[key][0], rel=1e-4, abs=1e-6), key


def test_bad_input_is_refused(tiny_model, tiny_cfg, rows):
    sae = HandSAE(tiny_cfg.d_model, 64, RESID)
    with pytest.raises(ValueError, match="no hook point"):
        interp.sae_metrics(tiny_model, HandSAE(tiny_cfg.d_model, 8, "blocks.7.hook_resid_post"), rows)
    with pytest.raises(ValueError, match="attention_mask has shape"):
        interp.sae_metrics(tiny_model, sae, torch.zeros(2, 8, dtype=torch.long), attention_mask=torch.ones(2, 7))
    with pytest.raises(ValueError, match="no real"):
        interp.sae_metrics(tiny_model, sae, torch.zeros(2, 8, dtype=torch.long), attention_mask=torch.zeros(2, 8))
    with pytest.raises(ValueError, match="d_in=32"):
        interp.sae_metrics(tiny_model, HandSAE(32, 8, RESID), rows)
    nan = HandSAE(tiny_cfg.d_model, 8, RESID)
    with torch.no_grad():
        nan.b_enc[0] = math.nan
    with pytest.raises(ValueError, match="NaN"):
        interp.sae_metrics(tiny_model, nan, rows)


def test_dead_fractions_equal_sae_metrics_on_the_same_tokens():
    model = sprout.load("gpt-1").eval()
    d = int(model.cfg.d_model)
    sae = interp.SAE(d, 64, kind="topk", k=4, hook_name=act_name("resid_post", 0), seed=1)
    tc = interp.Transcoder(d, 48, d, kind="topk", k=3, layer=0, seed=2)
    with torch.no_grad():
        sae.b_enc[:20] -= 1e3  # never in the top k: dead
        tc.b_enc[:6] += 1e3  # 3 of these 6 are each token's top 3: the other 42 never fire
    text = interp.held_out_stories(3_000, seed=9)
    dead, n = interp.saes.dead_fractions(model, [sae, tc], text)
    ids = interp.data.stream_windows(model, text)
    assert n == ids.numel()
    for got, d_ in zip(dead, (sae, tc)):
        assert got == pytest.approx(float(interp.sae_metrics(model, d_, ids).iloc[0].dead_fraction), abs=1e-12)
    assert dead[0] >= 20 / 64 and 42 / 48 <= dead[1] <= 45 / 48


def test_dead_fractions_count_an_mlps_skip_and_skipless_transcoders_together(tiny_model):
    """The shipping run counts both transcoders of each MLP from one forward: nothing is spliced, so two
    dictionaries on one hook are allowed here (splicing refuses them), each counted as if alone."""
    d = int(tiny_model.cfg.d_model)
    with_skip = interp.Transcoder(d, 32, d, kind="topk", k=2, layer=0, skip=True, seed=3)
    without = interp.Transcoder(d, 24, d, kind="topk", k=2, layer=0, seed=4)
    with torch.no_grad():
        without.b_enc[:4] += 1e3  # these 4 hold each token's top 2: the other 20 are dead
    ids = torch.randint(0, int(tiny_model.cfg.d_vocab), (4, 16))
    both, _ = interp.saes.dead_fractions(tiny_model, [with_skip, without], ids)
    alone = [interp.saes.dead_fractions(tiny_model, [t], ids)[0][0] for t in (with_skip, without)]
    assert both == alone and 20 / 24 <= both[1] <= 22 / 24
    with pytest.raises(ValueError, match="splice one dictionary per hook"):
        with interp.spliced(tiny_model, [with_skip, without]):
            pass


def window_sums(model, sae, rows, target, source, ablate):
    """Each row's summed next-token CE, clean / spliced / ablated (the target replaced by `ablate(x)`), by hand."""
    out = []
    for ids in rows:
        ids = ids[None]
        with torch.no_grad():
            clean, cache = model.run_with_cache(ids, names_filter=[source])
            rec = sae.decode(sae.encode(cache[source]))
            spliced = model.run_with_hooks(ids, fwd_hooks=[(target, lambda x, hook: rec)])
            ablated = model.run_with_hooks(ids, fwd_hooks=[(target, lambda x, hook: ablate(x))])
        out.append([F.cross_entropy(lg[0, :-1].double(), ids[0, 1:], reduction="sum").item()
                    for lg in (clean, spliced, ablated)])
    return torch.tensor(out, dtype=torch.float64).T


def jackknife_se(a, b):
    """The leave-one-window-out jackknife standard error of sum(a) / sum(b): an estimator of its own."""
    w = len(a)
    r = (a.sum() - a) / (b.sum() - b)
    return float(((r - r.mean()).pow(2).sum() * (w - 1) / w).sqrt())


def test_ce_recovered_standard_errors_match_a_hand_count_and_the_jackknife(tiny_model, tiny_cfg):
    """The delta-method standard errors over windows equal the formula on hand-counted window sums and agree
    with the jackknife, an estimator of its own. A residual SAE: zeroing or mean-ablating the random model's
    residual stream costs nats, where its MLP's output moves the loss by hundredths and the ratio is noise
    (the standard errors are computed from the losses alone, the same for either kind of dictionary)."""
    g = torch.Generator().manual_seed(11)
    rows = [torch.randint(0, 256, (24,), generator=g) for _ in range(48)]
    target = source = RESID
    sae = HandSAE(tiny_cfg.d_model, 64, source)
    fit = interp.saes.baselines.fit_baselines(tiny_model, sae, rows[:8])
    m = interp.sae_metrics(tiny_model, sae, rows, batch_size=5, baselines=True, baseline_fit=fit).iloc[0]
    for col, ablate in (("ce_loss_recovered", torch.zeros_like), ("ce_loss_recovered_mean", lambda x: fit.mean.to(x).expand_as(x))):
        clean, spliced, ablated = window_sums(tiny_model, sae, rows, target, source, ablate)
        a, b = ablated - spliced, ablated - clean
        r = float(a.sum() / b.sum())
        hand = float(((a - r * b).pow(2).sum() * 48 / 47).sqrt() / b.sum().abs())
        assert m[col] == pytest.approx(r, rel=1e-4), col
        assert m[f"{col}_se"] == pytest.approx(hand, rel=1e-3), col
        assert m[f"{col}_se"] == pytest.approx(jackknife_se(a, b), rel=0.1), col
        assert m[f"{col}_se"] > 0


def test_ce_recovered_standard_error_shrinks_with_more_windows_and_needs_two(tiny_model, tiny_cfg, rows):
    sae = HandSAE(tiny_cfg.d_model, 64, RESID)
    once = interp.sae_metrics(tiny_model, sae, rows).iloc[0]
    thrice = interp.sae_metrics(tiny_model, sae, rows * 3).iloc[0]  # the same windows three times over
    w = len(rows)
    assert thrice.ce_loss_recovered == pytest.approx(once.ce_loss_recovered, rel=1e-3)  # float32 sums, batched otherwise
    assert thrice.ce_loss_recovered_se == pytest.approx(once.ce_loss_recovered_se * math.sqrt((w - 1) / (3 * w - 1)), rel=1e-3)
    assert math.isnan(interp.sae_metrics(tiny_model, sae, rows[3:4]).iloc[0].ce_loss_recovered_se)  # one window: no spread
    lone = interp.sae_metrics(tiny_model, sae, rows + [torch.tensor([5])] * 30).iloc[0]  # windows that predict nothing
    assert lone.n_predictions == once.n_predictions
    assert lone.ce_loss_recovered_se == pytest.approx(once.ce_loss_recovered_se, rel=1e-3)  # are no sampled units
