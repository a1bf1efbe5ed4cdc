"""One parser for heads and components (interp._core.specs): "L3H1", (3, 1) and Head(3, 1) are the same head in every
analysis; floats, bools and out-of-range numbers are refused naming the spec; frames label heads one way."""
import numpy as np
import pandas as pd
import pytest
import torch

import interp
from interp import Component, Head
from interp._core.specs import as_component, as_components, as_head, as_heads, head_label
from sprout import Sprout
from tests.conftest import TINY


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return Sprout(TINY).eval()  # 2 layers, 4 heads


def test_a_head_prints_and_parses_as_L_H(model):
    assert str(Head(1, 3)) == Head(1, 3).label == "L1H3" == head_label(1, 3)
    for spec in ("L1H3", " L1H3 ", (1, 3), [1, 3], (np.int64(1), np.int32(3)), Head(1, 3), Component("head", 1, 3),
                 torch.tensor([1, 3])):
        assert as_head(model, spec) == Head(1, 3)
    assert as_head(model, "L1H3") == (1, 3)  # a Head is a (layer, head) tuple


def test_components(model):
    assert as_component(model, "embed") == Component("embed", -1, -1)
    assert as_component(model, "MLP1") == Component("mlp", 1, -1)
    assert as_component(model, "L0H2") == as_component(model, (0, 2)) == Component("head", 0, 2)
    assert [str(c) for c in as_components(model, ["embed", "MLP0", (1, 1)])] == ["embed", "MLP0", "L1H1"]


@pytest.mark.parametrize("spec, kind, words", [
    ((0, 0.7), TypeError, r"head must be an integer, got 0.7 \(float\) in the head \(0, 0.7\)"),
    ((True, 0), TypeError, r"layer must be an integer, got True \(bool\)"),
    ((0, np.float64(1.0)), TypeError, "head must be an integer"),
    ((0, torch.tensor(True)), TypeError, "head must be an integer"),
    ((0,), TypeError, r"each head is a \(layer, head\) pair"),
    ((0, 1, 2), TypeError, r"each head is a \(layer, head\) pair"),
    (1.5, TypeError, r"each head is a \(layer, head\) pair"),
    ("L2H0", ValueError, r"layer 2 is out of range in 'L2H0': Sprout has 2 layers \(0..1\)"),
    ((0, 4), ValueError, r"head 4 is out of range in \(0, 4\): Sprout has 4 heads \(0..3\)"),
    ((-1, 0), ValueError, "layer -1 is out of range"),
    ("L1H", ValueError, "cannot read the head 'L1H'"),
    ("l1h0", ValueError, "cannot read the head 'l1h0'"),
    ("MLP0", ValueError, "'MLP0' is not an attention head"),
    ("embed", ValueError, "'embed' is not an attention head"),
])
def test_bad_head_specs_are_refused_naming_them(model, spec, kind, words):
    with pytest.raises(kind, match=words):
        as_head(model, spec)


@pytest.mark.parametrize("spec, words", [("MLP2", "layer 2 is out of range in 'MLP2'"), ("MLP", "cannot read the component"),
                                         ("attn0", "cannot read the component"), ((0, 1.0), "head must be an integer")])
def test_bad_component_specs_are_refused_naming_them(model, spec, words):
    with pytest.raises((TypeError, ValueError), match=words):
        as_component(model, spec)


def test_one_spec_or_a_list(model):
    assert as_heads(model, (1, 2)) == [Head(1, 2)]  # a single tuple, as the docstrings allow
    assert as_heads(model, "L1H2") == [Head(1, 2)]
    assert as_heads(model, [(0, 1), "L1H2"]) == [Head(0, 1), Head(1, 2)]
    assert as_heads(model, ((0, 1), (1, 2))) == [Head(0, 1), Head(1, 2)]
    assert as_heads(model, ("L0H1", "L1H2")) == [Head(0, 1), Head(1, 2)]  # a tuple of two labels is two heads
    assert as_components(model, ("embed", "MLP1")) == [Component("embed"), Component("mlp", 1)]
    with pytest.raises(TypeError, match="head must be an integer"):
        as_heads(model, (0, 1.5))  # one head with a float in it, not two specs
    with pytest.raises(ValueError, match="no heads given"):
        as_heads(model, [])
    with pytest.raises(TypeError, match="one spec or a list"):
        as_heads(model, 3)


def metric(logits):
    return logits[:, -1, 5].mean()


def pair():
    g = torch.Generator().manual_seed(0)
    clean = torch.randint(1, TINY.vocab_size, (2, 6), generator=g)
    corrupted = clean.clone()
    corrupted[:, 2] = (corrupted[:, 2] + 5) % TINY.vocab_size
    return clean, corrupted


def test_path_patch_reads_every_form_of_a_head_the_same(model):
    clean, corrupted = pair()
    by_label = interp.path_patch(model, clean, corrupted, metric, ["L0H1", "MLP0", "embed"], ["L1H2"])
    by_tuple = interp.path_patch(model, clean, corrupted, metric, [(0, 1), Component("mlp", 0), "embed"], (1, 2))
    pd.testing.assert_frame_equal(by_label, by_tuple)
    single = interp.path_patch(model, clean, corrupted, metric, (0, 1), Head(1, 2))
    pd.testing.assert_frame_equal(single, by_label.iloc[:1].reset_index(drop=True))
    # integer layer and head columns beside the labels, -1 where there is no head
    assert by_label[["sender_layer", "sender_head", "receiver_layer", "receiver_head"]].values.tolist() == [
        [0, 1, 1, 2], [0, -1, 1, 2], [-1, -1, 1, 2]]
    with pytest.raises(TypeError, match="head must be an integer, got 1.0"):
        interp.path_patch(model, clean, corrupted, metric, [(0, 1.0)], ["L1H2"])
    with pytest.raises(TypeError, match="layer must be an integer, got False"):
        interp.path_patch(model, clean, corrupted, metric, ["L0H1"], [(False, 2)])


def test_ablate_heads_reads_labels_and_tuples_alike(model):
    kw = dict(half_len=4, n_seqs=2)
    a = interp.ablate_heads(model, [(0, 1), (1, 3)], **kw)
    b = interp.ablate_heads(model, ["L0H1", Head(1, 3)], **kw)
    pd.testing.assert_frame_equal(a, b)
    assert a.label.tolist() == ["L0H1", "L1H3", "L0H1+L1H3"]
    pd.testing.assert_frame_equal(interp.ablate_heads(model, (0, 1), **kw), interp.ablate_heads(model, "L0H1", **kw))
    with pytest.raises(ValueError, match="head 9 is out of range"):
        interp.ablate_heads(model, ["L0H9"], **kw)
    with pytest.raises(ValueError, match="top_k must be None or an integer >= 1"):
        interp.ablate_heads(model, ["L0H1"], top_k=0, **kw)


def test_phase_measures_says_when_the_heads_are_swapped(model):
    with pytest.raises(ValueError, match=r"previous-token head L1H0 must be in an earlier layer than the induction "
                                         r"head L0H2 .*swapped"):
        interp.phase_measures(model, heads=("L1H0", "L0H2"))
    with pytest.warns(RuntimeWarning, match="in one layer"):
        out = interp.phase_measures(model, heads=("L1H0", "L1H2"))
    assert "K-composition (x random)" not in out
    with pytest.raises(ValueError, match=r"heads must be \(previous-token head, induction head\)"):
        interp.phase_measures(model, heads="L0H0")
    ok = interp.phase_measures(model, heads=((0, 1), Head(1, 2)))
    assert ok == interp.phase_measures(model, heads=("L0H1", "L1H2"))


def test_frames_label_heads_from_their_integer_columns(model):
    comp = interp.composition_scores(model, "k")
    assert (comp.sender == [head_label(l, h) for l, h in zip(comp.sender_layer, comp.sender_head)]).all()
    assert (comp.receiver == [head_label(l, h) for l, h in zip(comp.receiver_layer, comp.receiver_head)]).all()
    for frame in (interp.ov_copying_scores(model), interp.positional_qk_scores(model)):
        assert frame.layer.dtype.kind == "i" and frame["head"].dtype.kind == "i"
        assert (frame.label == [str(Head(l, h)) for l, h in zip(frame.layer, frame["head"])]).all()
    dla = interp.logit_attribution(model, torch.arange(1, 6))
    heads = dla[dla.kind == "head"]
    assert (heads.component == [head_label(l, h) for l, h in zip(heads.layer, heads["head"])]).all()
    z = interp.patch(model, *pair(), metric, site="z", by="head")
    assert (z.label == [head_label(l, h) for l, h in zip(z.layer, z["head"])]).all()


def test_the_induction_circuit_frame_carries_integer_heads(model):
    frame, _ = interp.induction_circuit(model, stories=False, min_score=0.0)
    for role in ("receiver", "sender"):
        assert frame[f"{role}_layer"].dtype.kind == "i" and frame[f"{role}_head"].dtype.kind == "i"
        assert (frame[role] == [head_label(l, h) for l, h in zip(frame[f"{role}_layer"], frame[f"{role}_head"])]).all()
    assert (frame.sender_layer < frame.receiver_layer).all()
