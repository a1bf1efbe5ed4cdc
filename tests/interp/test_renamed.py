"""The renamed keywords (docs/guide/analyses.md, "Renamed keywords"): the old one gives the same answer as the new one for
one release, with a DeprecationWarning naming the new keyword; both at once, or a bad value, are refused."""
import pandas as pd
import pytest
import torch

import interp
from tests.interp.test_patching import pair, scalar_metric


def _same(a, b):
    if isinstance(a, pd.DataFrame):
        pd.testing.assert_frame_equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys() and all(a[k] == pytest.approx(b[k], nan_ok=True) for k in a)
    else:
        assert a == pytest.approx(b)


IDS = torch.arange(1, 41)[None] % 200

CASES = {  # name: (call with the new keyword, the old keyword, the new one, its value)
    "logit_lens": (lambda m, **kw: interp.logit_lens(m, **kw), "text_or_tokens", "data", IDS),
    "residual_rms": (lambda m, **kw: interp.residual_rms(m, **kw), "text_or_tokens", "data", IDS),
    "mean_loss": (lambda m, **kw: interp.mean_loss(m, **kw), "text_or_tokens", "data", IDS),
    "head_scores": (lambda m, **kw: interp.head_scores(m, "previous_token", **kw), "text_or_tokens", "data", IDS),
    "attention_patterns": (lambda m, **kw: interp.attention_patterns(m, **kw), "text_or_tokens", "data", IDS[:, :8]),
    "logit_attribution": (lambda m, **kw: interp.logit_attribution(m, **kw), "text_or_tokens", "data", IDS[:, :8]),
    "positional_qk_scores": (lambda m, **kw: interp.positional_qk_scores(m, **kw), "tokens", "data", IDS),
    "composition_scores": (lambda m, **kw: interp.composition_scores(m, baseline_samples=4, **kw), "kind", "via", "q"),
    "ov_copying_scores": (lambda m, **kw: interp.ov_copying_scores(m, **kw), "chunk", "batch_size", 7),
    "patch": (lambda m, **kw: interp.patch(m, *pair(), scalar_metric, site="z", by="head", **kw),
              "patches_per_forward", "batch_size", 3),
    "path_patch": (lambda m, **kw: interp.path_patch(m, *pair(), scalar_metric, ["L0H0", "L0H1"], ["L1H0"], **kw),
                   "pairs_per_forward", "batch_size", 1),
}


@pytest.mark.parametrize("name", list(CASES))
def test_the_old_keyword_warns_naming_the_new_one_and_answers_the_same(tiny_model, name):
    call, old, new, value = CASES[name]
    want = call(tiny_model, **{new: value})
    with pytest.warns(DeprecationWarning, match=rf"{old}=\.\.\.\) is deprecated .*use {new}="):
        got = call(tiny_model, **{old: value})
    _same(got, want)
    with pytest.raises(TypeError, match=rf"got both {new}= and its deprecated old name {old}="):
        call(tiny_model, **{old: value, new: value})


def test_a_bad_value_under_the_old_keyword_is_named_as_written(tiny_model):
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match=r"^patches_per_forward must be None or an integer >= 1, got 0"):
        interp.patch(tiny_model, *pair(), scalar_metric, site="z", by="head", patches_per_forward=0)
    with pytest.raises(ValueError, match=r"^batch_size must be None or an integer >= 1, got 0"):
        interp.patch(tiny_model, *pair(), scalar_metric, site="z", by="head", batch_size=0)


def test_tuned_lens_load_takes_the_model_first_and_the_old_order_for_one_release(tiny_model, tmp_path):
    lens = interp.TunedLens(tiny_model)
    torch.nn.init.normal_(lens.translators[0].bias)  # something to tell a loaded lens from a fresh one
    lens.save(tmp_path / "lens")
    new = interp.TunedLens.load(tiny_model, tmp_path / "lens")
    with pytest.warns(DeprecationWarning, match=r"use TunedLens.load\(model, path\)"):
        old = interp.TunedLens.load(tmp_path / "lens", tiny_model)
    for a, b in zip(new.parameters(), old.parameters()):
        assert torch.equal(a, b)
    assert torch.equal(new.translators[0].bias, lens.translators[0].bias)
