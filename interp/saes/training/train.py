"""Training SAEs and transcoders: on a tensor of activations, or on a model's activations harvested as it runs.

One step, for each dictionary: its rows of the global batch (scaled to mean norm sqrt(d_in)), the
kind's training latents, the loss

    |x - x_hat|^2  +  c * penalty (L1 for relu, L0 for jumprelu)  +  AuxK (TopK kinds, dead latents)

summed over rows and divided by the global batch size, gradients summed over processes (so N processes
take the steps one process takes), the part of W_dec's gradient along its rows removed, clipped, an Adam
step at the scheduled learning rate, decoder rows back to unit norm. AuxK (Gao et al. 2024, sparsify's
recipe): the k_aux largest pre-activations among latents that have not fired for `dead_tokens` tokens
reconstruct the residual x - x_hat, weighted 1/32 and scaled down while few latents are dead. b_dec
starts at the geometric median of the first batch, and with `target_l0` the sparsity coefficient is
steered (multiplicatively, each step) until the batch's L0 is the target.

Several dictionaries at several hooks train from one forward per batch (`hook=[...]`). A run with a
`checkpoint` folder writes the dictionaries, Adam's state and the data position every
`checkpoint_every` steps; `resume=True` continues from it and refuses other settings, data or model.
"""
from __future__ import annotations

import copy
import math
import time
from typing import Any, Optional, Union, cast

import torch
import torch.distributed as dist
import torch.nn.functional as F
from jaxtyping import Float, Int
from tqdm.auto import tqdm

from sprout.training.core import Adam, clip_grads, reduce_grads, set_lr

from ..._core.distributed import join
from ..._core.identity import PathLike, fingerprint, model_config
from ..._core.inputs import TextOrTokens
from ..._core.model import HookedModel
from ..kinds import TOPK_KINDS, batch_threshold
from ..sae import SAE, Transcoder, input_hook, output_hook
from ..settings import SettingsError, TrainSettings, check_finite, check_run
from . import checkpoint as ckpt
from .harvest import ModelSource, TensorSource

_RATE = 0.05  # target_l0: the coefficient moves by up to 5% a step


class _Unit:
    """One dictionary in training: its optimizer, input/output scales, sparsity coefficient, dead counts."""

    def __init__(self, sae: SAE, hook_in: str, hook_out: Optional[str], s: TrainSettings):
        self.sae, self.hook_in, self.hook_out = sae, hook_in, hook_out
        self.opt = Adam(sae.parameters())  # the core's (why not torch's: see sprout.training.core.Adam)
        self.scale_in = self.scale_out = 1.0
        self.coef = s.coefficient()
        self.since_fired = torch.zeros(sae.d_sae, dtype=torch.long)
        self.fvu = self.l0 = float("nan")


def _sum(t: torch.Tensor, op=None) -> torch.Tensor:
    if dist.is_initialized():
        dist.all_reduce(t, op=op or dist.ReduceOp.SUM)
    return t


@torch.no_grad()
def _init_unit(u: _Unit, x: torch.Tensor, y: torch.Tensor, s: TrainSettings) -> None:
    """Input scales from the first batch, and b_dec at its geometric median (or mean), all processes alike."""
    if s.normalize:
        for which, t in (("in", x), ("out", y)):
            tot = _sum(torch.tensor([t.double().norm(dim=-1).sum().item(), t.shape[0]], dtype=torch.float64))
            mean_norm = (tot[0] / tot[1]).item()
            if not mean_norm > 0:
                raise ValueError(f"the activations at {u.hook_in if which == 'in' else u.hook_out} are all zero in the "
                                 "first batch: nothing to learn")
            setattr(u, f"scale_{which}", math.sqrt(t.shape[-1]) / mean_norm)
    target = (y * u.scale_out).double()
    if s.b_dec_init != "zeros":
        u.sae.b_dec.copy_(_center(target, s.b_dec_init).to(u.sae.b_dec.dtype))
    if u.sae.kind == "jumprelu" and s.target_l0 is not None:
        _quantile_threshold(u, x * u.scale_in, s.target_l0, s.batch_size)


def _center(target: torch.Tensor, how: str) -> torch.Tensor:
    """The mean, or the geometric median (Weiszfeld's iteration), of the rows of every process."""
    tot = _sum(torch.cat([target.sum(0), torch.tensor([float(target.shape[0])], dtype=torch.float64)]))
    m = tot[:-1] / tot[-1]
    for _ in range(30 if how == "geometric_median" else 0):
        w = 1.0 / (target - m).norm(dim=-1).clamp_min(1e-8)
        tot = _sum(torch.cat([(w[:, None] * target).sum(0), w.sum()[None]]))
        m = tot[:-1] / tot[-1]
    return m


def _quantile_threshold(u: _Unit, x: torch.Tensor, target_l0: float, global_rows: int) -> None:
    """JumpReLU thresholds that start where 4 x target_l0 latents fire per row: the same cut for every
    latent, the batch's (4 target_l0 rows)-th largest pre-activation over all processes. Starting looser
    than the target lets latents learn their directions before the steered L0 penalty prunes them (from
    the ground-truth test: 0.95 mean max cosine at 300 steps, 0.88 when starting at the target)."""
    pre = u.sae.pre_acts(x).relu()
    n_keep = max(1, int(round(4 * target_l0 * global_rows)))
    assert u.sae.threshold is not None  # a jumprelu SAE's
    u.sae.threshold.fill_(float(batch_threshold(pre, n_keep)))


def _aux_loss(u: _Unit, pre, acts, recon, target, s: TrainSettings) -> torch.Tensor:
    """AuxK: the largest pre-activations of dead latents reconstruct the residual (summed over rows)."""
    dead = u.since_fired >= s.dead_after()
    n_dead = int(dead.sum())
    if n_dead == 0 or u.sae.kind not in TOPK_KINDS or s.aux_k_coefficient == 0:
        return pre.new_zeros(())
    k_aux = s.aux_k or max(1, u.sae.d_in // 2)
    scale = min(n_dead / k_aux, 1.0)
    dead_pre = torch.where(dead.to(pre.device)[None], pre.relu(), torch.full_like(pre, -1.0))
    values, idx = dead_pre.topk(min(k_aux, n_dead), dim=-1, sorted=False)
    residual = (target - recon).detach()
    return s.aux_k_coefficient * scale * (sparse_decode(u.sae, idx, values.clamp_min(0)) - residual).pow(2).sum()


def sparse_decode(sae: SAE, idx: Int[torch.Tensor, "rows k"], values: Float[torch.Tensor, "rows k"]) -> Float[torch.Tensor, "rows d_out"]:
    """`sum_j values[:, j] * W_dec[idx[:, j]]` [rows, d]: the decoder on k latents per row, without b_dec.

    What `acts @ W_dec` gives for latents zero outside idx, in rows x k x d work instead of rows x
    d_sae x d, forward and backward (embedding_bag's gradient adds into the k rows; sparsify decodes so)."""
    return F.embedding_bag(idx, sae.W_dec, per_sample_weights=values, mode="sum")


def _latents(sae: SAE, x: torch.Tensor, global_rows: int):
    """(pre-activations [rows, d_sae], the reconstruction [rows, d] without a skip term, the dense latents
    (None where TopK's are decoded sparsely), the rows each latent fired on [d_sae])."""
    # (x - b_dec) W_enc + b_enc as x W_enc + (b_enc - b_dec W_enc): b_dec's gradient is then a vector times
    # W_enc, not a third [rows, d_sae] x [d_sae, d] matmul; addmm adds the bias inside the matmul
    bias = sae.b_enc - sae.b_dec @ sae.W_enc if sae.apply_b_dec_to_input else sae.b_enc
    pre = torch.addmm(bias, x.reshape(-1, x.shape[-1]), sae.W_enc)
    if sae.kind == "topk":  # the k latents of each row decoded sparsely (sparse_decode)
        values, idx = pre.topk(cast(int, sae.k), dim=-1, sorted=False)
        values = values.relu()
        counts = torch.bincount(idx.reshape(-1), weights=(values > 0).reshape(-1).float(), minlength=sae.d_sae)
        return pre, sparse_decode(sae, idx, values) + sae.b_dec, None, counts
    acts = sae.rule.train_acts(pre, sae, global_rows)
    return pre, sae.decode(acts), acts, (acts > 0).sum(0)


def _loss(u: _Unit, x, y, s: TrainSettings, step: int, global_rows: int):
    sae, x, target = u.sae, x * u.scale_in, y * u.scale_out
    pre, recon, acts, fired = _latents(sae, x, global_rows)
    extra = sae.skip_term(x) if isinstance(sae, Transcoder) else None
    recon = recon if extra is None else recon + extra
    rec = sae.rule.reconstruction(target, acts, sae, extra) if sae.kind == "matryoshka" else (recon - target).pow(2).sum(-1)
    loss = rec.sum() + _aux_loss(u, pre, acts, recon, target, s)
    if sae.rule.has_penalty:
        warm = s.steps // 20 or 1  # the penalty warms up with the learning rate (Conerly et al. 2024)
        loss = loss + u.coef * min(1.0, (step + 1) / warm) * sae.rule.penalty(pre, acts, sae).sum()
    with torch.no_grad():
        err = (recon - target).pow(2).sum() if sae.kind == "matryoshka" else rec.detach().sum()
        var = (target - target.mean(0)).pow(2).sum()
    return loss / global_rows, acts, fired, err, var


def _step_unit(u: _Unit, x, y, s: TrainSettings, step: int, global_rows: int) -> None:
    sae = u.sae
    loss, acts, fired, err, var = _loss(u, x, y, s, step, global_rows)
    loss.backward()
    params = list(sae.parameters())
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    world = dist.get_world_size() if dist.is_initialized() else 1
    reduce_grads(params, world, mean=False)  # the loss is already divided by the global batch: sum
    sae.project_decoder_grad_()
    clip_grads(params, s.grad_clip)  # 0: no clipping
    set_lr(u.opt, s.lr_at(step))
    u.opt.step()
    u.opt.zero_grad()
    sae.normalize_decoder_()
    if sae.kind == "jumprelu":
        assert sae.threshold is not None  # a jumprelu SAE's
        with torch.no_grad():
            sae.threshold.clamp_(min=0)
    if acts is not None:
        sae.rule.after_step(acts, sae, s.threshold_lr)
    _record(u, fired, err, var, s, global_rows)


@torch.no_grad()
def _record(u: _Unit, fired_counts, err, var, s: TrainSettings, global_rows: int) -> None:
    stats = _sum(torch.cat([fired_counts.double(), torch.stack([err.double(), var.double()])]))
    fired = stats[:-2] > 0
    u.since_fired = torch.where(fired, torch.zeros_like(u.since_fired), u.since_fired + global_rows)
    u.l0, u.fvu = stats[:-2].sum().item() / global_rows, (stats[-2] / stats[-1].clamp_min(1e-30)).item()
    if s.target_l0 is not None and u.l0 == u.l0:
        u.coef *= math.exp(_RATE * max(-1.0, min(1.0, (u.l0 - s.target_l0) / s.target_l0)))


def _settings(d_in: int, kind, d_sae, k, steps, lr, batch_size, seed, options) -> TrainSettings:
    if kind not in TOPK_KINDS and k is not None:
        options = {**options, "target_l0": k}  # relu / jumprelu: k is the L0 the coefficient is steered to
        k = None
    d_sae = 8 * d_in if d_sae is None else d_sae
    return TrainSettings.from_dict(dict(kind=kind, d_sae=d_sae, k=k, steps=steps, lr=lr, batch_size=batch_size,
                                        seed=seed, **options))


def _model_source(model: HookedModel, data, hooks: list, batch_size, seed, options: dict) -> ModelSource:
    """The harvester, its settings checked first (d_in, which the other checks need, comes from it)."""
    harvest = {key: options[key] for key in ("seq_len", "harvest_batch", "buffer_tokens") if key in options}
    s = TrainSettings(kind="relu", d_sae=1, batch_size=batch_size, seed=seed, **harvest)
    return ModelSource(model, data, hooks, s.batch_size, s.seed, s.seq_len, s.harvest_batch, s.buffer_tokens)


def _hook_list(hook) -> tuple[list, bool]:
    if isinstance(hook, (list, tuple)):
        if not hook or not all(isinstance(h, str) for h in hook) or len(set(hook)) != len(hook):
            raise ValueError(f"hook must be a hook name or a list of distinct hook names, got {hook!r}")
        return list(hook), True
    if hook is not None and not isinstance(hook, str):
        raise TypeError(f"hook must be a hook name such as 'blocks.0.hook_resid_post', got {hook!r}")
    return [hook], False


def train_sae(source: Union[HookedModel, Float[torch.Tensor, "*n d_in"]], hook: Union[str, list, None] = None, *,
              data: Optional[TextOrTokens] = None, kind: str = "topk", d_sae: Optional[int] = None,
              k: Optional[int] = None, steps: int = 2000, lr: Optional[float] = None, batch_size: int = 4096,
              seed: int = 0, checkpoint: Optional[PathLike] = None, checkpoint_every: Optional[int] = None, resume: bool = False,
              stop_at: Optional[int] = None, progress: bool = True, **options: Any) -> Union[SAE, dict]:
    """Train a sparse autoencoder (or one per hook) on a model's activations or on a tensor of them.

    Args:
        source: a hooked model (with `data=`) or activations [n, d_in] (any leading axes are flattened).
        hook: the hook point to read, e.g. "blocks.2.hook_resid_post"; a list trains one SAE per hook from
            one forward per batch and returns {hook: SAE}. With a tensor, the name recorded (optional).
        data: the model's text, a list of texts or token ids, cut into windows of `seq_len`.
        kind, d_sae (default 8 d_in), k: the dictionary (`interp.SAE`). For relu and jumprelu, k is the
            target L0 the sparsity coefficient is steered to (`target_l0`).
        steps, lr, batch_size (activations per step, over all processes), seed: the run.
        checkpoint: a folder for the run's checkpoint; checkpoint_every: steps between writes (default:
            only at the end, or at `stop_at`); resume: continue from the checkpoint there.
        stop_at: stop after this many steps of the `steps`-step schedule (resume later).
        progress: a tqdm bar (rank 0 only).
        **options: other `TrainSettings` fields (sparsity_coefficient, aux_k_coefficient, dead_tokens,
            warmup_steps, decay_fraction, grad_clip (0: none), b_dec_init, normalize, widths, bandwidth,
            threshold_lr, seq_len, harvest_batch, buffer_tokens); unknown names are refused.

    Returns:
        The trained SAE (eval mode; `info` holds the settings, data, steps, final batch FVU / L0 /
        dead fraction, tokens per second), or {hook: SAE} for a list of hooks.

    Example:
        >>> import torch, interp
        >>> acts = torch.randn(2048, 16)
        >>> sae = interp.train_sae(acts, kind="topk", d_sae=32, k=4, steps=20, batch_size=256, progress=False)
        >>> sae.kind, sae.k, tuple(sae.W_dec.shape)
        ('topk', 4, (32, 16))
    """
    hooks, many = _hook_list(hook)
    check_run(steps, stop_at, checkpoint_every, resume, progress)
    with torch.inference_mode(False), torch.enable_grad():
        src: Union[TensorSource, ModelSource]
        if isinstance(source, torch.Tensor):
            if many:
                raise ValueError("a tensor of activations trains one SAE: pass one hook name (or none)")
            if data is not None:
                raise ValueError("data= goes with a model; a tensor source is the activations themselves")
            if source.dim() < 2 or source.numel() == 0:
                raise ValueError(f"activations must be a non-empty [n, d_in] tensor, got shape {list(source.shape)}")
            s = _settings(int(source.shape[-1]), kind, d_sae, k, steps, lr, batch_size, seed, options)
            src = TensorSource(source, hooks[0], s.batch_size, s.seed)
        else:
            if hooks[0] is None:
                raise ValueError("training from a model needs hook=: the hook point(s) to read")
            _settings(int(source.cfg.d_model), kind, d_sae, k, steps, lr, batch_size, seed, options)  # before harvesting
            src = _model_source(source, data, hooks, batch_size, seed, options)
            s = _settings(src.widths[hooks[0]], kind, d_sae, k, steps, lr, batch_size, seed, options)
        units = [_Unit(_new_sae(s, src.widths[h], h, None), h, None, s) for h in hooks]
        out = _run(src, units, s, checkpoint, checkpoint_every, resume, stop_at, progress)
    return dict(zip(hooks, out)) if many else out[0]


def train_transcoder(model: HookedModel, data: TextOrTokens, layer: Union[int, list], *, kind: str = "topk", d_sae: Optional[int] = None,
                     k: Optional[int] = None, skip: bool = False, steps: int = 2000, lr: Optional[float] = None,
                     batch_size: int = 4096, seed: int = 0, checkpoint: Optional[PathLike] = None, checkpoint_every: Optional[int] = None,
                     resume: bool = False, stop_at: Optional[int] = None, progress: bool = True,
                     **options: Any) -> Union[Transcoder, dict]:
    """Train a transcoder for the MLP of block `layer` (or one per layer of a list, from one forward per batch).

    It reads `blocks.{l}.ln2.hook_normalized` (the stream before the MLP divided by ln2's scale, before
    ln2's gain) and predicts `blocks.{l}.hook_mlp_out`; `skip=True` adds the linear skip W_skip. The other
    arguments are `train_sae`'s. Returns the Transcoder, or {layer: Transcoder} for a list.
    """
    many = isinstance(layer, (list, tuple))
    layers: list[int] = list(layer) if isinstance(layer, (list, tuple)) else [layer]  # many
    n = int(model.cfg.n_layers)
    for lay in layers:
        if isinstance(lay, bool) or not isinstance(lay, int) or not 0 <= lay < n:
            raise SettingsError(f"layer must be a block of {type(model).__name__} (0..{n - 1}), got {lay!r}")
    if not layers or len(set(layers)) != len(layers):
        raise SettingsError(f"layer must be a block or a list of distinct blocks, got {layer!r}")
    check_run(steps, stop_at, checkpoint_every, resume, progress)
    _settings(int(model.cfg.d_model), kind, d_sae, k, steps, lr, batch_size, seed, {**options, "skip": skip})  # before harvesting
    pairs = [(input_hook(lay), output_hook(lay)) for lay in layers]
    flat = [h for pair in pairs for h in pair]
    with torch.inference_mode(False), torch.enable_grad():
        src = _model_source(model, data, flat, batch_size, seed, options)
        s = _settings(src.widths[flat[0]], kind, d_sae, k, steps, lr, batch_size, seed, {**options, "skip": skip})
        units = [_Unit(_new_sae(s, src.widths[hi], hi, ho, src.widths[ho], lay), hi, ho, s)
                 for lay, (hi, ho) in zip(layers, pairs)]
        out = _run(src, units, s, checkpoint, checkpoint_every, resume, stop_at, progress)
    return dict(zip(layers, out)) if many else out[0]


def _new_sae(s: TrainSettings, d_in: int, hook_in: str, hook_out: Optional[str], d_out: Optional[int] = None,
             layer: Optional[int] = None) -> SAE:
    kw: dict[str, Any] = dict(kind=s.kind, k=s.k, widths=s.widths, bandwidth=s.bandwidth, seed=s.seed)
    if s.kind in TOPK_KINDS and cast(int, s.k) > s.d_sae:  # the settings give the TopK kinds a k
        raise SettingsError(f"k must be in 1..d_sae={s.d_sae}, got k={s.k}")
    if hook_out is None:
        if s.skip:
            raise SettingsError("skip is for transcoders (train_transcoder)")
        return SAE(d_in, s.d_sae, hook_name=hook_in, **kw)
    return Transcoder(d_in, s.d_sae, d_out, skip=s.skip, layer=layer, hook_name=hook_in, hook_name_out=hook_out, **kw)


def _run(src, units: list, s: TrainSettings, checkpoint, every, resume, stop_at, progress) -> list:
    n_proc, rank = join()  # the trainer starts the process group (if torchrun asks for one); queries never do
    if checkpoint is None or rank != 0:
        return _run_locked(src, units, s, checkpoint, every, resume, stop_at, progress, rank)
    with ckpt.run_lock(checkpoint):  # one run per checkpoint folder
        return _run_locked(src, units, s, checkpoint, every, resume, stop_at, progress, rank)


def _run_locked(src, units: list, s: TrainSettings, checkpoint, every, resume, stop_at, progress, rank: int) -> list:
    model = src.model
    meta = {}  # what a checkpoint must match: hashing the data costs a pass over it, so only with one
    if checkpoint is not None:
        meta = {"data": src.fingerprint(), "model": fingerprint(model) if model is not None else None,
                "hooks": [[u.hook_in, u.hook_out] for u in units]}
    if checkpoint is not None and not resume:
        ckpt.refuse_existing(checkpoint)
    start = ckpt.restore(checkpoint, units, s, meta) if resume else 0
    end = s.steps if stop_at is None else min(int(stop_at), s.steps)
    t0 = time.perf_counter()
    bar = tqdm(range(start, end), initial=start, total=s.steps, desc=f"{s.kind} SAE", disable=not progress or rank != 0)
    for step in bar:
        rows = src.batch(step)
        for u in units:
            x = rows[u.hook_in]
            y = x if u.hook_out is None else rows[u.hook_out]
            if step == 0:
                _init_unit(u, x, y, s)
            _step_unit(u, x, y, s, step, s.batch_size)
        check_finite(units, step, s)
        bar.set_postfix(fvu=f"{units[0].fvu:.3f}", l0=f"{units[0].l0:.1f}")
        if checkpoint is not None and every is not None and (step + 1) % every == 0 and step + 1 < end:
            ckpt.write(checkpoint, units, s, meta, step + 1)
    seconds = time.perf_counter() - t0
    if checkpoint is not None and end > start:
        ckpt.write(checkpoint, units, s, meta, end)
    return [_finish(u, s, src, end, (end - start) * s.batch_size / seconds if end > start and seconds > 0 else None)
            for u in units]


def _finish(u: _Unit, s: TrainSettings, src, steps_done: int, tokens_per_s) -> SAE:
    sae = copy.deepcopy(u.sae)
    sae.fold_scale_(u.scale_in, u.scale_out)
    sae.eval()
    if src.model is not None:
        sae.model_fingerprint, sae.model_config = fingerprint(src.model), model_config(src.model)
    sae.info = {"settings": s.to_dict(), "steps": steps_done, "data": src.describe(), "hook_name": u.hook_in,
                "train_fvu": u.fvu, "train_l0": u.l0, "dead_fraction": float((u.since_fired >= s.dead_after()).float().mean()),
                "tokens_per_s": tokens_per_s, "sparsity_coefficient": u.coef, "input_scale": u.scale_in,
                "output_scale": u.scale_out}
    return sae
