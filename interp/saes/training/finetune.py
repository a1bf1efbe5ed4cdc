"""Fine-tuning a trained dictionary on the model's own next-token distribution (end-to-end, Braun et al. 2024,
"Identifying Functionally Important Features with End-to-End Sparse Dictionary Learning").

A dictionary trained on reconstruction alone spends its few latents on the variance of the activation, not on
what the rest of the model reads from it: at L0 10 on a small model, CE loss recovered can stay near 0.85 while
EV is 0.8. Here the dictionary is spliced in (its output replaces the activation it reconstructs) and its
weights follow

    KL(clean next-token distribution || spliced one), mean over tokens  +  c * FVU of the reconstruction

through the frozen model, so later layers' reading decides which directions it keeps; the FVU term (c > 0)
keeps it a reconstruction of the activation (EV is still reported against baselines). The sparsity stays the
dictionary's own: BatchTopK keeps k x rows latents over each batch, and at the end its inference threshold is
set to keep k a token over some of the windows; TopK keeps k per token. The model's weights get no gradient
and are never changed.
"""
from __future__ import annotations

import copy
from typing import Optional, cast

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from sprout.training.core import Adam, clip_grads, set_lr

from ..._core.inputs import TextOrTokens
from ..._core.inputs import stream_windows as windows
from ..._core.model import HookedModel
from ..kinds import batch_threshold
from ..sae import SAE, Transcoder
from ..settings import SettingsError, check_args

KINDS = ("batchtopk", "topk")  # their sparsity holds through fine-tuning without a penalty
CALIBRATION_WINDOWS = 64  # windows the final BatchTopK threshold is set on


def finetune_kl(model: HookedModel, sae: SAE, data: TextOrTokens, *, steps: int = 1500, lr: float = 3e-3,
                batch_windows: int = 16, seq_len: Optional[int] = None, mse_coefficient: float = 0.1,
                threshold_lr: float = 0.01, seed: int = 0, progress: bool = True) -> SAE:
    """A copy of `sae` (an SAE or transcoder of kind batchtopk or topk) fine-tuned so that `model` with it
    spliced in predicts the next token as the clean model does (see the module docstring).

    Args:
        model: the hooked model the dictionary was trained on (left unchanged).
        sae: the trained dictionary; it is copied, never edited.
        data: text, texts or token ids, cut into windows of `seq_len` (default the model's context).
        steps, lr (Adam's peak; 5% warmup, linear decay over the last 20%), batch_windows (windows a step),
            seed (the order of the windows): the run. The defaults, with mse_coefficient's, are the settings of
            the trials on sprout-mini's transcoders (docs/features.md).
        mse_coefficient: the weight c of the reconstruction's FVU beside the KL (0: KL alone).
        threshold_lr: BatchTopK's inference threshold's moving-average rate.
        progress: a tqdm bar.

    Returns:
        The fine-tuned dictionary (eval mode); `info["kl_finetune"]` holds the settings and the first and last
        batches' KL and FVU.

    Raises:
        SettingsError: a kind other than batchtopk or topk, a dictionary not at a block's hook, or a setting out
            of range.
    """
    if sae.kind not in KINDS:
        raise SettingsError(f"finetune_kl fine-tunes a dictionary of kind {' or '.join(KINDS)} (its sparsity "
                            f"holds without a penalty); got kind {sae.kind!r}: fine-tune before to_jumprelu")
    check_args("finetune_kl", steps=(steps, "int", (1, None, "[")), batch_windows=(batch_windows, "int", (1, None, "[")),
               lr=(lr, "float", (0, None, "(")), mse_coefficient=(mse_coefficient, "float", (0, None, "[")),
               threshold_lr=(threshold_lr, "float", (0, 1, "(]")), seed=(seed, "int", None), progress=(progress, "bool", None))
    start = _block(sae)
    sae.check_model(model, f"the {type(sae).__name__} at {sae.hook_name!r}")
    ids = windows(model, data, seq_len)
    tuned = copy.deepcopy(sae).train()
    for p in tuned.parameters():
        p.requires_grad_(True)
    params = [p for name, p in tuned.named_parameters() if name != "threshold"]
    opt = Adam(params)
    order = torch.randperm(len(ids), generator=torch.Generator().manual_seed(seed))
    first = last = None
    with torch.inference_mode(False), torch.enable_grad():
        for step in tqdm(range(steps), desc="KL fine-tune", disable=not progress):
            pick = order[(step * batch_windows + torch.arange(batch_windows)) % len(ids)]
            kl, fvu = _step(model, tuned, ids[pick].to(model.cfg.device), start, params, opt,
                            _lr_at(step, steps, lr), mse_coefficient, threshold_lr)
            first = first or (kl, fvu)
            last = (kl, fvu)
    tuned.eval()
    if tuned.kind == "batchtopk":
        _calibrate(model, tuned, ids[order[:CALIBRATION_WINDOWS]].to(model.cfg.device))
    for p in tuned.parameters():
        p.requires_grad_(False)
    tuned.info = {**copy.deepcopy(sae.info), "kl_finetune": {
        "steps": steps, "lr": lr, "batch_windows": batch_windows, "seq_len": int(ids.shape[1]),
        "mse_coefficient": mse_coefficient, "threshold_lr": threshold_lr, "seed": seed, "tokens": int(ids.numel()),
        "first_batch": dict(zip(("kl", "fvu"), cast(tuple, first))), "last_batch": dict(zip(("kl", "fvu"), cast(tuple, last)))}}
    return tuned


@torch.no_grad()
def _calibrate(model: HookedModel, sae: SAE, ids: torch.Tensor) -> None:
    """BatchTopK's inference threshold set to the cut that keeps k latents a token on average over `ids` (the
    moving average of training estimates that cut from batches seen while the encoder still moved)."""
    _, cache = model.run_with_cache(ids, names_filter=sae.hook_name)
    x = cache[sae.hook_name].flatten(0, -2).to(sae.W_enc.dtype)
    cut = batch_threshold(sae.pre_acts(x).relu(), cast(int, sae.k) * x.shape[0])
    cast(torch.Tensor, sae.threshold).fill_(float(cut))


def _lr_at(step: int, steps: int, peak: float) -> float:
    warm, decay = max(1, steps // 20), steps * 0.8
    scale = min(1.0, (step + 1) / warm)
    return peak * scale * (min(1.0, (steps - step) / (steps - decay)) if step >= decay else 1.0)


def _step(model: HookedModel, sae: SAE, ids: torch.Tensor, start: int, params: list, opt: Adam, lr: float, c: float,
          threshold_lr: float) -> tuple[float, float]:
    with torch.no_grad():  # the spliced pass starts at the dictionary's block, from the clean stream there
        logits, cache = model.run_with_cache(ids, names_filter=f"blocks.{start}.hook_resid_pre")
        clean, resid = logits.log_softmax(-1), cache[f"blocks.{start}.hook_resid_pre"]
    box: dict = {}
    logits = model.run_with_hooks(resid, start_at_layer=start, fwd_hooks=_hooks(sae, box))
    kl = F.kl_div(logits.log_softmax(-1).flatten(0, -2), clean.flatten(0, -2), log_target=True, reduction="batchmean")
    target = box["target"]
    fvu = (box["out"] - target).pow(2).sum() / (target - target.mean(0)).pow(2).sum().clamp_min(1e-30)
    grads = torch.autograd.grad(kl + c * fvu, params)  # the model's own weights get none
    for p, g in zip(params, grads):
        p.grad = g
    clip_grads(params, 1.0)
    set_lr(opt, lr)
    opt.step()
    for p in params:
        p.grad = None
    if sae.kind == "batchtopk":
        sae.rule.after_step(box["acts"], sae, threshold_lr)
    return kl.item(), fvu.item()


def _block(sae: SAE) -> int:
    """The block whose hook the dictionary reads (hook names look like 'blocks.3.ln2.hook_normalized')."""
    parts = (sae.hook_name or "").split(".")
    if len(parts) < 3 or parts[0] != "blocks" or not parts[1].isdigit():
        raise SettingsError(f"finetune_kl fine-tunes a dictionary at a block's hook ('blocks.<l>....'), got {sae.hook_name!r}")
    return int(parts[1])


def _hooks(sae: SAE, box: dict) -> list:
    """The forward hooks that splice the training-mode dictionary: read its input, replace its output."""
    def read(x, hook):
        box["x"] = x.detach().flatten(0, -2)

    def write(y, hook):
        x = box.pop("x")
        pre = sae.pre_acts(x)
        acts = sae.rule.train_acts(pre, sae, x.shape[0]) if sae.kind == "batchtopk" else sae.rule.encode(pre, sae)
        out = sae.decode(acts)
        skip = sae.skip_term(x) if isinstance(sae, Transcoder) else None
        out = out if skip is None else out + skip
        box["acts"], box["out"], box["target"] = acts, out, y.detach().flatten(0, -2)
        return out.view_as(y).to(y.dtype)

    out_name = sae.hook_name_out if isinstance(sae, Transcoder) else sae.hook_name
    return [(sae.hook_name, read), (out_name, write)]
