"""Generated stories: the synthetic text that both training and the analyses read.

The stories are simple English about characters, places and things with invented names (random
syllables, drawn fresh for every story), so the later pieces of a name can only be predicted by
copying them from earlier in the context. A corpus whose only repetition is names teaches a lookup
bound to the sentence templates rather than real induction, so most stories also repeat arbitrary
material: codes, lists of random words read back in order, echoed sentences, chants, random strings
and nonsense songs (see `MIX`). About 45% of the characters lie in a span of 20 or more characters
that occurs twice in its story (`repeated_fraction`).

Training draws its corpus from `generate_corpus` (`sprout.training.corpus`, seed 0); the analyses draw
held-out stories from `generate_story` and `held_out_stories` (a seed no training run uses).
"""
from __future__ import annotations

import random

from .names import nonsense_words, random_name
from .vocabulary import (
    ADJECTIVES,
    ANIMALS,
    CHANT_FRAMES,
    CODE_AGAIN,
    CODE_FIRST,
    COLORS,
    DIGITS,
    ECHO_AGAIN,
    ECHO_FIRST,
    FOODS,
    INTROS,
    JOBS,
    LIST_AGAIN,
    LIST_FIRST,
    LOWER,
    NARRATIVE,
    NOUNS,
    PLACES,
    SONG_AGAIN,
    SONG_FIRST,
    STRING_AGAIN,
    STRING_FIRST,
    TIMES,
    UPPER,
    VERBS,
    WORDS,
)

HELD_OUT_SEED = 20_261_129  # the held-out stories' seed: not the demos' corpus_seed (0), nor any recipe's

# The story kinds and the fraction of stories of each kind. Every story opens by introducing its
# invented names and keeps mentioning them in narrative sentences; a story of a repeating kind
# also holds 2-4 episodes (each of its own kind with probability 0.7, else of a random repeating
# kind) in which a new piece of arbitrary material appears and is later repeated verbatim 1-3
# times, after a gap of 0-3 other sentences.
MIX = {
    "plain": 0.10,  # names only: characters, a place and a thing mentioned again and again
    "code": 0.15,  # door codes like "K7-QX-42", told and typed again
    "list": 0.15,  # random words read out, then read back in the same order
    "echo": 0.15,  # a random sentence said, then repeated word for word
    "chant": 0.15,  # a short line of random or nonsense words chanted several times
    "string": 0.15,  # random letter and digit strings written down and copied later
    "nonsense": 0.15,  # songs of invented words sung and sung back
}
_REPEATING = [k for k in MIX if k != "plain"]
_KINDS, _WEIGHTS = list(MIX), list(MIX.values())


def _random_words(rng: random.Random, lo: int, hi: int) -> list[str]:
    return [rng.choice(WORDS) for _ in range(rng.randint(lo, hi))]


def _code(rng: random.Random) -> str:
    groups = []
    for _ in range(rng.randint(2, 4)):
        alphabet = rng.choice((UPPER, DIGITS, UPPER + DIGITS))
        groups.append("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4))))
    return rng.choice("--/.").join(groups)


def _string(rng: random.Random) -> str:
    form = rng.random()
    if form < 0.3:  # one run of letters and digits
        alphabet = rng.choice((LOWER + DIGITS, UPPER + DIGITS, LOWER))
        return "".join(rng.choice(alphabet) for _ in range(rng.randint(5, 14)))
    if form < 0.55:  # spaced digits
        return " ".join(rng.choice(DIGITS) for _ in range(rng.randint(4, 10)))
    if form < 0.8:  # spaced letters
        alphabet = rng.choice((LOWER, UPPER))
        return " ".join(rng.choice(alphabet) for _ in range(rng.randint(4, 10)))
    return " ".join(str(rng.randint(0, 999)) for _ in range(rng.randint(3, 7)))  # numbers


class _Slots(dict):
    """Fills a sentence frame: the cast's names are fixed, every other slot is drawn on first use
    (and then kept, so a slot used twice in one frame reads the same)."""

    def __init__(self, rng: random.Random, cast: dict):
        super().__init__(cast)
        self.rng = rng

    def __missing__(self, key: str) -> str:
        choice = self.rng.choice
        pool = {"n": NOUNS, "n2": NOUNS, "adj": ADJECTIVES, "adj2": ADJECTIVES, "v": VERBS,
                "color": COLORS, "time": TIMES, "job": JOBS, "animal": ANIMALS, "food": FOODS,
                "place": PLACES}[key]
        self[key] = value = choice(pool)
        return value


def _say(rng: random.Random, cast: dict, frame: str, **extra) -> str:
    slots = _Slots(rng, cast)
    slots.update(extra)
    return frame.format_map(slots)


def _random_sentence(rng: random.Random, cast: dict) -> str:
    # An echoed sentence: a narrative sentence, or a string of random words, either way arbitrary.
    if rng.random() < 0.5:
        return _say(rng, cast, rng.choice(NARRATIVE)).replace('"', "'")  # it goes inside quotes
    return " ".join(_random_words(rng, 4, 10)).capitalize() + rng.choice(".!?")


def _episode(rng: random.Random, cast: dict, kind: str) -> tuple[str, str, list[str]]:
    """One piece of arbitrary material x: (x, the sentence that brings it in, 1-3 that repeat it)."""
    n_again = rng.randint(1, 3)
    if kind == "code":
        x = _code(rng)
        first, again = CODE_FIRST, CODE_AGAIN
    elif kind == "string":
        x = _string(rng)
        first, again = STRING_FIRST, STRING_AGAIN
    elif kind == "list":
        x = rng.choice((", ", ", ", " ", "; ")).join(_random_words(rng, 4, 10))
        first, again = LIST_FIRST, LIST_AGAIN
    elif kind == "echo":
        x = _random_sentence(rng, cast)
        first, again = ECHO_FIRST, ECHO_AGAIN
    elif kind == "nonsense":
        x = nonsense_words(rng, 3, 9)
        first, again = SONG_FIRST, SONG_AGAIN
    else:  # chant: the line itself repeats inside one sentence, and the sentence comes back
        line = (" ".join(_random_words(rng, 2, 5)) if rng.random() < 0.5
                else nonsense_words(rng, 2, 5)).capitalize()
        x = " ".join([line + "!"] * rng.randint(2, 3))
        first, again = CHANT_FRAMES, CHANT_FRAMES
        n_again = rng.randint(1, 2)
    return (x, _say(rng, cast, rng.choice(first), x=x),
            [_say(rng, cast, rng.choice(again), x=x) for _ in range(n_again)])


def generate_story(rng: random.Random) -> str:
    """One story: invented names introduced, then narrative sentences that keep mentioning them,
    interleaved with repetition episodes of the story's kind (drawn from `MIX`).

    Args:
        rng: a `random.Random`; the story is a deterministic function of its state.

    Returns:
        The story, with "\\n" between paragraphs and no blank line inside.
    """
    kind = rng.choices(_KINDS, _WEIGHTS)[0]
    names: list[str] = []
    while len(names) < 5:
        name = random_name(rng)
        names += [name] if name not in names else []
    cast = dict(zip("abcpt", names))  # three characters, a place and a thing
    sents = [_say(rng, cast, frame) for frame in rng.sample(INTROS, 2)]
    sents += [_say(rng, cast, rng.choice(NARRATIVE)) for _ in range(rng.randint(4, 8))]
    if kind != "plain":
        for _ in range(rng.randint(2, 4)):
            ep_kind = kind if rng.random() < 0.7 else rng.choice(_REPEATING)
            _, first, again = _episode(rng, cast, ep_kind)
            i = rng.randint(2, len(sents))  # after the introduction
            sents.insert(i, first)
            for s in again:
                i = rng.randint(i + 1, min(len(sents), i + 4))
                sents.insert(i, s)
    paragraphs, i = [], 0
    while i < len(sents):
        n = rng.randint(3, 6)
        paragraphs.append(" ".join(sents[i:i + n]))
        i += n
    return "\n".join(paragraphs)


def generate_corpus(n_chars: int, seed: int = 0) -> str:
    """Generates stories separated by "\\n\\n" until there are at least `n_chars` characters.

    Args:
        n_chars: the minimum length; the text ends at a story boundary, so it is at most one
            story (about 1-2K characters) longer.
        seed: the same seed gives the same text.

    Returns:
        The corpus as one str.
    """
    rng = random.Random(seed)
    stories, total = [], 0
    while total < n_chars:
        s = generate_story(rng)
        stories.append(s)
        total += len(s) + 2
    return "\n\n".join(stories)


def repeated_fraction(text: str, min_len: int = 20) -> float:
    """The fraction of characters covered by a span of `min_len` characters that occurs at least
    twice in the same story (stories split at "\\n\\n"); both occurrences count."""
    covered = total = 0
    for story in text.split("\n\n"):
        total += len(story)
        first: dict[str, int] = {}
        starts: set[int] = set()
        for i in range(len(story) - min_len + 1):
            j = first.setdefault(story[i:i + min_len], i)
            if j != i:
                starts.add(i)
                starts.add(j)
        end = 0
        for s in sorted(starts):
            covered += min_len - max(0, end - s) if end < s + min_len else 0
            end = max(end, s + min_len)
    return covered / max(total, 1)


def held_out_stories(n_chars: int, seed: int = HELD_OUT_SEED) -> str:
    """About `n_chars` characters of generated stories (whole stories), the same for the same arguments.

    The names are random syllables drawn fresh for every story, so no model has seen them, and the seed
    is not the one the shipped demos trained on (their recipes' `corpus_seed` is 0).
    """
    if n_chars < 1:
        raise ValueError(f"n_chars must be >= 1, got {n_chars}")
    return generate_corpus(n_chars, seed=seed)
