"""Training a tuned lens: the reference recipe of Belrose et al. (2023), on one process or under torchrun.

Per step, one forward of the frozen model caches every stream the lens reads; each translator is then
trained to minimise KL(final output || lens output) at the same position, layer by layer (only one
layer's [tokens, vocab] logits exist at a time). SGD with Nesterov momentum 0.9, learning rate
lr * (1 - momentum) decaying linearly to 0, weight decay 1e-3, gradients clipped to norm 1: the
`tuned-lens` package's defaults. Under `torchrun` each process takes its share of every global batch
and the gradients are averaged over processes (gloo on a CPU), so N processes take the same steps as
one process on the same data.

    torchrun --standalone --nproc_per_node=2 -m interp.lens.train gpt-4 --steps 200 --out lens_dir

This module is the trainer; its settings are one dataclass (`_lens_settings.TunedLensSettings`), its fused
loss is `_lens_loss`, its command line `tuned_lens_cli` (run through `main` here), torchrun's helpers
`_distributed`.
"""
from __future__ import annotations

import contextlib
import time
from typing import Optional

import torch
from jaxtyping import Int
from tqdm.auto import tqdm

from sprout.training.core import clip_grads, reduce_grads, set_lr

from .._core.batching import TextOrTokens, token_rows
from .._core.distributed import join
from .._core.inputs import stream_windows
from .._core.model import HookedModel, unembed
from ..data import model_text
from . import cli as tuned_lens_cli
from ._loss import Scratch, lens_cross_entropy
from .settings import TunedLensSettings, resume_start, schedule_of
from .tuned import TunedLens, lens_comparison

__all__ = ["lens_step", "main", "model_text", "train_tuned_lens"]  # model_text: at home in interp.data


def _batch_rows(n_windows: int, batch_size: int, step: int, seed: int) -> torch.Tensor:
    """The windows of global batch `step`: consecutive slices of a fresh permutation per epoch, so that any
    step's batch is known without replaying the steps before it (resuming, several processes)."""
    start = step * batch_size
    idx: list[int] = []
    while len(idx) < batch_size:
        epoch, offset = divmod(start + len(idx), n_windows)
        perm = torch.randperm(n_windows, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))
        idx.extend(perm[offset:offset + batch_size - len(idx)].tolist())
    return torch.tensor(idx)


@contextlib.contextmanager
def _frozen(model: HookedModel):
    """The model's parameters do not require grad inside (gradients flow through the unembedding into the
    translators only, and nothing lands in the model's .grad); restored after."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    try:
        for p, _ in flags:
            p.requires_grad_(False)
        yield
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)


def lens_step(model: HookedModel, lens: TunedLens, ids: Int[torch.Tensor, "batch pos"], scale: float = 1.0,
              scratch: Optional[Scratch] = None) -> list[float]:
    """Forward of the frozen model once, then each translator's KL(final || lens), backpropagated layer by
    layer (times `scale`). Returns the mean KL per translator (nats). `scratch` keeps the [tokens, vocab]
    buffers from one step to the next."""
    names = lens.sites[:-1]
    scratch = scratch or Scratch()
    with torch.no_grad():
        logits, cache = model.run_with_cache(ids, names_filter=names)
        p, neg_h = scratch.target(logits.float().flatten(0, -2))
    kls = []
    for i, name in enumerate(names):
        resid = cache[name].flatten(0, -2)
        cross = lens_cross_entropy(model, lens(i, resid), p, scratch)  # KL = cross - H(p)
        (cross * scale).backward()
        kls.append((cross.detach() + neg_h).item())
    return kls


def train_tuned_lens(model: HookedModel, data: TextOrTokens, steps: int = 250, batch_size: int = 8, seq_len: Optional[int] = None,
                     lr: float = 1.0, momentum: float = 0.9, weight_decay: float = 1e-3, grad_clip: float = 1.0,
                     seed: int = 0, lens: Optional[TunedLens] = None, held_out: Optional[TextOrTokens] = None,
                     progress: bool = True, data_name: Optional[str] = None, stop_at: Optional[int] = None) -> TunedLens:
    """Train a tuned lens for `model` (which stays frozen), or resume `lens` up to `steps`.

    Args:
        model: a hooked model (Sprout, the walkthrough GPT).
        data: text, a list of texts or ids [pos] / [batch, pos]: the model's own kind of text; cut into
            windows of `seq_len` (default the model's context), `batch_size` windows per step (the global
            batch: under torchrun each of N processes takes batch_size / N of them).
        steps: total optimizer steps (a resumed lens continues from `lens.step`).
        lr, momentum, weight_decay, grad_clip: the recipe; SGD's learning rate is lr * (1 - momentum),
            decayed linearly to 0 over `steps`; grad_clip 0 means no clipping. Every setting is checked
            before any work (`interp.lens.settings.TunedLensSettings`: lr > 0, momentum in [0, 1), ...).
        seed: the order in which windows are drawn.
        lens: a lens for this model to resume (its step and optimizer state are kept on it): the steps,
            batch_size, seq_len, lr, momentum, weight_decay, grad_clip, seed and data must be the ones it
            was trained with, or it is refused. A lens loaded from a file keeps no optimizer state: it
            restarts the schedule at step 0 from its translators (with a warning).
        held_out: data to measure the per-layer KL on at the end (recorded in `lens.info`).
        stop_at: stop after this many steps of the `steps`-step schedule (resume later with `lens=`).

    Returns:
        The trained TunedLens; `lens.info` records the recipe, data, steps, tokens/s and held-out KL.
    """
    settings = TunedLensSettings(steps=steps, batch_size=batch_size, seq_len=seq_len, lr=lr, momentum=momentum,
                                 weight_decay=weight_decay, grad_clip=grad_clip, seed=seed, stop_at=stop_at)
    if lens is not None and not isinstance(lens, TunedLens):
        raise TypeError(f"lens must be an interp.TunedLens to resume, got {type(lens).__name__}")
    # training needs autograd even when called under torch.no_grad() or torch.inference_mode() (whose
    # tensors could not be updated later)
    with torch.inference_mode(False), torch.enable_grad():
        return _train(model, data, settings, lens, held_out, progress, data_name)


def _start(model: HookedModel, data, s: TunedLensSettings, lens: Optional[TunedLens], world: int):
    """The lens, its optimizer (state restored on an exact resume), the windows and the first step."""
    if s.batch_size % world:
        raise ValueError(f"batch_size must be a positive multiple of the {world} processes, got {s.batch_size}")
    if lens is None:
        lens = TunedLens(model).to(model.cfg.device)
    else:
        lens.check_model(model, "the lens to resume")
    dtype = next(model.parameters()).dtype
    unembed(model, torch.zeros(1, int(model.cfg.d_model), device=model.cfg.device, dtype=dtype))  # fails early on a model it cannot read
    rows = stream_windows(model, data, s.seq_len)
    schedule = schedule_of(s, rows)
    start = resume_start(lens, schedule)
    opt = torch.optim.SGD(lens.parameters(), lr=s.lr * (1 - s.momentum), momentum=s.momentum,
                          nesterov=s.momentum > 0, weight_decay=s.weight_decay)
    if start > 0:
        assert lens.optimizer_state is not None  # resume_start is 0 without it
        opt.load_state_dict(lens.optimizer_state)
    lens.info["schedule"] = schedule
    return lens, opt, rows, start


def _train(model: HookedModel, data: TextOrTokens, s: TunedLensSettings, lens: Optional[TunedLens], held_out, progress: bool,
           data_name: Optional[str]) -> TunedLens:
    world, rank = join()  # the trainer starts the process group (if torchrun asks for one); queries never do
    if held_out is not None:
        token_rows(model, held_out)  # checked before training, not after it
    lens, opt, rows, start = _start(model, data, s, lens, world)
    steps, batch_size, lr, momentum, seed = s.steps, s.batch_size, s.lr, s.momentum, s.seed
    lens.train()
    t0, kls, scratch = time.perf_counter(), [], Scratch()
    end = steps if s.stop_at is None else min(s.stop_at, steps)
    bar = tqdm(range(start, end), initial=start, total=steps, desc="tuned lens", disable=not progress or rank != 0)
    with _frozen(model):
        for step in bar:
            set_lr(opt, lr * (1 - momentum) * (1 - step / steps))
            ids = rows[_batch_rows(len(rows), batch_size, step, seed)]
            share = batch_size // world
            kls = lens_step(model, lens, ids[rank * share:(rank + 1) * share].to(model.cfg.device), scratch=scratch)
            reduce_grads(lens.parameters(), world)  # the mean over processes
            clip_grads(lens.parameters(), s.grad_clip)  # 0: no clipping
            opt.step()
            opt.zero_grad(set_to_none=True)
            lens.step = step + 1
            bar.set_postfix(kl=f"{sum(kls) / len(kls):.3f}")
    seconds = time.perf_counter() - t0
    lens.eval()
    lens.optimizer_state = opt.state_dict()
    lens.info.update(recipe=dict(batch_size=batch_size, seq_len=rows.shape[1], lr=lr, momentum=momentum,
                                 weight_decay=s.weight_decay, grad_clip=s.grad_clip, seed=seed,
                                 optimizer="SGD nesterov" if momentum > 0 else "SGD", schedule="linear to 0"),
                     steps=steps, data=data_name or f"{rows.numel()} tokens", train_kl=kls, train_seconds=seconds,
                     tokens_per_s=(lens.step - start) * rows[:batch_size].numel() / seconds if lens.step > start else None)
    if held_out is not None:
        cmp = lens_comparison(model, held_out, lens)
        tuned = cmp[cmp.lens == "tuned"]
        lens.info["held_out_kl"] = {str(layer): kl for layer, kl in zip(tuned.layer, tuned.kl_to_final)}
    return lens


def main(argv: Optional[list[str]] = None) -> None:
    """`python -m interp.lens.train`: the command line of `interp.lens.cli`, training with
    `train_tuned_lens`."""
    tuned_lens_cli.main(argv, train_tuned_lens)


if __name__ == "__main__":
    main()
