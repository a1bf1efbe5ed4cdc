"""A demo's cross-layer transcoder, trained, measured and shipped: the `clt` step of `python -m experiments.ship`
(`python -m experiments.ship gpt-4 --only clt [--frontier]`; issue 39 item 6).

The recipe (`CltPlan.of`, `experiments.ship.CLT_PLANS`) is the per-layer transcoders' without a skip
(`experiments.ship.ShipPlan`: their width per layer, steps, batch, learning rate and seed, the same training
text; AuxK its own) with k summed over layers, k = n_layers x the per-layer
k, so the CLT spends the per-layer set's L0 per token wherever it likes; BatchTopK, written as JumpReLU (the
same outputs; circuit-tracer reads JumpReLU). `experiments.clt_compare` compares this CLT, as shipped, with
the per-layer set.

Measured on the demo's held-out texts (`experiments.ship.demo_texts`, the per-layer dictionaries' own):
`interp.saes.clt_metrics` on the held-out text (explained variance of each MLP output and of all together,
L0 per token per layer and summed, CE recovered with every MLP replaced against zero and mean ablation), the
dead fraction over the longer dead-fraction text (about 40k tokens), and the shipped per-layer set without a
skip measured beside it on the same text. The targets (`ship_targets.clt_failures`) and what it misses are
recorded in its cfg.json (metadata.sprout.info.held_out) as the per-layer dictionaries record theirs; it is
written to `sprout/demo/<name>/saes/clt/` (`interp.load_clt` finds it) only when it meets them all, or with
`--frontier`, its misses recorded.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

import torch

import interp
from interp import fingerprint
from interp.saes.clt_metrics import clt_dead_fractions, clt_metrics, from_transcoders
from interp.saes.shipped import shipped_clt_folder
from sprout.files import demo_dir

from .ship_swap import SAES, shipped_mb, write_set
from .ship_targets import clt_failures, default_k, train_text

# the "all" row of clt_metrics, kept in cfg.json
KEYS = ("explained_variance", "fvu", "l0", "ce_clean", "ce_spliced", "ce_zero", "ce_mean", "ce_loss_recovered",
        "ce_loss_recovered_mean", "ce_loss_recovered_se", "ce_loss_recovered_mean_se", "kl_spliced", "n_tokens")


@dataclass(frozen=True)
class CltPlan:
    """How a demo's cross-layer transcoder is trained: made by `of` from the per-layer transcoders' plan, so the
    two are compared at one width, step count, batch, learning rate, text and seed."""

    steps: int  # optimizer steps
    expansion: float  # latents per layer, x d_model
    k_per_layer: Optional[int]  # None: ship_targets.default_k(d_model); the CLT's k is this x n_layers
    batch_size: int  # activations per step
    lr: float
    aux_k_coefficient: float  # AuxK's weight (scaled down by n_dead / k_aux while few are dead)
    dead_tokens: int  # AuxK's window: a latent unfired for this many training tokens is dead
    train_chars: int  # the first chars of the demo's training text
    train_mix: str  # how its sources are mixed: "shares" or "equal" (`ship_targets.train_text`)
    seed: int

    @classmethod
    def of(cls, per_layer, **own) -> "CltPlan":
        """The recipe of `per_layer`'s transcoders without a skip (an `experiments.ship.ShipPlan`, its overrides
        aside) for a CLT; `own` sets the CLT's own values (AuxK's weight and window, say)."""
        derived = dict(steps=per_layer.transcoder_steps_of(False), expansion=per_layer.transcoder_width(False),
                       k_per_layer=per_layer.k, batch_size=per_layer.batch_size, lr=per_layer.lr,
                       aux_k_coefficient=per_layer.aux_k_coefficient, dead_tokens=per_layer.dead_tokens,
                       train_chars=per_layer.train_chars, train_mix=per_layer.train_mix_of(False), seed=per_layer.seed)
        return cls(**{**derived, **own})

    def train_args(self, model) -> dict:
        """`interp.train_clt`'s keyword arguments for `model`."""
        d, n = int(model.cfg.d_model), int(model.cfg.n_layers)
        k = default_k(d) if self.k_per_layer is None else self.k_per_layer
        return dict(d_sae=round(self.expansion * d), k=k * n, steps=self.steps, batch_size=self.batch_size, lr=self.lr,
                    seed=self.seed, aux_k_coefficient=self.aux_k_coefficient, dead_tokens=self.dead_tokens)


def train(model, plan: CltPlan, texts: dict) -> interp.CrossLayerTranscoder:
    """The CLT of `plan` trained on `texts`' training text (`experiments.ship.demo_texts`), as JumpReLU, its
    recipe, data and training time in `info`."""
    t0 = time.perf_counter()
    train, desc = train_text(texts, plan.train_chars, plan.train_mix)
    clt = interp.train_clt(model, train, progress=False, **plan.train_args(model))
    clt = clt.to_jumprelu()
    clt.info.update(data=desc, recipe=asdict(plan),
                    train_seconds=time.perf_counter() - t0)
    return clt


def is_recipe(clt: interp.CrossLayerTranscoder, plan: CltPlan) -> bool:
    """Whether `clt` was trained by `plan` (its cfg.json's recipe)."""
    recipe = clt.info.get("recipe")
    # a recipe written before train_mix existed trained on the text in its own shares
    return isinstance(recipe, dict) and {"train_mix": "shares", **recipe} == asdict(plan)


def per_layer_set(model) -> Optional[interp.CrossLayerTranscoder]:
    """The shipped per-layer transcoders without a skip as one CLT (`from_transcoders`), or None when not shipped."""
    try:
        return from_transcoders([interp.load_transcoder(model, l, skip=False) for l in range(int(model.cfg.n_layers))])
    except FileNotFoundError:
        return None


def measure(model, clt: interp.CrossLayerTranscoder, texts: dict) -> dict:
    """The held-out record `ship_targets.clt_failures` reads (see the module docstring)."""
    m = clt_metrics(model, clt, texts["held"])
    total, layers = m[m.layer == "all"].iloc[0], m[m.layer != "all"]
    dead = clt_dead_fractions(model, clt, texts["dead"])
    held = {k: float(total[k]) for k in KEYS}
    held.update(explained_variance_per_layer=layers.explained_variance.tolist(), l0_per_layer=layers.l0.tolist(),
                dead_fraction=float(dead[dead.layer == "all"].dead_fraction.iloc[0]),
                dead_fraction_per_layer=dead[dead.layer != "all"].dead_fraction.tolist(),
                dead_tokens_measured=int(dead[dead.layer == "all"].n_tokens.iloc[0]))
    ref = per_layer_set(model)
    if ref is not None:
        r = clt_metrics(model, ref, texts["held"])
        held.update(per_layer_explained_variance=float(r[r.layer == "all"].explained_variance.iloc[0]),
                    per_layer_ce_loss_recovered_mean=float(r[r.layer == "all"].ce_loss_recovered_mean.iloc[0]),
                    per_layer_l0=float(r[r.layer == "all"].l0.iloc[0]))
    return held


def ship_clt(name: str, model, plan: CltPlan, texts: dict, frontier: bool = False) -> Path:
    """Train, measure and write the demo's CLT to sprout/demo/<name>/saes/clt/ (see the module docstring).

    Raises:
        SystemExit: a target missed without `frontier` (nothing written), or the shipped dictionaries over budget.
    """
    return write(name, model, train(model, plan, texts), texts, frontier)


def remeasure(name: str, model, texts: dict) -> Optional[Path]:
    """Measure the shipped CLT again and rewrite its record (the weights unchanged): its record compares it with
    the shipped per-layer set, so retraining that set leaves the record stale. None when no CLT is shipped."""
    if not shipped_clt_folder(demo_dir() / name).is_dir():
        return None
    return write(name, model, interp.load_clt(model), texts, frontier=True)


def write(name: str, model, clt: interp.CrossLayerTranscoder, texts: dict, frontier: bool) -> Path:
    """Measure `clt` on the held-out texts, record its misses in its info and write it (see `ship_clt`)."""
    held = measure(model, clt, texts)
    miss = clt_failures(held, int(model.cfg.d_model), int(model.cfg.n_layers))
    clt.info["held_out"] = {**held, "data": texts["held_desc"], "misses": miss}  # [] when every target is met
    per = " / ".join(f"{v:.2f}" for v in held["explained_variance_per_layer"])
    print(f"{name} CLT: EV {held['explained_variance']:.3f} (per layer {per}; per-layer set "
          f"{held.get('per_layer_explained_variance', float('nan')):.3f}), CE recovered {held['ce_loss_recovered']:.3f} / "
          f"{held['ce_loss_recovered_mean']:.3f} (zero / mean ablation), L0 {held['l0']:.1f} per token, dead "
          f"{held['dead_fraction']:.1%} over {held['dead_tokens_measured']} tokens, "
          f"{clt.info.get('train_seconds', float('nan')):.0f} s of training"
          + (f"  MISSES: {'; '.join(miss)}" if miss else ""))
    if miss and not frontier:
        raise SystemExit(f"{name}: CLT not shipped, {len(miss)} target(s) missed (--frontier ships it with its misses "
                         "recorded):\n  " + "\n  ".join(miss))
    if clt.model_fingerprint != fingerprint(model):
        raise SystemExit(f"{name}: the CLT is not stamped with the weights' fingerprint")
    folder = shipped_clt_folder(demo_dir() / name)
    write_set(demo_dir() / name / SAES, [(clt, folder)])
    assert torch.equal(interp.load_clt(model).W_enc, clt.W_enc), folder  # what was written is what the loader finds
    print(f"{name}: CLT -> {folder}; all shipped dictionaries {shipped_mb(demo_dir()):.1f} MB")
    return folder
