"""Training recipes: every number a training run depends on, in one typed, frozen dataclass.

`sprout train --recipe gpt-4` starts from `RECIPES["gpt-4"]`; any field can be overridden with a flag
(`--lr 1e-3`, `--max-steps 200`). The recipe is written to `OUT/recipe.json`, so a run records exactly
how it was made, and `--resume` refuses to continue a run with a different recipe.

Why the demo recipes differ from the course's gpt-1/gpt-4 (context 512, BPE 8192): they train on two
CPU cores in about half an hour each. A context of 128 tokens holds several sentences of a story, which
is all the induction task needs, and a 4096-token BPE vocabulary makes the unembedding (a quarter of
the compute at this width) twice as cheap while the invented names still split into 2-5 pieces.

The data mix, exactly: each batch is `1 - repeat_fraction` windows of the story corpus
(`sprout.data.generate_corpus`, whose stories repeat names, codes, lists, echoed sentences and chants)
and `repeat_fraction` rows of the induction curriculum of Olsson et al. (2022): random tokens followed
by their exact repeat, in segments of random length `repeat_min`..`repeat_max` laid end to end, with
the loss taken only on the second copies (where copying can predict anything). A share
`repeat_unigram` of the segments draws its tokens from random positions of the corpus (common tokens
in random order), the rest uniformly from the whole vocabulary. Random lengths keep the model from
solving the task with a fixed positional offset instead of prefix matching. For the first
`curriculum_steps` steps every row is curriculum: measured here, mixing stories in from the start left
4-block models on the induction plateau (repeated-half loss at chance) through 800-1,200 steps, while a
pure curriculum lets the previous-token and induction heads form first; the stories then teach the
language, and the copying carries over to names.

Why the common-token segments: Sprout has no position embedding (RoPE only) and no biases, so a head
can only attend "to the previous token" whatever the tokens are once the residual stream carries a
component shared by all tokens. Our first gpt-4 (1,200 steps, uniform segments only) had a clean
previous-token head on story text (0.60) that did nothing on uniformly random tokens (0.07): the
embeddings of tokens the stories rarely use never acquired that shared component, so induction on
random tokens could not start. Segments of common tokens let the induction circuit form on the
tokens whose previous-token attention already works; the uniform segments then train the rest.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from .config import strict_from_dict


@dataclass(frozen=True)
class Recipe:
    """One training run's recipe. Field comments give units; `--field-name` flags override them."""

    # --- model
    model: str = "sprout"  # "sprout" (sprout.model) or "walkthrough" (sprout.walkthrough's character GPT)
    vocab_size: int = 4096  # BPE vocabulary size (a character tokenizer sets its own)
    context: int = 128  # tokens per training window
    n_layer: int = 4
    n_head: int = 3
    d_model: int = 192
    d_ff: int = 512  # SwiGLU hidden width (ignored by the walkthrough GPT, which uses 4 d_model)
    # --- data
    data: str = ""  # a text file, a folder of .txt files or a saved HF dataset; "" = the story generator
    tokenizer: str = "bpe"  # "bpe" (byte-level, trained on the corpus) or "char" (one id per character)
    corpus_chars: int = 20_000_000  # characters of generated stories (when data is "")
    corpus_seed: int = 0  # seed of the story generator
    val_fraction: float = 0.05  # held-out share of the corpus, split at a story boundary
    repeat_fraction: float = 0.25  # share of each batch that is random tokens + their repeat
    repeat_min: int = 8  # shortest random segment of the repeat curriculum, in tokens
    repeat_max: int = 64  # longest
    repeat_unigram: float = 0.0  # share of segments drawn from corpus positions (common tokens), not uniformly
    curriculum_steps: int = 0  # the first steps train on the repeat curriculum alone (every row)
    # --- optimisation
    batch_size: int = 32  # sequences per step (per process under torchrun)
    max_steps: int = 1500
    lr: float = 2e-3  # peak learning rate, reached after warmup_steps
    min_lr: float = 2e-4  # the cosine decay ends here at max_steps
    warmup_steps: int = 100  # linear warmup from lr / warmup_steps
    weight_decay: float = 0.1  # AdamW decay, on matrices only (not on norm gains)
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0  # max global gradient norm
    # --- bookkeeping
    eval_every: int = 100  # steps between held-out evaluations (a CSV row each)
    eval_batches: int = 8  # batches of held-out windows per evaluation (the same windows every time)
    ckpt_every: int = 250  # steps between checkpoints (one is also written at the end)
    snapshots: bool = False  # also keep log-spaced checkpoints (steps 0, 1, 2, 3, 6, 10, 18, 32, ...)
    seed: int = 0  # model init and batch sampling

    def __post_init__(self):
        ints = [f.name for f in fields(self) if f.type == "int"]
        for name in ints:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"recipe field {name} must be an integer, got {value!r}")
        positive = ("vocab_size", "context", "n_layer", "n_head", "d_model", "d_ff", "batch_size",
                    "eval_every", "eval_batches", "ckpt_every", "repeat_min", "corpus_chars")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"recipe field {name} must be >= 1, got {getattr(self, name)}")
        if self.curriculum_steps < 0:
            raise ValueError(f"curriculum_steps must be >= 0, got {self.curriculum_steps}")
        if self.max_steps < 0 or self.warmup_steps < 0:
            raise ValueError(f"max_steps and warmup_steps must be >= 0, got {self.max_steps}, {self.warmup_steps}")
        if self.model not in ("sprout", "walkthrough"):
            raise ValueError(f"recipe field model must be 'sprout' or 'walkthrough', got {self.model!r}")
        if self.tokenizer not in ("bpe", "char"):
            raise ValueError(f"recipe field tokenizer must be 'bpe' or 'char', got {self.tokenizer!r}")
        for name in ("repeat_fraction", "repeat_unigram"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        if not 0 < self.val_fraction < 1:
            raise ValueError(f"val_fraction must be in (0, 1), got {self.val_fraction}")
        if self.repeat_max < self.repeat_min:
            raise ValueError(f"repeat_max ({self.repeat_max}) must be >= repeat_min ({self.repeat_min})")
        if not 0 < self.min_lr <= self.lr:
            raise ValueError(f"need 0 < min_lr <= lr, got min_lr={self.min_lr}, lr={self.lr}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Recipe":
        return strict_from_dict(cls, d, "recipe")

    def override(self, **changes) -> "Recipe":
        return self.from_dict({**self.to_dict(), **changes})


# The CPU demo models. gpt-1 and gpt-4 share data and optimisation: 1,000 steps of the pure repeat
# curriculum (segments of 8-32 tokens; measured: the induction plateau broke near step 550 for gpt-4),
# then 2,200 steps of three quarters stories, one quarter curriculum. Measured beside this recipe at
# step 1,750: half stories (and 1,200 curriculum steps) gave 2.93 nats held out and 0.91 on the names
# of hand-written stories; three quarters stories gave 2.62 and 0.94. The first version of this
# recipe (1,600 steps, 400 of them stories) stopped at 5.09 nats and 0.68: the story phase needs time.
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


def get_recipe(name: str) -> Recipe:
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; choose one of {sorted(RECIPES)}")
    return RECIPES[name]
