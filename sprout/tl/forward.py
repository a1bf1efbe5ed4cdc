"""The forward's contract, TransformerLens' HookedTransformer's: `model(tokens)` is the logits, and
`return_type` chooses "logits", "loss", "both" or None, as there.

The loss of `return_type="loss"` is TransformerLens' (position t predicts token t + 1, `[batch, pos - 1]`
per token); given `targets=` (keyword only) it is model.py's instead (every position against its
target, `loss_mask` weighting the positions), which is what the trainer asks for. The course's own
calling convention, `logits, loss = model(idx, targets)`, is a class of its own: `sprout.model.GPT`.

Layer ranges are TransformerLens': `stop_at_layer=L` runs blocks 0..L-1 and returns the stream they
leave ([batch, pos, d_model]; no `blocks.L.*` hook fires), `start_at_layer=S` takes the stream entering
block S; both count from the end when negative, as Python's slices (`-1` is the last block), and a
start after the stop is refused. The residual input and the `tokens=` of its loss are checked against
the model before any block runs, with the same words as token ids.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator, Optional, Union, cast

import torch
import torch.nn as nn
import torch.nn.functional as F
from jaxtyping import Float, Int, Shaped
from transformer_lens.utilities.lm_utils import lm_cross_entropy_loss

if TYPE_CHECKING:
    from ..config import SproutTransformerLensConfig

RETURN_TYPES = ("logits", "loss", "both", None)
# what the forward returns: the logits [batch, pos, d_vocab], the loss (a scalar, or per token), both, or None
ForwardResult = Optional[Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]]


def check_return_type(return_type: object, targets: object, loss_mask: object) -> None:
    """`return_type` is one of TransformerLens' four; `targets`/`loss_mask` go with a loss only."""
    if isinstance(return_type, torch.Tensor):
        raise ValueError(f"return_type must be one of {RETURN_TYPES}, got a tensor: the second positional argument "
                         "is return_type, as in HookedTransformer; for model.py's loss pass return_type='loss', "
                         "targets=..., or call the course's class (sprout.model.GPT.from_sprout(model))")
    if return_type not in RETURN_TYPES:
        raise ValueError(f"return_type must be one of {RETURN_TYPES}, got {return_type!r}")
    if return_type not in ("loss", "both") and (targets is not None or loss_mask is not None):
        what = "targets" if targets is not None else "loss_mask"
        raise ValueError(f"{what}= is read only for a loss: pass return_type='loss' or 'both' with it (for the "
                         "course's `logits, loss = model(idx, targets)`, use sprout.model.GPT.from_sprout(model))")


def check_layer(n_layers: int, value: Any, name: str, top: int) -> int:  # anything: refused unless an integer
    """A start/stop layer as a block index in 0..top (negative: counted from the end, as TransformerLens)."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise ValueError(f"{name} must be an integer in -{n_layers}..{top}, got {value!r}")
    layer = value.__index__()
    if not -n_layers <= layer <= top:
        raise ValueError(f"{name} must be in -{n_layers}..{top} (negative counts from the end), got {layer}")
    return layer + n_layers if layer < 0 else layer


def layer_range(n_layers: int, start_at_layer: Optional[int], stop_at_layer: Optional[int]) -> tuple[Optional[int], Optional[int]]:
    """(start, stop) as block indices, None where not given; a start after the stop is refused."""
    start = None if start_at_layer is None else check_layer(n_layers, start_at_layer, "start_at_layer", n_layers)
    stop = None if stop_at_layer is None else check_layer(n_layers, stop_at_layer, "stop_at_layer", n_layers)
    if start is not None and stop is not None and start > stop:
        raise ValueError(f"start_at_layer={start_at_layer} comes after stop_at_layer={stop_at_layer} (blocks {start} "
                         f"and {stop}): no block would run; the start must not be later than the stop")
    return start, stop


def blocks_in_range(blocks: nn.ModuleList, start_at_layer: Optional[int], stop_at_layer: Optional[int]
                    ) -> Iterator[tuple[int, nn.Module]]:
    """(index, block) for the blocks a forward runs: blocks[start_at_layer:stop_at_layer], each with its own
    index (the entry of a key-value cache), counted from the front also when `start_at_layer` is negative."""
    if start_at_layer is None and stop_at_layer is None:
        return enumerate(blocks)  # slicing a ModuleList builds a new module: not on every plain forward
    first = start_at_layer or 0
    first += len(blocks) if first < 0 else 0
    return enumerate(blocks[start_at_layer:stop_at_layer], start=first)


def check_resid(resid: object, cfg: SproutTransformerLensConfig, start_at_layer: int) -> Float[torch.Tensor, "batch pos d_model"]:
    """The residual stream entering block `start_at_layer`: [batch, pos, d_model] in the model's dtype and
    on its device, no longer than its context (the words of the token-id checks)."""
    d_model, n_ctx = cfg.d_model, cfg.n_ctx
    what = f"with start_at_layer={start_at_layer} the input is the residual stream [batch, pos, {d_model}]"
    if not isinstance(resid, torch.Tensor):
        raise TypeError(f"{what}, got {type(resid).__name__}")
    if not resid.is_floating_point():
        raise TypeError(f"{what} of floating point numbers, got dtype {resid.dtype} (token ids go in without start_at_layer)")
    if resid.dim() != 3 or resid.size(-1) != d_model:
        raise ValueError(f"{what}, got shape {tuple(resid.shape)}")
    if resid.size(0) == 0:
        raise ValueError(f"the batch is empty: shape {tuple(resid.shape)}")
    T = resid.size(1)
    if T == 0:
        raise ValueError("the sequence is empty (0 tokens)")
    if T > n_ctx:
        raise ValueError(f"sequence of {T} tokens is longer than the model's context of {n_ctx} tokens; "
                         f"nothing is truncated silently: cut it into windows yourself, e.g. "
                         f"sprout.tl.text.windows(ids, {n_ctx})")
    if resid.dtype != cfg.dtype:
        raise TypeError(f"{what} in the model's dtype {cfg.dtype}, got {resid.dtype}: cast it with .to({cfg.dtype})")
    if resid.device != torch.device(cast(str, cfg.device)):  # a built model's config names its device
        raise ValueError(f"{what} on the model's device {cfg.device}, got a tensor on {resid.device}")
    return resid


def check_loss_tokens(tokens: Int[torch.Tensor, "batch pos"], resid: Float[torch.Tensor, "batch pos d_model"]) -> None:
    """The `tokens=` of a loss from start_at_layer: one id per position of the stream."""
    if tokens.shape != resid.shape[:2]:
        raise ValueError(f"tokens has shape {tuple(tokens.shape)} but the residual stream has {tuple(resid.shape[:2])} "
                         "[batch, pos]: a loss from start_at_layer needs the ids of exactly those positions")


def course_loss(logits: Float[torch.Tensor, "batch pos d_vocab"], targets: Int[torch.Tensor, "batch pos"],
                loss_mask: Optional[Shaped[torch.Tensor, "batch pos"]] = None,
                attention_mask: Optional[Int[torch.Tensor, "batch pos"]] = None, per_token: bool = False
                ) -> Union[Float[torch.Tensor, ""], Float[torch.Tensor, "batch pos"]]:
    """model.py's loss: next-token cross-entropy against `targets` [batch, pos], averaged over the
    positions where `loss_mask` (and `attention_mask`, when given) are nonzero; per_token: [batch, pos]."""
    if not isinstance(targets, torch.Tensor) or targets.shape != logits.shape[:-1]:
        got = tuple(targets.shape) if isinstance(targets, torch.Tensor) else type(targets).__name__
        raise ValueError(f"targets must be token ids of shape {tuple(logits.shape[:-1])} (one per input position), got {got}")
    loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1), reduction="none")
    mask = loss_mask
    if attention_mask is not None:
        mask = attention_mask if mask is None else mask * attention_mask
    if per_token:
        loss = loss.view(targets.shape)
        return loss if mask is None else loss * mask.to(loss.dtype)
    if mask is None:
        return loss.mean()
    mask = mask.reshape(-1).float()
    return (loss * mask).sum() / mask.sum().clamp(min=1)


def tl_loss(logits: Float[torch.Tensor, "batch pos d_vocab"], tokens: Int[torch.Tensor, "batch pos"],
            attention_mask: Optional[Int[torch.Tensor, "batch pos"]] = None, per_token: bool = False
            ) -> Union[Float[torch.Tensor, ""], Float[torch.Tensor, "batch pos_minus_1"]]:
    """TransformerLens' loss: position t predicts token t + 1 ([batch, pos - 1] per token); padded
    positions, and the last real token before padding, are left out."""
    if tokens.size(1) < 2:
        raise ValueError("return_type='loss' predicts each next token of the input, so it needs at least 2 tokens")
    return lm_cross_entropy_loss(logits.float(), tokens, attention_mask, per_token=per_token)


def finish(logits: Float[torch.Tensor, "batch pos d_vocab"], tokens: Optional[Int[torch.Tensor, "batch pos"]],
           targets: Optional[Int[torch.Tensor, "batch pos"]], loss_mask: Optional[Shaped[torch.Tensor, "batch pos"]],
           attention_mask: Optional[Int[torch.Tensor, "batch pos"]], return_type: Optional[str], loss_per_token: bool) -> ForwardResult:
    """The forward's result for `return_type` (see the module docstring)."""
    if return_type == "logits":
        return logits
    if return_type is None:
        return None
    if targets is not None:
        loss = course_loss(logits, targets, loss_mask, attention_mask, loss_per_token)
    elif tokens is None:
        raise ValueError("a loss from start_at_layer needs the token ids: pass tokens=... (as in TransformerLens)")
    else:
        loss = tl_loss(logits, tokens, attention_mask, loss_per_token)
    return loss if return_type == "loss" else (logits, loss)
