"""The forward's two calling conventions: the course's `(logits, loss)` and TransformerLens' `return_type`.

The course writes `logits, loss = model(idx, targets)` and `logits, _ = model(idx)`; TransformerLens
writes `logits = model(tokens)` and `model(tokens, return_type="loss")`. Both hold at once:

- with `targets` (and no `return_type`) the forward returns the tuple `(logits, loss)`, as model.py;
- with `return_type` it returns exactly what TransformerLens' HookedTransformer does;
- with neither it returns the logits as an `Output`: a torch.Tensor in every respect (indexing,
  arithmetic, `.softmax`, shapes; every result of an operation on it is a plain Tensor) except that
  unpacking it into two names, `logits, loss = model(idx)`, gives `(logits, None)`, the course's pair.

Only a two-name unpacking statement gets the pair; `for row in logits`, `list(logits)`, `zip(logits, ...)`
and `torch.unbind` iterate over the batch as for any tensor. The price is one corner: a TransformerLens
user who unpacks a batch of two by `a, b = model(tokens)` gets (logits, None); write `a, b = logits.unbind()`.
"""
from __future__ import annotations

import dis
import sys
from typing import Optional

import torch
import torch.nn.functional as F
from transformer_lens.utilities.lm_utils import lm_cross_entropy_loss

_UNPACK_SEQUENCE = dis.opmap["UNPACK_SEQUENCE"]
RETURN_TYPES = ("logits", "loss", "both", None)


class _Unset:
    def __repr__(self):
        return "<course default>"


COURSE = _Unset()  # return_type not given: the course's contract


class Output(torch.Tensor):
    """Logits [batch, pos, vocab] (or the residual stream under `stop_at_layer`) that also unpack as the
    course's pair `(logits, None)`."""

    # Operations on an Output give plain Tensors: no subclass dispatch on any later op, so no cost.
    __torch_function__ = torch._C._disabled_torch_function_impl

    def __iter__(self):
        # Python asks for an iterator both to unpack (`a, b = x`) and to loop (`for row in x`); the
        # caller's current instruction tells them apart: UNPACK_SEQUENCE 2 is the course's pair.
        frame = sys._getframe(1)
        code, i = frame.f_code.co_code, frame.f_lasti
        if code[i] == _UNPACK_SEQUENCE and code[i + 1] == 2:
            return iter((self.as_subclass(torch.Tensor), None))
        return iter(self.as_subclass(torch.Tensor))

    def __repr__(self):
        return repr(self.as_subclass(torch.Tensor))

    def __reduce_ex__(self, proto):
        return self.as_subclass(torch.Tensor).__reduce_ex__(proto)


def split_positional(targets, loss_mask, return_type, loss_per_token):
    """TransformerLens' second and third positional arguments are `return_type` and `loss_per_token`;
    the course's are `targets` and `loss_mask`. A string in second place is a return_type."""
    if isinstance(targets, str):
        return_type, targets = targets, None
        if isinstance(loss_mask, bool):
            loss_per_token, loss_mask = loss_mask, None
    if return_type is not COURSE and return_type not in RETURN_TYPES:
        raise ValueError(f"return_type must be one of {RETURN_TYPES}, got {return_type!r}")
    return targets, loss_mask, return_type, loss_per_token


def course_loss(logits: torch.Tensor, targets: torch.Tensor, loss_mask=None, attention_mask=None,
                per_token: bool = False) -> torch.Tensor:
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


def tl_loss(logits: torch.Tensor, tokens: torch.Tensor, attention_mask=None, per_token: bool = False):
    """TransformerLens' loss: position t predicts token t + 1 ([batch, pos - 1] per token); padded
    positions, and the last real token before padding, are left out."""
    if tokens.size(1) < 2:
        raise ValueError("return_type='loss' predicts each next token of the input, so it needs at least 2 tokens")
    return lm_cross_entropy_loss(logits.float(), tokens, attention_mask, per_token=per_token)


def finish(logits: torch.Tensor, tokens: Optional[torch.Tensor], targets, loss_mask, attention_mask,
           return_type, loss_per_token: bool):
    """The forward's result for the chosen convention (see the module docstring)."""
    if return_type is COURSE:
        if targets is None:
            return logits.as_subclass(Output)
        return logits, course_loss(logits, targets, loss_mask, attention_mask, loss_per_token)
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
