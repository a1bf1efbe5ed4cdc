"""clamp_effect's baselines (issue 38): random latents and random unit directions clamped the same way."""
import pandas as pd
import pytest
import torch

import interp
from interp.saes.clamp import _run, clamp_baselines, clamp_verdict
from interp.saes.features import clamp_effect

LAST = "blocks.1.hook_resid_post"


@pytest.fixture
def rows():
    g = torch.Generator().manual_seed(8)
    return [torch.randint(0, 256, (64,), generator=g) for _ in range(2)]


@pytest.fixture
def sae(tiny_cfg, tiny_model):
    """Latent 3 writes the unit direction with the widest logit effects (W_U's top left singular vector);
    the others are random unit rows."""
    sae = interp.SAE(tiny_cfg.d_model, 32, kind="topk", k=4, hook_name=LAST, seed=1)
    with torch.no_grad():
        sae.W_dec[3] = torch.linalg.svd(tiny_model.W_U.float())[0][:, 0]
    return sae


def test_the_latent_row_is_clamp_effects_own_measurement(tiny_model, sae, rows):
    got = clamp_effect(tiny_model, sae, 5, rows, value=30.0, k=5, baselines=4)
    up, down = got[got.direction == "top"].delta_logprob.mean(), got[got.direction == "bottom"].delta_logprob.mean()
    assert got.agreement.iloc[0] == pytest.approx(up - down, rel=1e-5)
    assert {"baseline_p95", "beats_baselines", "baseline_pass_rate"} <= set(got.columns)


def test_a_direction_is_a_latent_of_activation_zero_clamped(tiny_model, tiny_cfg, sae, rows):
    with torch.no_grad():
        sae.b_enc[7] = -1e4  # latent 7 never fires: clamping it adds value x its decoder row, as a direction does
        ids = torch.stack(rows)
        as_latent = _run(tiny_model, sae, ids, "random_latent", 7, sae.W_dec[7], 25.0)
        as_direction = _run(tiny_model, sae, ids, "random_direction", 0, sae.W_dec[7], 25.0)
    torch.testing.assert_close(as_latent, as_direction, rtol=1e-4, atol=1e-4)


def test_only_the_planted_latent_beats_the_baselines(tiny_model, sae, rows):
    planted = clamp_verdict(clamp_baselines(tiny_model, sae, 3, rows, value=30.0, n=20, k=5))
    plain = clamp_verdict(clamp_baselines(tiny_model, sae, 5, rows, value=30.0, n=20, k=5))
    assert planted["beats_baselines"] and planted["agreement"] > planted["baseline_p95"]
    assert not plain["beats_baselines"]
    # the old check (promoted up, suppressed down) is passed by nearly every baseline after the last block
    assert plain["baseline_pass_rate"] >= 0.9


def test_the_verdict_is_the_95th_percentile():
    base = pd.DataFrame(dict(source=["random_latent"] * 20, index=range(20), up=1.0, down=-1.0,
                             agreement=[i / 20 for i in range(20)]))
    for own, beats in ((0.96, True), (0.9, False)):
        table = pd.concat([pd.DataFrame(dict(source=["latent"], index=[0], up=[1.0], down=[0.0], agreement=[own])), base])
        assert clamp_verdict(table)["beats_baselines"] is beats
    with pytest.raises(ValueError, match="one 'latent' row"):
        clamp_verdict(base)
