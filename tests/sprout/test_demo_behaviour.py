"""What the shipped demo models must show, measured on the shipped weights with the README's functions and
settings (`experiments.demo_table`, the `demo_measurements` fixture), plus stories of this test's own.

The stories below are written for this test by hand: their sentence frames come from no generator, and
their names are ones the corpus generator cannot draw (asserted below from its syllable tables), so a
model can only predict a name's later pieces by copying them from the name's first occurrence.
"""
import random
import re

import pytest

from experiments import demo_table
from sprout import material

STORIES = [
    ("harbour", ["Trembalow", "Sigfrund"],
     "At the harbour, a fisherman called Trembalow mended his nets beside his friend Sigfrund. When the "
     "tide turned, Trembalow shouted to Sigfrund, and Sigfrund waved back from the pier. That night "
     "Trembalow cooked the fish while Sigfrund told old stories, and Trembalow laughed until Sigfrund "
     "fell asleep."),
    ("museum", ["Thorbjelm", "Vashkerrin"],
     "Our guide, Thorbjelm, stopped in front of a painting by Vashkerrin. Thorbjelm told us that "
     "Vashkerrin had finished it in a single week. A boy asked Thorbjelm whether Vashkerrin was still "
     "alive; Thorbjelm shook his head and said that Vashkerrin died poor."),
    ("garden", ["Eldrisk", "Mubbleforth"],
     "Behind the old mill grew a rare flower, the Eldrisk. Each dawn the gardener Mubbleforth watered "
     "the Eldrisk by hand. Thieves came for the Eldrisk one autumn, but Mubbleforth chased them "
     "off, and the Eldrisk bloomed for Mubbleforth alone."),
    ("radio", ["Corwendt", "Dolbrecht"],
     "This is Corwendt calling the northern station. Corwendt to Dolbrecht, do you hear me? Dolbrecht "
     "here, Corwendt, loud and clear. Good, Dolbrecht, the convoy leaves at six; Corwendt out."),
]


def test_the_drawability_check_accepts_every_name_the_generator_draws():
    rng = random.Random(0)
    words = {w for _ in range(3000) for w in material.random_name(rng).split()}
    assert all(material.generator_can_draw(w) for w in words)
    assert material.generator_can_draw("Zorbin") and material.generator_can_draw("Quorvath")  # qu-o-r, v-a-th


@pytest.mark.parametrize("stories", [STORIES, demo_table.STORIES], ids=["this test's", "the README's"])
def test_the_held_out_names_cannot_be_drawn_by_the_generator(stories):
    names = [n for _, ns, _ in stories for n in ns]
    assert [n for n in names if material.generator_can_draw(n)] == []
    corpus = material.generate_corpus(300_000, seed=0)  # the demos' corpus seed: none of them occurs in it
    assert [n for n in names if n in corpus] == []


def test_gpt4_copies_names_in_unseen_frames_and_gpt1_cannot(demo_measurements):
    assert demo_table.name_piece_probability(demo_measurements["gpt-4"][0], STORIES)[0] >= 0.8
    assert demo_table.name_piece_probability(demo_measurements["gpt-1"][0], STORIES)[0] < 0.2


def test_second_copy_of_repeated_random_tokens(demo_measurements):
    (g4_first, g4_second, uniform), g1 = demo_measurements["gpt-4"][1]["repeat"], demo_measurements["gpt-1"][1]["repeat"]
    assert g4_second <= 0.3 * g4_first and g4_second < 0.2 * uniform
    assert g1[1] >= 3 * g4_second


def test_gpt4_has_an_induction_head_whose_ablation_hurts_and_an_earlier_previous_token_head(demo_measurements):
    m = demo_measurements["gpt-4"][1]
    (ind, score), (prev, prev_score) = m["induction"], m["prev"]
    layer = lambda label: int(re.fullmatch(r"L(\d+)H\d+", label).group(1))  # noqa: E731
    assert layer(ind) >= 1 and score >= 0.4
    assert m["ablation"][1] > 1.0  # the top three together: the English gpt-4's induction heads back each other up
    assert layer(prev) < layer(ind) and prev_score >= 0.4  # a previous-token head in a layer below


def test_gpt4_loss_on_held_out_stories_is_below_gpt1s(demo_measurements):
    assert demo_measurements["gpt-4"][1]["loss"] < demo_measurements["gpt-1"][1]["loss"] - 0.3


def test_residual_stream_grows_through_the_blocks(demo_measurements):
    rms = demo_measurements["gpt-4"][1]["rms"]
    assert rms[-1] > 10 * rms[0] and rms == sorted(rms)
