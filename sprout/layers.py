"""Sprout's small layers: RMSNorm, rotary position embeddings, the SwiGLU feed-forward layer, and the
weightless modules that hold the hook points of a norm (`ln1`, `ln2`, `ln_final`), of the MLP (`mlp`) and
of the unembedding (`unembed`) beside model.py's weighted modules (see `sprout.model`).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformer_lens.hook_points import HookPoint

from .config import SproutConfig
from .tl.hook_flags import editable, observe
from .tl.hooked import hooked
from .tl.surface import ReadOnly
from .tl.weights import Ref, sprout_b_in, sprout_b_out, sprout_b_U, sprout_W_gate, sprout_W_in, sprout_W_out, sprout_W_U


class NormHooks(nn.Module):
    """The hook points of one norm (`ln1`, `ln2`, `ln_final`); the gain lives in the RMSNorm `norm` refers to."""

    def __init__(self, norm: "RMSNorm") -> None:
        super().__init__()
        self.norm: Ref[RMSNorm] = Ref(norm)
        self.hook_scale = HookPoint()  # [batch, pos, 1]: sqrt(mean(x^2) + eps)
        self.hook_normalized = HookPoint()  # [batch, pos, d_model]: x / scale, before the gain

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The whole RMSNorm, gain included, firing this norm's hooks: what TransformerLens' RMSNorm module
        computes, so `blocks[l].attn(blocks[l].ln1(x))` is block l's attention (`W_Q` ... carry the gain
        themselves: pair them with `normalize`). The final norm is `FinalNormHooks`, gainless."""
        return self.norm.module(x, self)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """x / rms(x) [..., d_model], without the gain and without firing hooks: `hook_normalized` for any x,
        what pairs with the folded `W_U` (TransformerLens' gainless ln_final under fold_ln)."""
        xf = _upcast(x)
        return (xf * (xf.pow(2).mean(-1, keepdim=True) + self.norm.module.eps).rsqrt()).type_as(x)


def _upcast(x: torch.Tensor) -> torch.Tensor:
    """x in float32 at least: half precisions are raised, float64 stays (a float64 model is exact)."""
    return x if x.dtype == torch.float64 else x.float()


class FinalNormHooks(NormHooks):
    """The final norm's hook points, computing as TransformerLens' folded `ln_final` (`RMSNormPre` under
    fold_ln): x / rms(x) without the gain, which `W_U` carries. So `model.unembed(model.ln_final(x))` and
    `model.ln_final(x) @ model.W_U + model.b_U` are both the logits, as TransformerLens' tools expect
    (`tools.analysis.logit_lens`' readout check, `accumulated_resid(apply_ln=True) @ W_U`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x / rms(x) [..., d_model], firing `hook_scale` and `hook_normalized`; no gain."""
        return self.norm.module(x, self, gain=False)


class RMSNorm(nn.Module):
    """Rescale a vector to unit root-mean-square, then apply a learned gain (computed in float32, or float64)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, hooks: Optional[NormHooks] = None, gain: bool = True) -> torch.Tensor:
        """The norm of x [..., d]; `hooks` fire on the way; `gain=False` leaves the gain out (the folded `ln_final`)."""
        weight = _upcast(self.weight) if gain else None
        if hooks is None or not hooked(hooks.hook_scale, hooks.hook_normalized):
            return F.rms_norm(_upcast(x), (x.size(-1),), weight, self.eps).type_as(x)
        xf = _upcast(x)
        ms = xf.pow(2).mean(-1, keepdim=True) + self.eps
        scale, same = observe(hooks.hook_scale, editable(ms.sqrt(), hooks.hook_scale))
        if not same:
            normalized = xf / scale
        else:
            # x * rsqrt, as F.rms_norm computes it: a hook that edits nothing leaves the unhooked forward's
            # numbers bit for bit (x / sqrt differs by a rounding, ~1e-5 in the logits); the zero-valued term
            # keeps the scale in the graph, so backward hooks on hook_scale fire and gradients are unchanged
            normalized = xf * ms.rsqrt()
            if scale.requires_grad and torch.is_grad_enabled():
                normalized = normalized.detach() + (xf / scale - (xf / scale).detach())
        normalized = hooks.hook_normalized(normalized)
        return (normalized if weight is None else normalized * weight).type_as(x)


def rope_tables(d_head: int, context: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of position * theta_i, each [context, d_head / 2]."""
    inv_freq = 1.0 / (base ** (torch.arange(0, d_head, 2).float() / d_head))
    angles = torch.outer(torch.arange(context).float(), inv_freq)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the pairs (x[i], x[i + d/2]) of x [batch, pos, head, d_head]; cos/sin [pos, d_head/2]."""
    return rotate(x, *rope_rows(cos, sin))


def rope_rows(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The [pos, d_head/2] tables as whole rows [pos, 1, d_head]: (cos, cos) and (-sin, sin)."""
    return torch.cat((cos, cos), dim=-1)[..., None, :], torch.cat((-sin, sin), dim=-1)[..., None, :]


def rotate(x: torch.Tensor, cos_rows: torch.Tensor, sin_rows: torch.Tensor) -> torch.Tensor:
    """RoPE on whole rows: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin) = x * (cos, cos) + (x2, x1) * (-sin, sin).

    Bit-identical to rotating the two halves apart, in four kernels instead of seven; on a busy
    2-core machine every kernel waits at a thread barrier, so the count shows in the forward's time.
    """
    return x * cos_rows + x.roll(x.size(-1) // 2, dims=-1) * sin_rows


class MLPHooks(nn.Module):
    """The hook points of the SwiGLU layer (`mlp`); the weights live in FeedForward (`ffn`) and are read,
    in TransformerLens' layout, through `W_gate` (w1, through SiLU) and `W_in` (w3, the linear half)
    [d_model, d_mlp] with ln2's gain folded in, `W_out` (w2) [d_mlp, d_model], and zero biases."""

    W_in = ReadOnly(sprout_W_in, "[d_model, d_mlp]: `ffn.w3`, the linear half of the gate, ln2's gain folded in.")
    W_gate = ReadOnly(sprout_W_gate, "[d_model, d_mlp]: `ffn.w1`, through SiLU, ln2's gain folded in.")
    W_out = ReadOnly(sprout_W_out, "[d_mlp, d_model]: `ffn.w2`.")
    b_in = ReadOnly(sprout_b_in, "[d_mlp]: zeros (Sprout has no biases).")
    b_out = ReadOnly(sprout_b_out, "[d_model]: zeros (Sprout has no biases).")

    def __init__(self, norm: RMSNorm, ffn: "FeedForward") -> None:
        super().__init__()
        self.norm: Ref[RMSNorm] = Ref(norm)  # ln2's RMSNorm, whose gain W_in/W_gate fold in
        self.ffn: Ref[FeedForward] = Ref(ffn)
        self.hook_pre = HookPoint()  # [batch, pos, d_ff]: x W1, before SiLU
        self.hook_pre_linear = HookPoint()  # [batch, pos, d_ff]: x W3, the linear half of the gate
        self.hook_post = HookPoint()  # [batch, pos, d_ff]: silu(x W1) * x W3

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The SwiGLU layer on ln2's output x [batch, pos, d_model], firing its hooks (TransformerLens' MLP)."""
        return self.ffn.module(x, self)


class FeedForward(nn.Module):
    """SwiGLU: silu(x W1) * (x W3), projected back with W2."""

    def __init__(self, cfg: SproutConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.w3 = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.w2 = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor, hooks: Optional[MLPHooks] = None) -> torch.Tensor:
        if hooks is None:
            return self.w2(F.silu(self.w1(x)) * self.w3(x))
        pre, pre_linear = hooks.hook_pre(self.w1(x)), hooks.hook_pre_linear(self.w3(x))
        return self.w2(hooks.hook_post(F.silu(pre) * pre_linear))


class UnembedHooks(nn.Module):
    """The hook point of the output layer (`unembed`); its weight is `head`, tied to `embed`, and reads as
    `W_U` [d_model, vocab] with the final norm's gain folded in, beside the zero `b_U` [vocab]."""

    W_U = ReadOnly(sprout_W_U, "[d_model, vocab]: the tied embedding `head`, transposed, the final norm's gain folded in.")
    b_U = ReadOnly(sprout_b_U, "[vocab]: zeros (Sprout has no biases).")

    def __init__(self, norm: RMSNorm, head: nn.Linear) -> None:
        super().__init__()
        self.norm: Ref[RMSNorm] = Ref(norm)  # the final RMSNorm, whose gain W_U folds in
        self.head: Ref[nn.Linear] = Ref(head)  # the output layer, tied to the embedding
        self.hook_out = HookPoint()  # [batch, pos, vocab]: the logits

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits [..., vocab] from the gainless final norm's output x (`model.ln_final(x)`, TransformerLens'
        folded convention): x @ W_U + b_U, through `hook_out`."""
        return self.hook_out(x @ self.W_U.to(x.dtype) + self.b_U.to(x.dtype))

    def from_gained(self, x: torch.Tensor) -> torch.Tensor:
        """Logits [..., vocab] from the whole final RMSNorm's output (gain applied), through the tied
        embedding and `hook_out`: the forward's own path (one matmul, the gain not folded per call)."""
        return self.hook_out(self.head.module(x))
