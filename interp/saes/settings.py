"""The settings of an SAE or transcoder training run: one frozen `sprout.settings.Checked` dataclass, every
field type- and range-checked on creation (as `sprout train` checks its recipe).

A run records its settings in each dictionary's `info` and in its checkpoint; resuming with other
settings is refused (as `sprout train --resume` refuses another recipe). An error names the field and
the value. Defaults follow the papers' recipes scaled to small models on a CPU: Adam, learning rate
2e-4 / sqrt(d_sae / 2^14) (sparsify's rule), a linear warmup, then linear decay to 0 over the last
fifth (Conerly et al. 2024), inputs scaled to mean norm sqrt(d_in) (SAELens' "expected_average_only_in",
folded back into the weights at the end), AuxK with coefficient 1/32 and k_aux = d_in / 2 (Gao et al.).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Optional

import torch

from sprout.settings import Checked, range_error, type_error

from .kinds import KIND_NAMES, TOPK_KINDS, check_widths, default_k

B_DEC_INITS = ("geometric_median", "mean", "zeros")
_POSITIVE, _NON_NEGATIVE = (1, None, "["), (0, None, "[")


class SettingsError(ValueError, TypeError):
    """A training setting of the wrong type or out of range (the message names the field and the value)."""


class TrainingDiverged(RuntimeError):
    """A run whose weights became NaN or infinite: stopped, naming the step and the dictionary."""


COUNT = ("int", (1, None, "["))  # an argument that counts something: an integer >= 1


def check_args(where: str, **args: tuple) -> None:
    """Refuse the first argument of the wrong type or out of range, as `Checked` refuses a field: each keyword
    is `name=(value, kind, rule)` with `kind` "int", "Optional[float]" ... and `rule` a range (or None)."""
    for name, (value, kind, rule) in args.items():
        expected = type_error(kind, value) or range_error(rule, value)
        if expected:
            raise SettingsError(f"{where}: {name} must be {expected}, got {value!r}")


def check_run(steps: object, stop_at: object, every: object, resume: object, progress: object) -> None:
    """The run's own arguments, checked before any work: stop_at in 1..steps, checkpoint_every >= 1,
    resume and progress booleans (a string such as "no" is not False)."""
    for name, value, kind, rule in (("stop_at", stop_at, "Optional[int]", (1, steps, "[]") if isinstance(steps, int) else None),
                                    ("checkpoint_every", every, "Optional[int]", (1, None, "[")),
                                    ("resume", resume, "bool", None), ("progress", progress, "bool", None)):
        bad = type_error(kind, value) or range_error(rule, value)
        if bad:
            raise SettingsError(f"{name} must be {bad}" + (f" (steps={steps})" if name == "stop_at" else "")
                                + f", got {value!r}")


@dataclass(frozen=True)
class TrainSettings(Checked):
    kind: str = "topk"                      # relu | topk | batchtopk | jumprelu | matryoshka
    d_sae: int = 512                        # latents
    k: Optional[int] = None                 # latents per row, for the TopK kinds; None: min(32, d_sae)
    target_l0: Optional[float] = None       # relu / jumprelu: steer the sparsity coefficient to this L0
    steps: int = 2000                       # optimizer steps
    lr: Optional[float] = None              # Adam's peak learning rate; None: 2e-4 / sqrt(d_sae / 2^14)
    batch_size: int = 4096                  # activations per step, over all processes
    seed: int = 0                           # initialisation and the order of the data
    warmup_steps: Optional[int] = None      # linear warmup; None: steps // 20
    decay_fraction: float = 0.2             # the last fraction of the steps decays the lr linearly to 0
    sparsity_coefficient: Optional[float] = None  # L1 (relu) / L0 (jumprelu) weight; None: the kind's default
    aux_k_coefficient: float = 1 / 32       # AuxK's weight (TopK kinds)
    aux_k: Optional[int] = None             # dead latents AuxK uses per row; None: d_in // 2
    dead_tokens: Optional[int] = None       # a latent unfired for this many tokens is dead; None: max(10 batches, 100k)
    threshold_lr: float = 0.01              # BatchTopK: the inference threshold's moving-average rate
    bandwidth: float = 0.05                 # JumpReLU: the straight-through kernel's width
    widths: Optional[tuple] = None          # Matryoshka's prefix sizes; None: d_sae/4, d_sae/2, d_sae
    grad_clip: float = 1.0                  # gradient norm clip; 0 means no clipping
    b_dec_init: str = "geometric_median"    # geometric_median | mean | zeros (of the first batch)
    normalize: bool = True                  # scale inputs to mean norm sqrt(d_in) while training
    skip: bool = False                      # transcoders: a linear skip W_skip
    seq_len: Optional[int] = None           # model sources: window length; None: the model's context
    harvest_batch: int = 16                 # model sources: windows per forward
    buffer_tokens: int = 1 << 15            # model sources: activations harvested and shuffled at a time

    RANGES = {"kind": frozenset(KIND_NAMES), "d_sae": _POSITIVE, "k": _POSITIVE, "target_l0": (0, None, "("),
              "steps": _POSITIVE, "lr": (0, None, "("), "batch_size": _POSITIVE, "seed": _NON_NEGATIVE,
              "warmup_steps": _NON_NEGATIVE, "decay_fraction": (0, 1, "[]"), "sparsity_coefficient": _NON_NEGATIVE,
              "aux_k_coefficient": _NON_NEGATIVE, "aux_k": _POSITIVE, "dead_tokens": _POSITIVE,
              "threshold_lr": (0, 1, "(]"), "bandwidth": (0, None, "("), "grad_clip": _NON_NEGATIVE,
              "b_dec_init": frozenset(B_DEC_INITS), "seq_len": _POSITIVE, "harvest_batch": _POSITIVE,
              "buffer_tokens": _POSITIVE}
    WHAT = "SAE training settings"

    def __post_init__(self):
        # Checked's checks, but widths (a tuple, which Checked's types do not cover) is checked in check_together
        for f in fields(self):
            value = getattr(self, f.name)
            expected = None if f.name == "widths" else type_error(f.type, value)
            expected = expected or range_error(self.RANGES.get(f.name), value)
            if expected:
                raise self.bad(f.name, expected, value)
        self.check_together()

    @classmethod
    def bad(cls, name: str, expected: str, value: object) -> SettingsError:
        return SettingsError(f"{name} must be {expected}, got {value!r}")

    def check_together(self) -> None:
        if self.kind in TOPK_KINDS:
            k = default_k(self.d_sae) if self.k is None else self.k
            object.__setattr__(self, "k", k)  # frozen: a default k is resolved once, as it is stored
            if k > self.d_sae:
                raise self.bad("k", f"in 1..d_sae={self.d_sae}", k)
        elif self.k is not None:
            raise SettingsError(f"k is for the TopK kinds; kind {self.kind!r} takes target_l0, got k={self.k!r}")
        if self.target_l0 is not None and self.kind in TOPK_KINDS:
            raise SettingsError(f"target_l0 is for relu and jumprelu (kind {self.kind!r} has k)")
        self._check_widths()

    def _check_widths(self) -> None:
        if self.widths is None:
            return
        if self.kind != "matryoshka":
            raise SettingsError(f"widths are Matryoshka's prefix sizes; kind {self.kind!r} has none")
        if isinstance(self.widths, (str, bytes)) or not hasattr(self.widths, "__iter__"):
            raise SettingsError(f"widths must be a list of ints, got {self.widths!r}")
        try:
            check_widths(list(self.widths), self.d_sae)
        except (TypeError, ValueError) as e:
            raise SettingsError(f"widths: {e}") from e
        object.__setattr__(self, "widths", tuple(self.widths))

    def peak_lr(self) -> float:
        return self.lr if self.lr is not None else 2e-4 / math.sqrt(self.d_sae / 2 ** 14)

    def lr_at(self, step: int) -> float:
        """Linear warmup over warmup_steps, constant, then linear decay to 0 over the last decay_fraction."""
        warm = self.steps // 20 if self.warmup_steps is None else self.warmup_steps
        decay_start = self.steps * (1 - self.decay_fraction)
        scale = min(1.0, (step + 1) / warm) if warm > 0 else 1.0
        if step >= decay_start and self.decay_fraction > 0:
            scale *= max(0.0, (self.steps - step) / (self.steps - decay_start))
        return self.peak_lr() * scale

    def coefficient(self) -> float:
        if self.sparsity_coefficient is not None:
            return self.sparsity_coefficient
        return {"relu": 1.0, "jumprelu": 1.0}.get(self.kind, 0.0)

    def dead_after(self) -> int:
        return self.dead_tokens if self.dead_tokens is not None else max(10 * self.batch_size, 100_000)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["widths"] = list(self.widths) if self.widths is not None else None
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "TrainSettings":
        unknown = sorted(set(d) - {f.name for f in fields(cls)})
        if unknown:
            raise SettingsError(f"unknown training settings {unknown}; known: {', '.join(f.name for f in fields(cls))}")
        return cls(**d)


def check_finite(units: list, step: int, s: TrainSettings) -> None:
    """Stop a run that diverged (a NaN or infinite weight) instead of returning a dictionary that will not load."""
    for u in units:
        bad = [n for n, p in u.sae.named_parameters() if not torch.isfinite(p).all()]
        if bad:
            where = f" at {u.hook_in!r}" if u.hook_in else ""
            raise TrainingDiverged(f"training diverged at step {step + 1} of {s.steps}: the {u.sae.kind} dictionary{where} "
                                   f"has NaN or infinite {', '.join(bad)} (peak lr {s.peak_lr():.3g}); lower lr= or keep "
                                   "grad_clip > 0, and start again (no checkpoint was written after the divergence)")
