"""Metrics that refuse what they cannot measure (issue 36, item 6): CE recovered from too few predictions,
attention masks that are not 0/1, NaN clamp values, a latent that is not an integer, and a truthy
string for a boolean splice option."""
import math

import pytest
import torch

import interp
from interp.saes.features import clamp_effect
from interp.saes.metrics import MIN_CE_PREDICTIONS
from sprout import Sprout
from tests.conftest import TINY, randomize_gains

HOOK = "blocks.0.hook_resid_post"


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return randomize_gains(Sprout(TINY).eval())


@pytest.fixture(scope="module")
def sae():
    return interp.SAE(TINY.d_model, 32, kind="relu", hook_name=HOOK, seed=3)


def _ids(n, seed=0):
    return torch.randint(0, TINY.vocab_size, (1, n), generator=torch.Generator().manual_seed(seed))


def test_ce_recovered_from_two_predictions_is_nan_with_a_warning(model, sae):
    with pytest.warns(UserWarning, match="2 next-token predictions .* too few"):
        row = interp.sae_metrics(model, sae, _ids(3))
    assert math.isnan(row.ce_loss_recovered[0]) and row.n_predictions[0] == 2
    assert math.isfinite(row.ce_clean[0]) and math.isfinite(row.fvu[0])  # what can be measured still is
    enough = interp.sae_metrics(model, sae, _ids(MIN_CE_PREDICTIONS + 1))
    assert math.isfinite(enough.ce_loss_recovered[0])


@pytest.mark.parametrize("mask", [torch.full((1, 8), 0.5), torch.full((1, 8), 2), torch.tensor([[1, 1, 1, 1, 1, 1, 1, -1]])])
def test_masks_that_are_not_zero_or_one_are_refused(model, sae, mask):
    with pytest.raises(ValueError, match="attention_mask must hold only 0 .* and 1"):
        interp.sae_metrics(model, sae, _ids(8), attention_mask=mask)


@pytest.mark.parametrize("value", [math.nan, math.inf, "3", True])
def test_clamp_values_that_are_not_finite_numbers_are_refused(model, sae, value):
    with pytest.raises(ValueError, match="value .* must be a finite number"):
        clamp_effect(model, sae, 0, _ids(8), value=value)


@pytest.mark.parametrize("latent, words", [(1.7, "latent must be an integer in 0..31"), (True, "must be an integer"),
                                           (-1, "latent -1 is out of range"), (32, "latent 32 is out of range")])
def test_a_latent_that_is_not_an_index_is_refused(model, sae, latent, words):
    with pytest.raises(ValueError, match=words):
        clamp_effect(model, sae, latent, _ids(8), value=1.0)


@pytest.mark.parametrize("flag", ["no", 0, None])
def test_use_error_term_must_be_a_bool(model, sae, flag):
    with pytest.raises(TypeError, match="use_error_term must be True or False"):
        interp.run_with_saes(model, _ids(4), [sae], use_error_term=flag)
