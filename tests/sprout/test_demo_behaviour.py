"""What the shipped demo models must show (the demo-models issue), measured on the shipped weights.

The stories below are written for this test by hand: their sentence frames come from no generator and
their names from no syllable table, so a model can only predict a name's later pieces by copying them
from the name's first occurrence (induction). They differ from the ones in sprout/demo/measure.py,
which the README's numbers come from.
"""
import pytest
import torch

import sprout
from sprout.demo import measure

STORIES = [
    ("harbour", ["Trembalow", "Quisselva"],
     "At the harbour, a fisherman called Trembalow mended his nets beside his friend Quisselva. When the "
     "tide turned, Trembalow shouted to Quisselva, and Quisselva waved back from the pier. That night "
     "Trembalow cooked the fish while Quisselva told old stories, and Trembalow laughed until Quisselva "
     "fell asleep."),
    ("museum", ["Obrenthal", "Vashkerrin"],
     "Our guide, Obrenthal, stopped in front of a painting by Vashkerrin. Obrenthal told us that "
     "Vashkerrin had finished it in a single week. A boy asked Obrenthal whether Vashkerrin was still "
     "alive; Obrenthal shook his head and said that Vashkerrin died poor."),
    ("garden", ["Pellindrose", "Mubbleforth"],
     "Behind the old mill grew a rare flower, the Pellindrose. Each dawn the gardener Mubbleforth watered "
     "the Pellindrose by hand. Thieves came for the Pellindrose one autumn, but Mubbleforth chased them "
     "off, and the Pellindrose bloomed for Mubbleforth alone."),
    ("radio", ["Kestrawine", "Dolbrecht"],
     "This is Kestrawine calling the northern station. Kestrawine to Dolbrecht, do you hear me? Dolbrecht "
     "here, Kestrawine, loud and clear. Good, Dolbrecht, the convoy leaves at six; Kestrawine out."),
]


@pytest.fixture(scope="module")
def results():
    torch.manual_seed(0)
    out = {}
    for name in ("gpt-1", "gpt-4"):
        model = sprout.load(name).eval()
        seq = measure.repeated_tokens(model)
        with torch.no_grad():
            nll = measure._nll(model(seq, return_type="logits"), seq)
        induction, prev = measure.head_scores(model, seq)
        out[name] = dict(model=model, seq=seq, first=nll[:, :measure.HALF - 1].mean().item(),
                         second=nll[:, measure.HALF:].mean().item(), induction=induction, prev=prev,
                         name_prob=measure.name_piece_probability(model, STORIES)[0])
    return out


def test_gpt4_copies_names_in_unseen_frames_and_gpt1_cannot(results):
    assert results["gpt-4"]["name_prob"] >= 0.8
    assert results["gpt-1"]["name_prob"] < 0.2


def test_second_half_of_repeated_random_tokens(results):
    g4, g1 = results["gpt-4"], results["gpt-1"]
    assert g4["second"] <= 0.3 * g4["first"]
    assert g1["second"] >= 3 * g4["second"]


def test_gpt4_has_an_induction_head_whose_ablation_hurts_and_an_earlier_previous_token_head(results):
    g4 = results["gpt-4"]
    induction, prev = g4["induction"], g4["prev"]
    layer, head = divmod(int(induction.argmax()), induction.size(1))
    assert layer >= 1 and induction[layer, head] >= 0.4
    ablated = measure.second_half_loss(g4["model"], g4["seq"], ablate=(layer, head))
    assert ablated > g4["second"] + 1.0
    assert prev[:layer].max() >= 0.4  # a previous-token head in a layer below the induction head


def test_gpt4_loss_on_held_out_stories_is_below_gpt1s(results):
    g4 = measure.held_out_loss(results["gpt-4"]["model"], n_chars=40_000)
    g1 = measure.held_out_loss(results["gpt-1"]["model"], n_chars=40_000)
    assert g4 < g1 - 0.3


def test_residual_stream_grows_through_the_blocks(results):
    model = results["gpt-4"]["model"]
    rms = measure.residual_rms(model, results["gpt-4"]["seq"])
    assert rms[-1] > 10 * rms[0]
    assert rms[-1] == max(rms)
