"""Attention with its scores and pattern materialised for hooks, giving the fused kernel's numbers when
the hooks change nothing.

Without a hook on `hook_attn_scores` or `hook_pattern` the attention runs PyTorch's fused
`scaled_dot_product_attention`, which never forms the [batch, head, query, key] pattern. With one, the
pattern must exist, and `softmax(scores) @ v` differs from the fused kernel by float32 rounding (about
1e-7 per attention, 1e-5 in the logits of a small model), so an identity or caching hook would move the
logits past `torch.allclose`'s defaults. So when the hooks leave scores and pattern as they were (each
hook returned None or the very tensor it was given, not edited in place), z is the fused kernel's
result, bit for bit the unhooked forward's. Gradients still flow through the materialised pattern, so
backward hooks on it fire and gradients are those of `pattern @ v`: z = fused + (p - p.detach()) @ v +
p.detach() @ (v - v.detach()), whose added terms are exactly zero in value. A hook that edits either
tensor gets `pattern @ v` of its edit, as before; so does one returning a value-equal copy (a stored
pattern, `pattern.detach()`: freezing), whose returned tensor then carries the values and the gradients.
The price, only while such a hook is on: one fused attention, and under `torch.inference_mode` (whose
tensors keep no version counter) a copy of each hooked [batch, head, pos, pos] tensor. Caching hooks
(`run_with_cache`) return None and
edit nothing, so where they are the only hooks none of this is checked.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn.functional as F
from transformer_lens.hook_points import HookPoint

from .hook_flags import observe


def hooked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scores: torch.Tensor,
                     attn_mask: Optional[torch.Tensor], hook_scores: HookPoint, hook_pattern: HookPoint,
                     editable: Callable, dropout: Optional[Callable] = None) -> torch.Tensor:
    """z [batch, head, pos, d_head] from q, k, v [batch, head, pos, d_head] and the masked scores
    [batch, head, query, key], firing both hooks. `attn_mask`: None (causal) or bool [batch, 1, query,
    key], True = may attend, as the fused call takes it; `dropout`: on the pattern while training."""
    scores, same_scores = observe(hook_scores, scores)
    pattern = editable(F.softmax(scores, dim=-1), hook_pattern)  # softmax keeps its output for backward
    pattern, same_pattern = observe(hook_pattern, pattern)
    if dropout is not None or not (same_scores and same_pattern):
        return (pattern if dropout is None else dropout(pattern)) @ v
    with torch.no_grad():
        z = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=attn_mask is None)
    if not (torch.is_grad_enabled() and (pattern.requires_grad or v.requires_grad)):
        return z
    return z + (pattern - pattern.detach()) @ v + pattern.detach() @ (v - v.detach())
