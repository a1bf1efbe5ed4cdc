"""Held-out material no training text could hold: names the corpus generator cannot draw, in frames it never wrote.

A feature's description is chosen on one text and scored on another; when both come from the same
generator, a description can fit the generator's habits rather than the feature (issue 38). Here the
names are built around consonant clusters that no syllable of the generator can produce (a coda from
`CODAS` then an onset from `ONSETS` never gives "pt", "gd", "ft" ...), each checked with
`generator_can_draw`, and the sentences are frames written for this module alone: letters, lists,
dialogue and reports, none of which `sprout.material.vocabulary` holds.
"""
from __future__ import annotations

import random

from .names import generator_can_draw

_HEADS = "Ba Ke Mo Tu Ri Da Lu Vo Ne Si Po Ga Fe Ho Ju Wi".split()
_CLUSTERS = "pt gd ft bd kt dv zb pf gn bz tk vd".split()  # no coda + onset of the generator ends in these
_TAILS = "an ora el in usa ek oth ami eru ix".split()

FRAMES = [
    "Dear {a}, I hope this letter finds you well. {b} sends greetings from the coast; {b} misses you. Write soon, {a}!",
    "Shopping list for {a}: flour, lamp oil, string. Ask {b} about the ladder. {a} pays {b} on Friday.",
    "Report: at nine the alarm rang. {a} checked the east door while {b} checked the west. {b} found nothing; {a} found a glove.",
    "{a}: Are you coming tonight, {b}?\n{b}: Only if {a} brings the cards.\n{a}: Fine, {b}, I will.",
    "The committee thanks {a} and {b}. Without {a}, the bridge would never have been repaired by {b}.",
    "Q: Who painted the blue door?\nA: {a} did, with help from {b}.\nQ: And who paid {a}?\nA: {b}.",
    "Minutes of the meeting. Present: {a}, {b}. {a} proposed a new fence. {b} objected. {a} withdrew.",
    "Ticket 42 belongs to {a}. If found, please return it to {b} or to {a} at the inn; {b} keeps the key.",
    "It was {a} who first heard the whistle, and {b} who followed it; {a} stayed behind to wait for {b}.",
    "Weather log, day three. {a} measured the rain. {b} fixed the roof. {a} slept badly; {b} did not.",
    "\"Hand me the rope,\" {a} said. {b} hesitated. \"Now, {b}!\" {a} shouted, and the boat swung free.",
    "Recipe from {a}: boil the beans, add salt. {b} adds pepper, but {a} never does. Ask {b} why.",
]


def unseen_name(rng: random.Random) -> str:
    """A capitalised invented name that `generator_can_draw` proves the corpus generator cannot write."""
    while True:
        name = rng.choice(_HEADS) + rng.choice(_CLUSTERS) + rng.choice(_TAILS)
        if not generator_can_draw(name):
            return name


def unseen_texts(n: int, seed: int = 0) -> list[str]:
    """`n` short texts, each a frame of `FRAMES` with two names from `unseen_name` (each named at least twice)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    rng = random.Random(f"unseen-{seed}")
    out = []
    for i in range(n):
        a = unseen_name(rng)
        b = unseen_name(rng)
        while b == a:
            b = unseen_name(rng)
        out.append(FRAMES[i % len(FRAMES)].format(a=a, b=b))
    return out
