"""Residual RMS: streamed statistics equal a direct computation from the full cache."""
import math

import numpy as np
import pytest
import torch

import interp
from interp.measures.residual import LogHistogram

BIN = 10 ** (12 / 4800) - 1  # the default histogram's relative bin width


def _direct(model, ids):
    _, cache = model.run_with_cache(ids)
    return {name: cache[name].float().pow(2).mean(-1).sqrt().reshape(-1) for name in cache.keys()}


def _between_order_statistics(value, x, q):
    s = np.sort(x.numpy())
    lo, hi = s[max(int(np.floor(q * len(s))) - 1, 0)], s[min(int(np.ceil(q * len(s))), len(s) - 1)]
    return lo * (1 - BIN) <= value <= hi * (1 + BIN)


def test_rms_equals_a_direct_computation_from_the_cache(tiny_model):
    ids = torch.randint(0, 256, (6, 40), generator=torch.Generator().manual_seed(0))
    df = interp.residual_rms(tiny_model, ids, batch_size=4)
    r = _direct(tiny_model, ids)
    assert df.site.tolist() == [
        "blocks.0.hook_resid_pre", "blocks.0.hook_attn_out", "blocks.0.hook_resid_mid", "blocks.0.hook_mlp_out",
        "blocks.0.hook_resid_post", "blocks.1.hook_attn_out", "blocks.1.hook_resid_mid", "blocks.1.hook_mlp_out",
        "blocks.1.hook_resid_post"]
    assert (df.n_tokens == 240).all()
    for row in df.itertuples():
        x = r[row.site]
        assert row.mean == pytest.approx(x.mean().item(), rel=1e-5)
        for q, col in ((0.05, "q05"), (0.5, "q50"), (0.95, "q95")):
            assert _between_order_statistics(getattr(row, col), x, q), (row.site, col)
    stream = df[df.kind == "stream"].set_index("site")
    pre = r["blocks.1.hook_resid_pre"].mean().item()
    for site in ("blocks.1.hook_resid_post", "blocks.1.hook_resid_mid"):
        assert stream.loc[site, "growth"] == pytest.approx(r[site].mean().item() / pre, rel=1e-5)
    assert math.isnan(stream.loc["blocks.0.hook_resid_pre", "growth"])
    writes = df[df.kind != "stream"].set_index("site")
    ratio = (r["blocks.1.hook_mlp_out"] / r["blocks.1.hook_resid_mid"]).mean().item()
    assert writes.loc["blocks.1.hook_mlp_out", "ratio"] == pytest.approx(ratio, rel=1e-5)
    ratio = (r["blocks.0.hook_attn_out"] / r["blocks.0.hook_resid_pre"]).mean().item()
    assert writes.loc["blocks.0.hook_attn_out", "ratio"] == pytest.approx(ratio, rel=1e-5)


def test_batching_does_not_change_the_answer(tiny_model):
    ids = torch.randint(0, 256, (5, 30), generator=torch.Generator().manual_seed(1))
    a = interp.residual_rms(tiny_model, ids, batch_size=1, include_writes=False)
    b = interp.residual_rms(tiny_model, ids, batch_size=5, include_writes=False)
    assert a.site.tolist() == b.site.tolist()
    for col in ("mean", "q05", "q50", "q95", "growth"):
        np.testing.assert_allclose(a[col], b[col], rtol=1e-5)


def test_log_histogram_quantiles_and_range():
    x = torch.from_numpy(np.random.default_rng(0).lognormal(0.0, 2.0, 200_000))
    h = LogHistogram()
    for chunk in x.split(7_000):
        h.add(chunk)
    assert h.counts.numel() == 4800 and h.n == 200_000  # fixed size, whatever was added
    for q in (0.01, 0.05, 0.5, 0.95, 0.99):
        exact = np.quantile(x.numpy(), q)
        assert abs(h.quantile(q) / exact - 1) <= BIN, q
    tiny = LogHistogram(lo=1.0, hi=10.0, n_bins=10)
    tiny.add(torch.tensor([0.01, 0.02, 500.0]))  # outside [lo, hi]: edge bins, answers kept within min..max
    assert tiny.quantile(0.0) >= 0.01 and tiny.quantile(1.0) <= 500.0


def test_step_without_residuals_names_the_missing_hook():
    from sprout.walkthrough import build_step

    with pytest.raises(ValueError, match=r"WalkthroughGPT has no hook point 'blocks.0.hook_resid_pre'"):
        interp.residual_rms(build_step("4.6"), torch.randint(0, 65, (1, 8)))
