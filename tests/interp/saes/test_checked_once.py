"""Checks at the door, once: a dictionary or lens bound to a model is checked against it on first use, and
again only after the model's weights change (an in-place edit, `load_state_dict`)."""
import pytest
import torch

import interp
import interp._core.identity as identity
import interp.saes.sae as sae_module
from interp._core.identity import fingerprint, model_config
from interp.lens.tuned import TunedLens, tuned_lens

RESID = "blocks.0.hook_resid_post"


@pytest.fixture
def counts(monkeypatch):
    """How often every weight was hashed and how often a dictionary's widths were read by a forward."""
    seen = {"hash": 0, "forward": 0}
    hash_weights, hook_widths = identity._hash_weights, sae_module.hook_widths

    def counted_hash(model):
        seen["hash"] += 1
        return hash_weights(model)

    def counted_widths(model, hooks):
        seen["forward"] += 1
        return hook_widths(model, hooks)

    monkeypatch.setattr(identity, "_hash_weights", counted_hash)
    monkeypatch.setattr(sae_module, "hook_widths", counted_widths)
    return seen


def bound_sae(model):
    sae = interp.SAE(model.cfg.d_model, 32, kind="relu", hook_name=RESID)
    sae.model_fingerprint, sae.model_config = fingerprint(model), model_config(model)
    return sae


def test_a_second_splice_hashes_nothing_and_runs_no_check_forward(tiny_model, counts):
    sae = bound_sae(tiny_model)
    ids = torch.arange(8)[None]
    with interp.spliced(tiny_model, [sae]):
        first = tiny_model(ids)
    assert counts == {"hash": 1, "forward": 1}
    for _ in range(3):
        with interp.spliced(tiny_model, [sae]):
            again = tiny_model(ids)
        interp.run_with_saes(tiny_model, ids, [sae])
    assert counts == {"hash": 1, "forward": 1}
    assert torch.equal(first, again)


def test_an_in_place_edit_checks_again_and_refuses_the_dictionary(tiny_model, counts):
    sae = bound_sae(tiny_model)
    with interp.spliced(tiny_model, [sae]):
        pass
    saved = {k: v.clone() for k, v in tiny_model.state_dict().items()}
    with torch.no_grad():
        next(tiny_model.parameters()).mul_(2.0)  # same tensor, new version
    with pytest.raises(ValueError, match="trained for another model: weights fingerprint"):
        with interp.spliced(tiny_model, [sae]):
            pass
    assert counts["hash"] == 2
    tiny_model.load_state_dict(saved)  # copied in place: the original weights, checked again, fit again
    with interp.spliced(tiny_model, [sae]):
        pass
    assert counts == {"hash": 3, "forward": 2}


def test_a_failed_check_is_not_remembered(tiny_model, counts):
    sae = bound_sae(tiny_model)
    sae.model_fingerprint = "0" * 16  # another model's weights
    for _ in range(2):
        with pytest.raises(ValueError, match="trained for another model"):
            with interp.spliced(tiny_model, [sae]):
                pass
    assert counts["hash"] == 1  # the model's hash is kept; the refusal is made again, not cached as a pass


def test_another_dictionary_is_checked_on_its_own(tiny_model, counts):
    sae = bound_sae(tiny_model)
    with interp.spliced(tiny_model, [sae]):
        pass
    wide = interp.SAE(tiny_model.cfg.d_model + 1, 32, kind="relu", hook_name=RESID)  # same hook, other width
    with pytest.raises(ValueError, match="reads 65-wide activations"):
        with interp.spliced(tiny_model, [wide]):
            pass
    assert counts == {"hash": 1, "forward": 2}


def test_tuned_lens_hashes_the_model_once(tiny_model, counts):
    lens = TunedLens(tiny_model)
    ids = torch.arange(8)
    first = tuned_lens(tiny_model, ids, lens)
    for _ in range(2):
        again = tuned_lens(tiny_model, ids, lens)
    assert counts["hash"] == 1  # the lens' own fingerprint, taken when it was made
    assert first.equals(again)
    with torch.no_grad():
        next(tiny_model.parameters()).add_(0.5)
    with pytest.raises(ValueError, match="same config, other weights"):
        tuned_lens(tiny_model, ids, lens)
    assert counts["hash"] == 2
