"""Training a cross-layer transcoder on a model's activations, streamed, on the dictionaries' trainer core.

Every step harvests, at the same tokens, each block's MLP input (`blocks.{l}.ln2.hook_normalized`) and
MLP output (`blocks.{l}.hook_mlp_out`) (`harvest.ModelSource`: the same blocks of shuffled windows, the same
per-step batches, the same sharding under torchrun as `train_transcoder`), then takes one step of

    sum over output layers l' of |y_l' - y_hat_l'|^2  +  AuxK (dead latents reconstruct the residual)

summed over rows and divided by the global batch, with each layer's input and output scaled to mean norm
sqrt(d) (per layer: MLP outputs differ in size by an order of magnitude across blocks, and an unscaled sum
would ignore the small ones; the scales are folded into the weights at the end). The latents are BatchTopK's
over every layer's latents together: the k x batch largest pre-activations of the batch, so k is the L0 per
token summed over layers and the CLT chooses which layers spend it; at inference one learned threshold
(`kinds.batchtopk`). Each feature's whole decoder (all its output layers) is kept at unit norm in the scaled
units, its radial gradient removed. The optimizer, gradient reduction over processes and clipping are
`sprout.training.core`'s; checkpoints and their resume checks are `checkpoint`'s, so a resumed run takes the
steps an uninterrupted one would, bit for bit.
"""
from __future__ import annotations

import copy
import math
import time
from typing import Any, Optional, cast

import torch
import torch.nn as nn
from tqdm.auto import tqdm

from sprout.training.core import Adam, clip_grads, reduce_grads, set_lr

from ..._core.distributed import join
from ..._core.identity import PathLike, fingerprint, model_config
from ..._core.inputs import TextOrTokens
from ..._core.model import HookedModel
from ..clt import CrossLayerTranscoder
from ..kinds import batch_threshold
from ..kinds.base import Dictionary
from ..sae import input_hook, output_hook
from ..settings import SettingsError, TrainingDiverged, TrainSettings, check_run
from . import checkpoint as ckpt
from .train import _center, _model_source, _sum


class _Scaled(nn.Module):
    """The CLT in training, with its per-layer input and output scales as buffers (so checkpoints keep them)."""

    def __init__(self, clt: CrossLayerTranscoder) -> None:
        super().__init__()
        self.clt = clt
        self.register_buffer("scale_in", torch.ones(clt.n_layers, dtype=torch.float64))
        self.register_buffer("scale_out", torch.ones(clt.n_layers, dtype=torch.float64))

    scale_in: torch.Tensor
    scale_out: torch.Tensor


class _Unit:
    """What `checkpoint` writes and restores: the module (`sae`), Adam, dead counts, the scalars it records."""

    def __init__(self, clt: CrossLayerTranscoder, s: TrainSettings) -> None:
        self.sae = _Scaled(clt)
        self.opt = Adam(clt.parameters())
        self.scale_in = self.scale_out = 1.0  # the per-layer scales live in `sae`'s buffers
        self.coef = 0.0
        self.since_fired = torch.zeros(clt.n_layers * clt.d_sae, dtype=torch.long)
        self.fvu = self.l0 = float("nan")
        self.layer_fvu: list[float] = []


def train_clt(model: HookedModel, data: TextOrTokens, *, d_sae: Optional[int] = None, k: Optional[int] = None,
              skip: bool = False, steps: int = 2000, lr: Optional[float] = None, batch_size: int = 4096, seed: int = 0,
              checkpoint: Optional[PathLike] = None, checkpoint_every: Optional[int] = None, resume: bool = False,
              stop_at: Optional[int] = None, progress: bool = True, **options: Any) -> CrossLayerTranscoder:
    """Train a cross-layer transcoder for every MLP of `model` (BatchTopK; see the module docstring).

    Args:
        model: a hooked model (Sprout, the walkthrough GPT) with `ln2.hook_normalized` and `hook_mlp_out`.
        data: its text, a list of texts or token ids, cut into windows of `seq_len`.
        d_sae: latents per layer (default 2 d_model); k: latents per token summed over all layers (default
            min(32, d_sae)); skip: a linear skip per output layer.
        steps, lr, batch_size (tokens per step, over all processes), seed, checkpoint, checkpoint_every, resume,
            stop_at, progress: as `interp.train_transcoder`'s.
        **options: other `TrainSettings` fields (aux_k_coefficient, aux_k, dead_tokens, threshold_lr,
            warmup_steps, decay_fraction, grad_clip, b_dec_init, normalize, seq_len, harvest_batch, buffer_tokens).

    Returns:
        The CrossLayerTranscoder (kind "batchtopk", eval mode; `to_jumprelu()` gives the same outputs as
        JumpReLU); `info` holds the settings, steps, the last batch's FVU (all layers and per layer), L0 per
        token, dead fraction and tokens per second.

    Example:
        >>> clt = interp.saes.training.train_clt(model, text, d_sae=256, k=48, steps=1500)   # doctest: +SKIP
    """
    check_run(steps, stop_at, checkpoint_every, resume, progress)
    if "kind" in options and options["kind"] != "batchtopk":
        raise SettingsError(f"train_clt trains kind 'batchtopk' (convert with to_jumprelu()), got kind={options['kind']!r}")
    options = {key: v for key, v in options.items() if key != "kind"}
    L, d = int(model.cfg.n_layers), int(model.cfg.d_model)
    width = 2 * d if d_sae is None else d_sae
    # k counts latents over all L layers, so it may exceed one layer's d_sae (the per-dictionary check): held back
    wide_k = isinstance(k, int) and not isinstance(k, bool) and isinstance(width, int) and k > width
    s = TrainSettings.from_dict(dict(kind="batchtopk", d_sae=width, k=None if wide_k else k, steps=steps, lr=lr,
                                     batch_size=batch_size, seed=seed, skip=skip, **options))
    if wide_k and isinstance(k, int):
        if k > L * s.d_sae:
            raise TrainSettings.bad("k", f"in 1..n_layers * d_sae = {L * s.d_sae}", k)
        object.__setattr__(s, "k", k)  # frozen settings: as check_together stores a resolved k
    hooks = [h for l in range(L) for h in (input_hook(l), output_hook(l))]
    with torch.inference_mode(False), torch.enable_grad():
        src = _model_source(model, data, hooks, batch_size, seed, options)
        clt = CrossLayerTranscoder(L, src.widths[hooks[0]], s.d_sae, src.widths[hooks[1]], kind="batchtopk", k=s.k,
                                   skip=skip, seed=s.seed)
        unit = _Unit(clt, s)
        _, rank = join()
        if checkpoint is None or rank != 0:
            return _run(src, unit, s, checkpoint, checkpoint_every, resume, stop_at, progress, rank)
        with ckpt.run_lock(checkpoint):
            return _run(src, unit, s, checkpoint, checkpoint_every, resume, stop_at, progress, rank)


def _rows(src, step: int, L: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This process's rows of step's batch: MLP inputs and outputs [n_layers, rows, d]."""
    rows = src.batch(step)
    return (torch.stack([rows[input_hook(l)] for l in range(L)]), torch.stack([rows[output_hook(l)] for l in range(L)]))


@torch.no_grad()
def _init(u: _Unit, x: torch.Tensor, y: torch.Tensor, s: TrainSettings) -> None:
    """Per-layer scales from the first batch (over all processes) and each b_dec at its geometric median."""
    sc = u.sae
    if s.normalize:
        for which, t in (("in", x), ("out", y)):
            tot = _sum(torch.stack([t.double().norm(dim=-1).sum(-1), torch.full((t.shape[0],), float(t.shape[1]),
                                                                                 dtype=torch.float64)], 1))
            mean = tot[:, 0] / tot[:, 1]
            if not bool((mean > 0).all()):
                raise ValueError(f"the MLP {which}puts of layer(s) {(mean <= 0).nonzero().flatten().tolist()} are all zero "
                                 "in the first batch: nothing to learn there")
            getattr(sc, f"scale_{which}").copy_(math.sqrt(t.shape[-1]) / mean)
    if s.b_dec_init != "zeros":
        target = y.double() * sc.scale_out[:, None, None]
        for l in range(sc.clt.n_layers):
            sc.clt.b_dec[l].copy_(_center(target[l], s.b_dec_init).to(sc.clt.b_dec.dtype))


def _decode(clt: CrossLayerTranscoder, acts: torch.Tensor) -> torch.Tensor:
    """sum over sources l <= l' of acts[l] @ W_dec[l][:, l' - l] [n_layers, rows, d_out], without b_dec."""
    L, rows = clt.n_layers, acts.shape[1]
    parts = [(acts[l] @ clt.W_dec[l].reshape(clt.d_sae, -1)).view(rows, L - l, clt.d_out) for l in range(L)]
    return torch.stack([sum(parts[l][:, o - l] for l in range(o + 1)) for o in range(L)])


def _loss(u: _Unit, x, y, s: TrainSettings, global_rows: int):
    sc, clt = u.sae, u.sae.clt
    L, rows = clt.n_layers, x.shape[1]
    x = x * sc.scale_in[:, None, None].to(x.dtype)
    target = y * sc.scale_out[:, None, None].to(y.dtype)
    pre = torch.baddbmm(clt.b_enc[:, None], x, clt.W_enc).relu()  # [L, rows, d_sae]
    flat = pre.permute(1, 0, 2).reshape(rows, L * clt.d_sae)  # [rows, L d_sae]: one batch-wide cut over all layers
    cut = batch_threshold(flat.detach(), int(clt.k or 1) * global_rows)
    acts = pre * (pre >= cut).to(pre.dtype) * (pre > 0).to(pre.dtype)
    recon = _decode(clt, acts) + clt.b_dec[:, None]
    if clt.W_skip is not None:
        recon = recon + torch.bmm(x, clt.W_skip.transpose(1, 2))
    err = (recon - target).pow(2).sum(-1)  # [L, rows]
    loss = err.sum() + _aux_loss(u, pre, recon, target, s)
    with torch.no_grad():
        var = (target - target.mean(1, keepdim=True)).pow(2).sum(-1).sum(-1)  # [L]
        fired = (acts > 0).sum(1).reshape(-1)  # [L d_sae]
    return loss / global_rows, acts, fired, err.detach().sum(-1), var


def _aux_loss(u: _Unit, pre, recon, target, s: TrainSettings) -> torch.Tensor:
    """AuxK (Gao et al. 2024) over every layer's latents: the k_aux largest pre-activations among dead ones
    reconstruct the residual of every output layer they write to."""
    clt = u.sae.clt
    dead = (u.since_fired >= s.dead_after()).view(clt.n_layers, 1, clt.d_sae).to(pre.device)
    n_dead = int(dead.sum())
    if n_dead == 0 or s.aux_k_coefficient == 0:
        return pre.new_zeros(())
    k_aux = s.aux_k or max(1, clt.d_in // 2)
    scale = min(n_dead / k_aux, 1.0)  # from the uncapped k_aux: few dead latents, a small auxiliary loss
    L, rows = clt.n_layers, pre.shape[1]
    dead_pre = torch.where(dead, pre, torch.full_like(pre, -1.0)).permute(1, 0, 2).reshape(rows, -1)
    values, idx = dead_pre.topk(min(k_aux, n_dead), dim=-1, sorted=False)
    aux = torch.zeros_like(dead_pre).scatter(1, idx, values.clamp_min(0))
    aux = aux.view(rows, L, clt.d_sae).permute(1, 0, 2)
    residual = (target - recon).detach()
    return s.aux_k_coefficient * scale * (_decode(clt, aux) - residual).pow(2).sum()


def _step(u: _Unit, x, y, s: TrainSettings, step: int, global_rows: int) -> None:
    clt = u.sae.clt
    loss, acts, fired, err, var = _loss(u, x, y, s, global_rows)
    loss.backward()
    params = list(clt.parameters())
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    reduce_grads(params, torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1, mean=False)
    clt.project_decoder_grad_()
    clip_grads(params, s.grad_clip)
    set_lr(u.opt, s.lr_at(step))
    u.opt.step()
    u.opt.zero_grad()
    clt.normalize_decoder_()
    # BatchTopK's threshold: the running smallest latent kept, over processes (it reads only `threshold`)
    clt.rule.after_step(acts, cast(Dictionary, clt), s.threshold_lr)
    _record(u, fired, err, var, s, global_rows)


@torch.no_grad()
def _record(u: _Unit, fired, err, var, s: TrainSettings, global_rows: int) -> None:
    stats = _sum(torch.cat([fired.double(), err.double(), var.double()]))
    L = u.sae.clt.n_layers
    counts, e, v = stats[:-2 * L], stats[-2 * L:-L], stats[-L:]
    u.since_fired = torch.where(counts > 0, torch.zeros_like(u.since_fired), u.since_fired + global_rows)
    u.l0, u.fvu = counts.sum().item() / global_rows, (e.sum() / v.sum().clamp_min(1e-30)).item()
    u.layer_fvu = (e / v.clamp_min(1e-30)).tolist()


def _check_finite(u: _Unit, step: int, s: TrainSettings) -> None:
    bad = [n for n, p in u.sae.clt.named_parameters() if not torch.isfinite(p).all()]
    if bad:
        raise TrainingDiverged(f"cross-layer transcoder training diverged at step {step + 1} of {s.steps}: "
                               f"{', '.join(bad[:3])} became NaN or infinite (peak lr {s.peak_lr():.3g}); lower lr=")


def _run(src, u: _Unit, s: TrainSettings, checkpoint, every, resume, stop_at, progress, rank: int) -> CrossLayerTranscoder:
    L = u.sae.clt.n_layers
    meta = {}
    if checkpoint is not None:
        meta = {"data": src.fingerprint(), "model": fingerprint(src.model),
                "hooks": [["clt", input_hook(l), output_hook(l)] for l in range(L)]}
    if checkpoint is not None and not resume:
        ckpt.refuse_existing(checkpoint)
    start = ckpt.restore(checkpoint, [u], s, meta) if resume else 0
    end = s.steps if stop_at is None else min(int(stop_at), s.steps)
    t0 = time.perf_counter()
    bar = tqdm(range(start, end), initial=start, total=s.steps, desc="CLT", disable=not progress or rank != 0)
    for step in bar:
        x, y = _rows(src, step, L)
        if step == 0:
            _init(u, x, y, s)
        _step(u, x, y, s, step, s.batch_size)
        _check_finite(u, step, s)
        bar.set_postfix(fvu=f"{u.fvu:.3f}", l0=f"{u.l0:.1f}")
        if checkpoint is not None and every is not None and (step + 1) % every == 0 and step + 1 < end:
            ckpt.write(checkpoint, [u], s, meta, step + 1)
    seconds = time.perf_counter() - t0
    if checkpoint is not None and end > start:
        ckpt.write(checkpoint, [u], s, meta, end)
    speed = (end - start) * s.batch_size / seconds if end > start and seconds > 0 else None
    return _finish(u, s, src, end, speed)


def _finish(u: _Unit, s: TrainSettings, src, steps_done: int, tokens_per_s) -> CrossLayerTranscoder:
    clt = copy.deepcopy(u.sae.clt)
    clt.fold_scales_(u.sae.scale_in.tolist(), u.sae.scale_out.tolist())
    clt.eval()
    clt.model_fingerprint, clt.model_config = fingerprint(src.model), model_config(src.model)
    clt.info = {"settings": s.to_dict(), "steps": steps_done, "data": src.describe(), "train_fvu": u.fvu,
                "train_fvu_per_layer": u.layer_fvu, "train_l0": u.l0,
                "dead_fraction": float((u.since_fired >= s.dead_after()).float().mean()), "tokens_per_s": tokens_per_s,
                "input_scales": u.sae.scale_in.tolist(), "output_scales": u.sae.scale_out.tolist()}
    return clt
