"""The baselines a dictionary must beat (issue 38), on data whose answer is known, and inside sae_metrics
against a hand computation (SVD instead of an eigendecomposition, torch.linalg.lstsq, plain hooks)."""
import itertools

import pytest
import torch
import torch.nn.functional as F

import interp
from interp.saes.baselines import keep_largest, pca_basis, pca_code, regression, top_neurons

from .test_splice import LN2, MLP_OUT, RESID, HandSAE


def sparse_in_a_basis(d=12, k=3, n_bases=40, seed=0):
    """Rows exactly k-sparse in an orthonormal basis Q, each support and magnitudes with every sign pattern
    (so the coefficients' sample covariance is exactly diagonal), direction j scaled by 1 + j (distinct
    variances): PCA must find Q. Returns (x [n, d], coefficients [n, d], Q [d, d], mean [d])."""
    g = torch.Generator().manual_seed(seed)
    q = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))[0]
    rows = []
    for _ in range(n_bases):
        support = torch.randperm(d, generator=g)[:k]
        mags = 0.5 + torch.rand(k, generator=g, dtype=torch.float64)
        for signs in itertools.product((1.0, -1.0), repeat=k):
            c = torch.zeros(d, dtype=torch.float64)
            c[support] = mags * torch.tensor(signs, dtype=torch.float64) * (1 + support.double())
            rows.append(c)
    coef = torch.stack(rows)
    mean = torch.linspace(-1, 1, d, dtype=torch.float64)
    return coef @ q.T + mean, coef, q, mean


def test_pca_code_is_exact_at_the_data_sparsity_and_keeps_the_largest_below_it():
    x, coef, q, mean = sparse_in_a_basis()
    mu, basis = pca_basis(x)
    assert torch.allclose(mu, mean, atol=1e-12)
    order = coef.pow(2).mean(0).argsort(descending=True)  # each direction's variance, known exactly
    assert torch.allclose((basis.T @ q).abs(), torch.eye(12, dtype=torch.float64)[order], atol=1e-8)  # Q, largest first
    assert torch.allclose(pca_code(x, mu, basis, 3), x, atol=1e-9)
    # at L0 1: what remains is every coefficient but the largest of each row
    biggest = coef.abs().max(-1).values
    err = (x - pca_code(x, mu, basis, 1)).pow(2).sum(-1)
    assert torch.allclose(err, coef.pow(2).sum(-1) - biggest**2, atol=1e-9)
    per_row = torch.tensor([3, 1] * (len(x) // 2))
    assert torch.allclose(pca_code(x, mu, basis, per_row)[::2], x[::2], atol=1e-9)


def test_keep_largest_by_magnitude_row_by_row():
    coef = torch.tensor([[3.0, -5.0, 1.0, 0.5], [0.125, 0.25, -0.375, 0.0]])
    assert keep_largest(coef, torch.tensor([2, 1])).tolist() == [[3.0, -5.0, 0.0, 0.0], [0.0, 0.0, -0.375, 0.0]]
    assert keep_largest(coef, 0).abs().sum() == 0


def test_top_neurons_rank_by_what_each_neuron_writes():
    hidden = torch.tensor([[3.0, -5.0, 1.0, 0.5]])
    W_out = torch.eye(4, dtype=torch.float64) * torch.tensor([1.0, 1.0, 10.0, 1.0], dtype=torch.float64)[:, None]
    out = top_neurons(hidden, W_out, torch.zeros(4, dtype=torch.float64), 2)  # writes 3, 5, 10, 0.5: keep 1 and 2
    assert out.tolist() == [[0.0, -5.0, 10.0, 0.0]]


def test_regression_recovers_an_exactly_linear_map():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(200, 6, generator=g, dtype=torch.float64)
    A, b = torch.randn(6, 4, generator=g, dtype=torch.float64), torch.randn(4, generator=g, dtype=torch.float64)
    W, c = regression(x, x @ A + b)
    assert torch.allclose(W, A, atol=1e-8) and torch.allclose(c, b, atol=1e-8)


@pytest.fixture
def rows():
    g = torch.Generator().manual_seed(5)
    return [torch.randint(0, 256, (n,), generator=g) for n in (40, 33, 64)]


def _ce(model, ids, hooks=()):
    logits = model.run_with_hooks(ids[None], fwd_hooks=list(hooks))[0]
    return F.cross_entropy(logits[:-1].double(), ids[1:], reduction="sum").item(), logits


def test_sae_baselines_equal_a_hand_computation(tiny_model, tiny_cfg, rows):
    sae = HandSAE(tiny_cfg.d_model, 96, RESID)
    m = interp.sae_metrics(tiny_model, sae, rows, batch_size=2, baselines=True).iloc[0]
    with torch.no_grad():
        xs = [tiny_model.run_with_cache(r[None], names_filter=[RESID])[1][RESID][0].double() for r in rows]
        x = torch.cat(xs)
        mean = x.mean(0)
        basis = torch.linalg.svd(x - mean, full_matrices=False)[2].T  # right singular vectors: the PCA basis
        l0 = (sae.encode(x.float()) > 0).sum(-1)
        rec = keep_largest((x - mean) @ basis, l0) @ basis.T + mean
        ev = 1 - (x - rec).pow(2).sum() / (x - mean).pow(2).sum()
        ce = dict(clean=0.0, mean=0.0, pca=0.0, zero=0.0)
        start = 0
        for r, xr in zip(rows, xs):
            part = rec[start:start + len(r)]
            start += len(r)
            ce["clean"] += _ce(tiny_model, r)[0]
            ce["zero"] += _ce(tiny_model, r, [(RESID, lambda a, hook: torch.zeros_like(a))])[0]
            ce["mean"] += _ce(tiny_model, r, [(RESID, lambda a, hook: mean.float().expand_as(a))])[0]
            ce["pca"] += _ce(tiny_model, r, [(RESID, lambda a, hook, p=part: p.float()[None])])[0]
    assert m.pca_explained_variance == pytest.approx(ev.item(), abs=1e-5)
    assert m.pca_l0 == pytest.approx(l0.double().mean().item()) == pytest.approx(m.l0)
    n_pred = sum(len(r) - 1 for r in rows)
    assert m.ce_mean == pytest.approx(ce["mean"] / n_pred, rel=1e-4)
    assert m.pca_ce_loss_recovered_mean == pytest.approx((ce["mean"] - ce["pca"]) / (ce["mean"] - ce["clean"]), rel=1e-3)
    assert m.pca_ce_loss_recovered == pytest.approx((ce["zero"] - ce["pca"]) / (ce["zero"] - ce["clean"]), rel=1e-3)
    assert m.best_baseline == "pca" and m.ev_margin == pytest.approx(m.explained_variance - ev.item(), abs=1e-5)
    assert m.ce_margin == pytest.approx(m.ce_loss_recovered_mean - m.pca_ce_loss_recovered_mean, abs=1e-12)


def test_transcoder_baselines_equal_least_squares_and_all_neurons_are_the_mlp(tiny_model, tiny_cfg, rows):
    tc = HandSAE(tiny_cfg.d_model, 128, LN2, MLP_OUT)
    with torch.no_grad():
        tc.b_enc.fill_(100.0)  # every latent fires: L0 128 = d_mlp, so the top neurons are all of the MLP
    m = interp.sae_metrics(tiny_model, tc, rows, batch_size=2, baselines=True).iloc[0]
    assert m.l0 == 128 and m.top_neurons_explained_variance == pytest.approx(1, abs=1e-6)
    assert m.top_neurons_kl == pytest.approx(0, abs=1e-6) and m.top_neurons_ce_loss_recovered == pytest.approx(1, abs=1e-4)
    with torch.no_grad():
        cache = [tiny_model.run_with_cache(r[None], names_filter=[LN2, MLP_OUT])[1] for r in rows]
    x = torch.cat([c[LN2][0] for c in cache]).double()
    y = torch.cat([c[MLP_OUT][0] for c in cache]).double()
    x1 = torch.cat([x, torch.ones(len(x), 1, dtype=torch.float64)], 1)
    fit = x1 @ torch.linalg.lstsq(x1, y).solution
    ev = 1 - (y - fit).pow(2).sum() / (y - y.mean(0)).pow(2).sum()
    assert m.regression_explained_variance == pytest.approx(ev.item(), abs=1e-6)
    assert m.regression_l0 == tiny_cfg.d_model and m.best_baseline == "top_neurons"


def test_baselines_fitted_elsewhere_and_misuse(tiny_model, tiny_cfg, rows):
    sae = HandSAE(tiny_cfg.d_model, 96, RESID)
    fit = interp.saes.baselines.fit_baselines(tiny_model, sae, rows[:1])
    a = interp.sae_metrics(tiny_model, sae, rows[1:], baselines=True, baseline_fit=fit).iloc[0]
    b = interp.sae_metrics(tiny_model, sae, rows[1:], baselines=True, baseline_fit=rows[:1]).iloc[0]
    assert a.pca_explained_variance == pytest.approx(b.pca_explained_variance, rel=1e-9)
    same = interp.sae_metrics(tiny_model, sae, rows[1:], baselines=True).iloc[0]
    assert same.pca_explained_variance > a.pca_explained_variance  # the in-sample fit favours the baseline
    with pytest.raises(ValueError, match="baseline_fit is for baselines=True"):
        interp.sae_metrics(tiny_model, sae, rows, baseline_fit=fit)
    with pytest.raises(ValueError, match="fitted for an SAE"):
        interp.sae_metrics(tiny_model, HandSAE(tiny_cfg.d_model, 8, LN2, MLP_OUT), rows, baselines=True, baseline_fit=fit)
