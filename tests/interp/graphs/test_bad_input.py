"""Bad input to the graphs' functions gets a clear error naming what is wrong."""
import pytest
import torch

from interp.graphs import ReplacementModel, attribute
from tests.interp.graphs.tiny import random_transcoders, tiny_sprout


@pytest.fixture(scope="module")
def model():
    return tiny_sprout()


@pytest.fixture(scope="module")
def tcs(model):
    return random_transcoders(model)


IDS = torch.arange(1, 9)


def test_transcoders_of_another_model_layer_or_dtype(model, tcs):
    other = random_transcoders(model)
    other[1].model_fingerprint = "0123456789abcdef"
    with pytest.raises(ValueError, match="layer 1 was trained for another model"):
        attribute(model, IDS, other)
    with pytest.raises(ValueError, match=r"transcoders\[0\] reads 'blocks.1.ln2.hook_normalized'.*another layer"):
        attribute(model, IDS, [tcs[1], tcs[0]])
    with pytest.raises(ValueError, match=r"missing layer\(s\) \[1\]"):
        attribute(model, IDS, [tcs[0]])
    with pytest.raises(ValueError, match=r"missing layer\(s\) \[0\]"):
        attribute(model, IDS, {1: tcs[1]})
    with pytest.raises(TypeError, match="expected an interp.Transcoder"):
        attribute(model, IDS, [tcs[0], "blocks.1"])
    with pytest.raises(TypeError, match="transcoders are torch.float32 but Sprout is torch.float64"):
        ReplacementModel(model, random_transcoders(model, dtype=torch.float32))


def test_prompts_and_targets(model, tcs):
    with pytest.raises(ValueError, match="longer than the model's context of 64"):
        attribute(model, torch.zeros(65, dtype=torch.long), tcs)
    with pytest.raises(ValueError, match="target token id 300 is outside the vocabulary"):
        attribute(model, IDS, tcs, target=300)
    with pytest.raises(ValueError, match="out of range for a vocabulary of 256"):
        attribute(model, torch.tensor([1, 2, 999]), tcs)
    with pytest.raises(ValueError, match="a target direction is"):
        attribute(model, IDS, tcs, target=torch.zeros(5, dtype=torch.float64))
    with pytest.raises(ValueError, match="no more than prefix=1"):
        attribute(model, IDS[:1], tcs)
    with pytest.raises(ValueError, match="one prompt"):
        attribute(model, torch.stack([IDS, IDS]), tcs)
    for bad in (dict(max_n_logits=0), dict(batch_size=1.5), dict(desired_logit_prob=1.5), dict(max_feature_nodes=-1)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            attribute(model, IDS, tcs, **bad)


def test_nan_activations(model, tcs):
    broken = tiny_sprout()
    with torch.no_grad():
        broken.blocks[1].attn.qkv.weight[0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN or infinite activations at .*blocks.1"):
        attribute(broken, IDS, tcs)
    bad = random_transcoders(model)
    with torch.no_grad():
        bad[0].W_dec[:] = float("inf")
    with pytest.raises(ValueError, match="NaN or infinite activations at the transcoder of layer 0"):
        attribute(model, IDS, bad)


def test_dropout_in_training_mode():
    from sprout.walkthrough import build_step

    model = build_step("4.10", dropout=0.2).double().train()
    with pytest.raises(ValueError, match="training mode with dropout.*model.eval"):
        attribute(model, IDS[:5], random_transcoders(model))


def test_split_inputs_are_refused(model, tcs):
    model.set_use_split_qkv_input(True)
    try:
        with pytest.raises(ValueError, match="use_split_qkv_input is on"):
            attribute(model, IDS, tcs)
    finally:
        model.set_use_split_qkv_input(False)
