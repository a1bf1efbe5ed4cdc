"""interp.mean_loss and interp.repeat_loss against known answers and the course model's own loss."""
import math

import pytest
import torch

import interp
from sprout import Sprout, SproutConfig

CFG = SproutConfig(vocab_size=64, context=16, n_layer=2, n_head=2, d_model=32, d_ff=64)


def flat_model() -> Sprout:
    """All weights zero: the logits are all 0, so every prediction costs exactly ln(vocab)."""
    model = Sprout(CFG).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    return model


def test_a_flat_model_costs_ln_vocab_everywhere():
    model = flat_model()
    assert interp.mean_loss(model, torch.randint(0, 64, (3, 40))) == pytest.approx(math.log(64), rel=1e-6)
    rep = interp.repeat_loss(model, half_len=8, n_seqs=4).set_index("copy")
    assert rep["loss"].tolist() == pytest.approx([math.log(64)] * 2, rel=1e-6)
    assert rep["uniform"].tolist() == pytest.approx([math.log(63)] * 2)  # ids drawn from 1..63
    assert rep["n"].tolist() == [4 * 7, 4 * 7]


def test_mean_loss_equals_the_course_models_loss_window_by_window(tiny_model):
    ids = torch.randint(0, 256, (1, 150))
    n_ctx = int(tiny_model.cfg.n_ctx)
    total, n = 0.0, 0
    for a in range(0, 150, n_ctx):  # consecutive windows, each predicting its own tokens 2..T
        w = ids[:, a:a + n_ctx]
        if w.shape[1] > 1:
            loss = tiny_model(w[:, :-1], return_type="loss", targets=w[:, 1:])
            total, n = total + loss.item() * (w.shape[1] - 1), n + w.shape[1] - 1
    assert interp.mean_loss(tiny_model, ids) == pytest.approx(total / n, rel=1e-5)


def test_second_copy_loss_is_what_ablate_heads_calls_clean(tiny_model):
    rep = interp.repeat_loss(tiny_model, half_len=12, n_seqs=6, seed=3).set_index("copy")
    abl = interp.ablate_heads(tiny_model, [(1, 0)], half_len=12, n_seqs=6, seed=3)
    assert rep.loc["second", "loss"] == pytest.approx(abl["loss_clean"].iloc[0], rel=1e-5)
    tokens = interp.repeated_tokens(tiny_model, 12, 6, seed=3)
    first = tiny_model(tokens[:, :11], return_type="loss", targets=tokens[:, 1:12])  # the first copy's own predictions
    assert rep.loc["first", "loss"] == pytest.approx(first.item(), rel=1e-5)
    assert rep.loc["second", "ratio"] == pytest.approx(rep.loc["second", "loss"] / rep.loc["first", "loss"])


def test_mean_loss_needs_two_tokens():
    with pytest.raises(ValueError, match="two tokens"):
        interp.mean_loss(flat_model(), torch.tensor([[5]]))
