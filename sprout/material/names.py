"""Invented names and nonsense words: strings of random syllables, which no model has seen before.

A name's later pieces can only be predicted by copying them from its first occurrence, which is what
the induction probes measure. `generator_can_draw` says whether a word could come out of the generator
(a hand-written story's names must not).
"""
from __future__ import annotations

import functools
import random
import re

from .vocabulary import CODAS, FIXED, ONSETS, VOWELS


def syllables(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(ONSETS) + rng.choice(VOWELS) + rng.choice(CODAS) for _ in range(n))


def random_name(rng: random.Random) -> str:
    """An invented, capitalised name of 2-4 random syllables (mostly 2), 30% of the time with a
    second word of 1-2 syllables, like "Zorbin Plax"."""
    name = ""
    while len(name) < 4:  # no "Ai" or "Oe": too short to need copying
        name = syllables(rng, rng.choice((2, 2, 2, 3, 3, 4))).capitalize()
    if rng.random() < 0.3:
        second = ""
        while len(second) < 3:
            second = syllables(rng, rng.choice((1, 1, 2))).capitalize()
        name += " " + second
    return name


def nonsense_words(rng: random.Random, lo: int, hi: int) -> str:
    return " ".join(syllables(rng, rng.randint(1, 3)) for _ in range(rng.randint(lo, hi)))


@functools.lru_cache(maxsize=None)
def _syllable_set() -> frozenset:
    return frozenset(o + v + c for o in ONSETS for v in VOWELS for c in CODAS if o + v + c)


@functools.lru_cache(maxsize=None)
def _fixed_text() -> str:
    """Every word the generator writes from its own tables: frames, word lists, places, times."""
    return "\n".join(s for table in FIXED for s in table)


def generator_can_draw(word: str) -> bool:
    """Could the corpus generator write `word`? (True also when unsure: a False is a proof.)

    The generator writes the words of its frames and word lists; invented names and nonsense words,
    which are strings of syllables (onset + vowel + coda from its tables) capitalised at most at the
    first letter; and codes and random strings, each all upper or all lower case. So a word in mixed
    case that is in none of its tables can come only from syllables, which this checks for any number
    of them.
    """
    if not word.isalpha() or word in (word.upper(), word.lower()) or re.search(rf"\b{word}\b", _fixed_text()):
        return True
    if word[1:] != word[1:].lower():  # names are str.capitalize()d: no capital after the first letter
        return False
    w, syllables = word.lower(), _syllable_set()

    @functools.lru_cache(maxsize=None)
    def splits(i: int) -> bool:
        return i == len(w) or any(w.startswith(s, i) and splits(i + len(s)) for s in syllables)

    return splits(0)
