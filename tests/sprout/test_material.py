"""The neutral synthetic text: the story generator and repeated random tokens (sprout.material)."""
import hashlib
import random
import re
from collections import Counter

import pytest
import torch

from sprout.material import (
    HELD_OUT_SEED,
    MIX,
    generate_corpus,
    generate_story,
    held_out_stories,
    random_name,
    repeated_fraction,
    repeated_random_tokens,
    vocabulary,
)
from sprout.material import stories as data


@pytest.fixture(scope="module")
def corpus():
    return generate_corpus(300_000, seed=0)


# ----------------------------------------------------------------------------- generator

def test_corpus_is_deterministic_per_seed():
    assert generate_corpus(30_000, seed=3) == generate_corpus(30_000, seed=3)
    assert generate_corpus(30_000, seed=3) != generate_corpus(30_000, seed=4)
    assert generate_story(random.Random(9)) == generate_story(random.Random(9))


def test_the_text_is_the_one_the_demos_trained_on():
    """Pinned: the same seed gives the same stories, names and tokens as the generator the demos were trained
    with (sprout/synthetic.py before the material package), byte for byte."""
    assert hashlib.sha256(generate_corpus(50_000, seed=0).encode()).hexdigest() == \
        "716a3493adb6eb213be67b27d34aa2022e1d7afb00e719023e83a1c3fcdb09d7"
    assert (random_name(random.Random(0)), random_name(random.Random(1))) == ("Redraindai", "Prikail")
    assert repeated_random_tokens(1, 6, 100, torch.Generator().manual_seed(0)).tolist() == \
        [[99, 19, 57, 70, 53, 70, 99, 19, 57, 70, 53, 70]]


def test_held_out_stories_are_the_generator_at_a_seed_no_demo_trained_on():
    assert held_out_stories(5_000) == generate_corpus(5_000, seed=HELD_OUT_SEED) != generate_corpus(5_000, seed=0)
    with pytest.raises(ValueError, match="n_chars must be >= 1"):
        held_out_stories(0)


def test_corpus_length_and_story_boundaries(corpus):
    assert 300_000 <= len(corpus) < 300_000 + 5_000
    stories = corpus.split("\n\n")
    assert len(stories) > 100
    assert all(s and s == s.strip() and "\n\n" not in s for s in stories)
    assert corpus.isascii()


def test_names_are_invented_and_fresh():
    rng = random.Random(0)
    names = [random_name(rng) for _ in range(2000)]
    assert all(re.fullmatch(r"[A-Z][a-z]+( [A-Z][a-z]+)?", n) for n in names)
    assert len(set(names)) > 1950
    assert 0.2 < sum(" " in n for n in names) / len(names) < 0.4  # some two-word names


def _vocabulary():
    words = set()
    for value in vars(vocabulary).values():
        if isinstance(value, list) and value and isinstance(value[0], str):
            words.update(w.lower() for item in value for w in re.findall(r"[A-Za-z]+", item))
    return words


def test_every_story_mentions_its_names_again(corpus):
    known = _vocabulary()
    for story in corpus.split("\n\n")[:200]:
        names = Counter(w for w in re.findall(r"\b[A-Z][a-z]+\b", story) if w.lower() not in known)
        top = names.most_common(3)
        assert len(top) == 3 and top[2][1] >= 2, story  # several names, each mentioned repeatedly


def test_mix_is_a_distribution_over_handled_kinds():
    assert abs(sum(MIX.values()) - 1) < 1e-9 and "plain" in MIX
    rng = random.Random(5)
    cast = dict(zip("abcpt", (random_name(rng) for _ in range(5))))
    for kind in MIX:
        if kind == "plain":
            continue
        for _ in range(20):
            x, first, again = data._episode(rng, cast, kind)
            assert len(x) >= 3 and x in first and 1 <= len(again) <= 3
            assert all(x in s for s in again), (kind, x, again)


def test_a_large_share_of_the_corpus_is_repeated(corpus, monkeypatch):
    assert 0.38 < repeated_fraction(corpus) < 0.55
    # plain stories repeat only names and the odd template: the episodes do most of the work
    monkeypatch.setattr(data, "_KINDS", ["plain"])
    monkeypatch.setattr(data, "_WEIGHTS", [1.0])
    assert repeated_fraction(generate_corpus(100_000)) < 0.2


def test_repeated_fraction_counts_both_occurrences():
    assert repeated_fraction("abcdefghij xyz abcdefghij", min_len=10) == pytest.approx(20 / 25)
    assert repeated_fraction("abcdefghij xyz\n\nabcdefghij", min_len=10) == 0  # other story
    assert repeated_fraction("the quick brown fox", min_len=5) == 0


# ----------------------------------------------------------------------------- repeated random tokens

def test_repeated_random_tokens():
    x = repeated_random_tokens(16, 50, 300, torch.Generator().manual_seed(0), low=10)
    assert x.shape == (16, 100) and x.dtype == torch.int64
    assert torch.equal(x[:, :50], x[:, 50:])
    assert x.min() >= 10 and x.max() < 300
    assert len(x[:, :50].unique()) > 200  # random, not a constant pattern
    again = repeated_random_tokens(16, 50, 300, torch.Generator().manual_seed(0), low=10)
    assert torch.equal(x, again)
    assert repeated_random_tokens(4, 8, 2, torch.Generator()).eq(1).all()  # default low=1 skips 0
    with pytest.raises(ValueError):
        repeated_random_tokens(2, 4, 10, torch.Generator(), low=10)
