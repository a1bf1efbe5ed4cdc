"""What a patching metric must return (interp._core.metrics), and degenerate inputs reported as such, never as a finding."""
import numpy as np
import pytest
import torch

import interp
from sprout import Sprout
from tests.conftest import TINY

V = TINY.vocab_size


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return Sprout(TINY).eval()


def pair(seed=0):
    g = torch.Generator().manual_seed(seed)
    clean = torch.randint(1, V, (2, 6), generator=g)
    corrupted = clean.clone()
    corrupted[:, 2] = (corrupted[:, 2] + 5) % V
    return clean, corrupted


def logit_diff(logits):
    return logits[:, -1, 5] - logits[:, -1, 9]


def returns_str(logits):
    return "good"


def returns_none(logits):
    return None


def returns_complex(logits):
    return complex(1, 2)


def returns_complex_tensor(logits):
    return logits[:, -1, 5].mean().to(torch.complex64)


@pytest.mark.parametrize("metric, words", [
    (returns_str, r"the metric 'returns_str' must return a real number .* it returned str 'good'"),
    (returns_none, r"the metric 'returns_none' must return a real number .* it returned NoneType None"),
    (returns_complex, r"the metric 'returns_complex' must return a real number .* it returned complex"),
    (returns_complex_tensor, r"it returned a torch.complex64 tensor"),
])
@pytest.mark.parametrize("analysis", ["patch", "attribution_patch", "path_patch"])
def test_a_metric_that_returns_no_number_is_named(model, metric, words, analysis):
    clean, corrupted = pair()
    call = {"patch": lambda: interp.patch(model, clean, corrupted, metric, site="z", by="head"),
            "attribution_patch": lambda: interp.attribution_patch(model, clean, corrupted, metric, site="z", by="head"),
            "path_patch": lambda: interp.path_patch(model, clean, corrupted, metric, ["L0H0"], ["L1H0"])}[analysis]
    with pytest.raises(TypeError, match=words):
        call()


def test_a_metric_must_be_a_function(model):
    with pytest.raises(TypeError, match="the metric must be a function of the logits"):
        interp.patch(model, *pair(), "logit_diff")


def test_numbers_of_every_kind_are_metrics_for_exact_patching(model):
    clean, corrupted = pair()
    ref = interp.patch(model, clean, corrupted, lambda lg: float(logit_diff(lg).mean()), site="z", by="head")
    for metric in (lambda lg: logit_diff(lg).mean(), lambda lg: logit_diff(lg), lambda lg: np.float32(logit_diff(lg).mean()),
                   lambda lg: logit_diff(lg).numpy()):
        got = interp.patch(model, clean, corrupted, metric, site="z", by="head")
        np.testing.assert_allclose(got["metric"], ref["metric"], atol=1e-5)
    # an accuracy is a fine metric for exact patching (an integer per row, averaged)
    accuracy = interp.patch(model, clean, corrupted, lambda lg: (lg[:, -1].argmax(-1) == 5).long(), site="z", by="head")
    assert set(accuracy["metric"]) <= {0.0, 0.5, 1.0}


def accuracy(logits):
    return (logits[:, -1].argmax(-1) == 5).float().mean()


def constant(logits):
    return torch.tensor(1.0)


def integer(logits):
    return logits[:, -1, 5].mean().long()


def python_float(logits):
    return float(logits[:, -1, 5].mean())


@pytest.mark.parametrize("metric", [accuracy, constant, integer, python_float])
def test_attribution_patch_refuses_a_metric_without_a_gradient(model, metric):
    with pytest.raises(TypeError, match=rf"attribution_patch differentiates the metric, so '{metric.__name__}' must "
                                        r"return a float tensor computed from the logits .* without a gradient"):
        interp.attribution_patch(model, *pair(), metric, site="z", by="head")
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("bad", [1.0, -1.0, "1", [0, 1.5], True, [True], torch.tensor(1)])
def test_logit_positions_take_ints_only(model, bad):
    with pytest.raises(ValueError, match="logit_positions must be positions in -6..5"):
        interp.patch(model, *pair(), logit_diff, site="z", by="head", logit_positions=bad)


def test_clean_equal_to_corrupted_is_an_error_not_a_finding(model):
    clean, _ = pair()
    for call in (lambda: interp.patch(model, clean, clean.clone(), logit_diff),
                 lambda: interp.attribution_patch(model, clean, clean.clone(), logit_diff),
                 lambda: interp.path_patch(model, clean, clean.clone(), logit_diff, ["L0H0"], ["L1H0"]),
                 lambda: interp.induction_circuit(model, data=(clean, clean.clone()), stories=False)):
        with pytest.raises(ValueError, match="clean and corrupted are the same tokens"):
            call()


def test_a_metric_equal_on_both_runs_is_flagged(model):
    clean, corrupted = pair()

    def blind(logits):  # reads position 0, which the corruption at position 2 cannot reach (causal)
        return logits[:, 0, 5].mean()
    with pytest.warns(RuntimeWarning, match="the corruption changes nothing it measures"):
        frame = interp.patch(model, clean, corrupted, blind, site="z", by="head")
    assert frame.attrs["degenerate"] is True and frame["recovered"].isna().all()
    with pytest.warns(RuntimeWarning, match="on both base and source runs"):
        frame = interp.path_patch(model, clean, corrupted, blind, ["L0H0"], ["L1H0"])
    assert frame.attrs["degenerate"] is True and frame["recovered"].isna().all()
    with pytest.warns(RuntimeWarning):
        assert interp.attribution_patch(model, clean, corrupted, blind, site="z", by="head").attrs["degenerate"] is True
    assert interp.patch(model, clean, corrupted, logit_diff, site="z", by="head").attrs["degenerate"] is False


def test_an_induction_circuit_whose_metric_cannot_move_is_reported_undefined():
    import pandas as pd

    from interp.induction.circuit import summarize

    frame = pd.DataFrame({"receiver": ["L1H0"] * 3, "induction_score": [0.9] * 3, "sender": ["L0H0"] * 3,
                          "via": ["k", "q", "v"], "share_repeated": [float("nan")] * 3,
                          "share_stories": [float("nan")] * 3, "composition": [0.1] * 3, "baseline": [0.1] * 3,
                          "ablation_delta": [0.0] * 3, "feeds": [False] * 3})
    text = summarize(frame)
    assert "no single head above the threshold" not in text
    assert text.count("undefined (the metric is the same on the clean and the corrupted tokens)") == 3


@pytest.mark.parametrize("bad", [0, 2.5, True, "4"])
def test_chunk_sizes_are_positive_integers(model, bad):
    with pytest.raises(ValueError, match=rf"batch_size must be None or an integer >= 1, got {bad!r}"):
        interp.patch(model, *pair(), logit_diff, site="z", by="head", batch_size=bad)
    with pytest.raises(ValueError, match=rf"batch_size must be None or an integer >= 1, got {bad!r}"):
        interp.path_patch(model, *pair(), logit_diff, ["L0H0"], ["L1H0"], batch_size=bad)


@pytest.mark.parametrize("field", ["min_score", "min_share", "relative"])
def test_induction_circuit_thresholds_are_finite_numbers(model, field):
    for bad in (float("nan"), "0.3", True):
        with pytest.raises(ValueError, match=f"induction_circuit: {field} must be a finite number"):
            interp.induction_circuit(model, stories=False, **{field: bad})
