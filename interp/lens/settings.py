"""The tuned-lens trainer's settings, checked as `sprout train` checks its recipe (`sprout.settings`), and
the rule for resuming: the same settings and the same data, or an error naming what changed."""
from __future__ import annotations

import hashlib
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import torch
from jaxtyping import Int

from sprout.settings import Checked
from sprout.training.core import resume_changes

if TYPE_CHECKING:
    from .tuned import TunedLens

# what each field must be, in the words of the errors (the type and the range together)
_WORDS = {
    "steps": "a positive int", "batch_size": "a positive int", "seq_len": "a positive int or None",
    "lr": "a finite number > 0", "momentum": "a number in [0, 1)", "weight_decay": "a finite number >= 0",
    "grad_clip": "a finite number >= 0 (0: no clipping)", "seed": "an integer in [0, 2**32 - 1]",
    "stop_at": "an integer >= 0 or None",
}


@dataclass(frozen=True)
class TunedLensSettings(Checked):
    """`train_tuned_lens`' numbers (the tuned-lens package's defaults)."""

    steps: int = 250  # optimizer steps of the whole schedule
    batch_size: int = 8  # windows per step (the global batch under torchrun)
    seq_len: Optional[int] = None  # tokens per window; None: the model's context
    lr: float = 1.0  # SGD's learning rate is lr * (1 - momentum), decayed linearly to 0
    momentum: float = 0.9  # Nesterov momentum (0: plain SGD)
    weight_decay: float = 1e-3
    grad_clip: float = 1.0  # max gradient norm; 0 = no clipping
    seed: int = 0  # the order windows are drawn in
    stop_at: Optional[int] = None  # stop after this many steps of the schedule (resume later)

    RANGES = {"steps": (1, None, "["), "batch_size": (1, None, "["), "seq_len": (1, None, "["), "lr": (0, None, "("),
              "momentum": (0, 1, "[)"), "weight_decay": (0, None, "["), "grad_clip": (0, None, "["),
              "seed": (0, 2**32 - 1, "[]"), "stop_at": (0, None, "[")}
    WHAT = "train_tuned_lens settings"

    @classmethod
    def bad(cls, name: str, expected: str, value: object) -> ValueError:
        return ValueError(f"train_tuned_lens: {name} must be {_WORDS.get(name, expected)}, got {value!r}")


# the settings an exact resume needs unchanged (stop_at only says where this call ends)
SCHEDULE = ("steps", "batch_size", "seq_len", "lr", "momentum", "weight_decay", "grad_clip", "seed")


def data_stamp(rows: Int[torch.Tensor, "n_windows pos"]) -> str:
    """The training windows [n_windows, seq_len] in a few words, with the sha256 of their ids."""
    rows = rows.detach().cpu().long().contiguous()
    digest = hashlib.sha256(f"{tuple(rows.shape)}|".encode() + rows.numpy().tobytes()).hexdigest()[:16]
    return f"{rows.shape[0]} windows of {rows.shape[1]} tokens, sha256 {digest}"


def schedule_of(settings: TunedLensSettings, rows: Int[torch.Tensor, "n_windows pos"]) -> dict:
    """What a lens records of its training, so that a resume can be checked against it."""
    return {**{k: getattr(settings, k) for k in SCHEDULE}, "seq_len": int(rows.shape[1]), "data": data_stamp(rows)}


def resume_start(lens: TunedLens, now: dict) -> int:
    """The step to continue from: lens.step when the lens was trained with the same schedule and data and
    carries its optimizer state; 0 (with a warning) for a lens without it (loaded from a file).

    Raises:
        ValueError: the lens' schedule or data differ from this call's (as `sprout train --resume`).
    """
    if lens.step == 0:
        return 0
    if lens.optimizer_state is None:
        warnings.warn(f"this lens is at step {lens.step} but carries no optimizer state (a saved lens keeps only its "
                      "translators): training restarts the schedule at step 0 from its translators", RuntimeWarning,
                      stacklevel=4)
        lens.step = 0
        return 0
    was = lens.info.get("schedule")
    if was is None:
        raise ValueError(f"cannot resume this lens at step {lens.step}: it records no schedule to check the resume against")
    diff = resume_changes(was, now, was="lens has")
    if diff:
        raise ValueError(f"cannot resume this lens at step {lens.step}: the settings differ from the ones it was "
                         f"trained with ({', '.join(diff)}); resume with the same steps, batch_size, seq_len, lr, "
                         "momentum, weight_decay, grad_clip, seed and data, or train a new lens")
    return lens.step
