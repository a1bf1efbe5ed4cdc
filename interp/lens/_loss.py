"""The tuned lens' fused loss: the cross-entropy of the model's output distribution under a translated
stream's logits, with the [tokens, vocab] tensors in reused buffers (KL = this cross-entropy - H(p))."""
from __future__ import annotations

from typing import Optional

import torch
from jaxtyping import Float

from .._core.model import HookedModel, final_modules


class _CrossEntropyToTarget(torch.autograd.Function):
    """Mean over rows of -sum_v p_v log softmax(z)_v, for logits z [rows, vocab] and a fixed distribution p.

    Written out because autograd's log_softmax -> multiply -> sum keeps and re-reads three [rows, vocab]
    tensors; here the forward is one log-sum-exp and one dot product, and the backward one pass,
    softmax(z) - p. Used for an output layer other than a bias-free nn.Linear (`_UnembedCrossEntropy`).
    """

    @staticmethod
    def forward(ctx, z, p):
        lse = torch.logsumexp(z, dim=-1)  # [rows]
        ctx.save_for_backward(z, p, lse)
        return lse.mean() - torch.dot(p.reshape(-1), z.reshape(-1)) / z.shape[0]

    @staticmethod
    def backward(ctx, grad):
        z, p, lse = ctx.saved_tensors
        g = torch.exp(z - lse[:, None])
        g.sub_(p).mul_(grad / z.shape[0])
        return g, None


class Scratch:
    """The [tokens, vocab] buffers of a lens step, reused by every translator of every step: the
    output distribution `p`, and the logits, log-probabilities and gradient of one translator.

    Why: a fresh 16 MB tensor per use costs more than the arithmetic on it (glibc returns blocks that
    large to the kernel, so each one is page-faulted in again): with them reused, and the row-wise fused
    log_softmax, the gpt-4 step went from 57-65% to over 70% of its floor. `turn` counts forwards, so a
    backward that comes after a later forward (whose buffers it would read) is refused, not computed
    from the wrong logits.
    """

    def __init__(self) -> None:
        self.buffers: Optional[list[torch.Tensor]] = None
        self.turn = 0

    def take(self, rows: int, vocab: int, like: torch.Tensor) -> list[Float[torch.Tensor, "rows d_vocab"]]:
        """[p, z, log_softmax(z), grad], each [rows, vocab] like `like`."""
        b = self.buffers
        if b is None or b[0].shape != (rows, vocab) or b[0].dtype != like.dtype or b[0].device != like.device:
            b = self.buffers = [like.new_empty(rows, vocab) for _ in range(4)]
        return b

    @torch.no_grad()
    def target(self, logits: Float[torch.Tensor, "rows d_vocab"]) -> tuple[Float[torch.Tensor, "rows d_vocab"], Float[torch.Tensor, ""]]:
        """The output distribution p of logits [rows, vocab] (in a buffer) and sum_v p log p, the mean over rows."""
        p, _, log_p, _ = self.take(*logits.shape, logits)  # type: ignore[call-arg]  # logits is [rows, vocab]; mypy cannot count a Size
        torch.log_softmax(logits, dim=-1, out=log_p)
        torch.exp(log_p, out=p)
        return p, torch.dot(p.reshape(-1), log_p.reshape(-1)) / logits.shape[0]


class _UnembedCrossEntropy(torch.autograd.Function):
    """`_CrossEntropyToTarget` of the logits x @ weight^T, for normed streams x [rows, d_model] and a
    bias-free output layer's weight [vocab, d_model], with every [rows, vocab] tensor in `scratch`:
    the forward writes z = x W^T and log_softmax(z); the backward, softmax(z) - p, then one matmul back to
    [rows, d_model]. Each forward's backward must come before the next forward."""

    @staticmethod
    def forward(ctx, x, weight, p, scratch: Scratch):
        _, z, log_q, _ = scratch.take(x.shape[0], weight.shape[0], x)
        torch.mm(x, weight.t(), out=z)
        torch.log_softmax(z, dim=-1, out=log_q)
        ctx.save_for_backward(x, weight, p)
        scratch.turn += 1
        ctx.scratch, ctx.turn = scratch, scratch.turn
        return -torch.dot(p.reshape(-1), log_q.reshape(-1)) / x.shape[0]

    @staticmethod
    def backward(ctx, grad):
        x, weight, p = ctx.saved_tensors
        if ctx.scratch.turn != ctx.turn:
            raise RuntimeError("the tuned lens' logits were overwritten by a later forward: backpropagate each "
                               "translator's loss before the next one's forward (as lens_step does)")
        _, _, log_q, g = ctx.scratch.buffers
        torch.exp(log_q, out=g).sub_(p)
        scale = grad / x.shape[0]
        grad_x = torch.mm(g, weight).mul_(scale) if ctx.needs_input_grad[0] else None
        grad_w = torch.mm(g.t(), x).mul_(scale) if ctx.needs_input_grad[1] else None
        return grad_x, grad_w, None, None


def lens_cross_entropy(model: HookedModel, resid: Float[torch.Tensor, "rows d_model"], p: Float[torch.Tensor, "rows d_vocab"],
                       scratch: Scratch) -> Float[torch.Tensor, ""]:
    """Mean cross-entropy of the model's output distribution p [rows, vocab] under the logits of the
    (translated) streams resid [rows, d_model], read through the model's final norm and output layer."""
    norm, head = final_modules(model)
    x = resid if norm is None else norm(resid)
    if isinstance(head, torch.nn.Linear) and head.bias is None:
        return _UnembedCrossEntropy.apply(x.float(), head.weight.float(), p, scratch)
    return _CrossEntropyToTarget.apply(head(x).float(), p)
