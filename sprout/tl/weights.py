"""TransformerLens' weight matrices on the modules of Sprout and the walkthrough GPT (`blocks[l].attn.W_Q`,
`blocks[l].mlp.W_in`, `embed.W_E`, `unembed.W_U`, ...); `sprout/tl/stacked_weights.py` stacks them per model.

The layout is TransformerLens' (`W_Q` [n_heads, d_model, d_head], `W_O` [n_heads, d_head, d_model],
`W_in` [d_model, d_mlp], ...), and as with TransformerLens' default loading
(`fold_ln=True`) each norm's gain is folded into the matrices that read its output: ln1's into
`W_Q`/`W_K`/`W_V`, ln2's into `W_in`/`W_gate`, the final norm's into `W_U`. So
`blocks.{l}.ln1.hook_normalized @ W_Q[l]` is `blocks.{l}.attn.hook_q`. A LayerNorm's bias folds into
the reader's bias (`b_Q = ln1.b @ W_Q_raw`). Nothing is copied into the state dict: every property is
computed from the modules' own weights (`attn.qkv.weight`, `ffn.w1.weight`, ...), which stay the
raw, trainable parameters under model.py's keys.

A norm and the modules that read it are siblings in a block (`norm1` beside `attn`), so each reader
holds its norm through a `Ref`, outside the module tree: not a parameter, not a submodule, not a
state-dict key.
"""
from __future__ import annotations

from typing import Any, Generic, Optional, TypeVar, cast

import torch
import torch.nn as nn

# Covariant: a Ref is only read, so a Ref[RMSNorm] is a Ref[Optional[nn.Module]].
M = TypeVar("M", bound=Optional[nn.Module], covariant=True)


class Ref(Generic[M]):
    """A reference to a sibling module (e.g. the norm before a reader), held outside the module tree.

    Assigning a module to a module's attribute registers it as a submodule (a second state-dict key, a
    second path to its hooks); a Ref is a plain object, so `ref.module` is only read. `copy.deepcopy`
    and pickling follow it to the copied sibling, as they follow any shared object.
    """

    __slots__ = ("module",)

    # Ref() is only made where M includes None (walkthrough.Block fills it later); mypy cannot tie a default to M.
    def __init__(self, module: M = None):  # type: ignore[assignment]
        self.module = module

    def __repr__(self) -> str:
        return f"Ref({type(self.module).__name__})"


def _norm_affine(norm: Optional[nn.Module]) -> tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
    """(gain, bias) of an RMSNorm or LayerNorm; None where there is no norm or no bias."""
    if norm is None or not hasattr(norm, "weight"):
        return None, None
    return cast(torch.Tensor, norm.weight), getattr(norm, "bias", None)


def fold_in(W: torch.Tensor, norm: Optional[nn.Module]) -> torch.Tensor:
    """W [..., d_model, d_out] reading a norm's output -> the same map from the normalised x (gain folded)."""
    gain, _ = _norm_affine(norm)
    return W if gain is None else gain[:, None] * W


def fold_bias(W: torch.Tensor, b: Optional[torch.Tensor], norm: Optional[nn.Module]) -> torch.Tensor:
    """The reader's bias [..., d_out] plus what the norm's bias contributes through W [..., d_model, d_out]."""
    _, beta = _norm_affine(norm)
    if b is None:
        b = W.new_zeros(W.shape[:-2] + W.shape[-1:])
    return b if beta is None else b + torch.einsum("m,...mo->...o", beta, W)


def fold_out(W: torch.Tensor, after: Optional[nn.Module]) -> torch.Tensor:
    """W [..., d_model] writing into a Linear `after` (step 4.8's extra projection) -> the composed write."""
    return W if after is None else W @ cast(torch.Tensor, after.weight).T


def fold_out_bias(b: torch.Tensor, after: Optional[nn.Module]) -> torch.Tensor:
    return b if after is None else after(b)


def heads_in(weight: torch.Tensor, n_head: int) -> torch.Tensor:
    """nn.Linear weight [n_head * d_head, d_model] -> TransformerLens' [n_head, d_model, d_head]."""
    return weight.view(n_head, -1, weight.size(-1)).transpose(1, 2)


def heads_out(weight: torch.Tensor, n_head: int) -> torch.Tensor:
    """nn.Linear weight [d_model, n_head * d_head] -> TransformerLens' [n_head, d_head, d_model]."""
    return weight.T.reshape(n_head, -1, weight.size(0))


# ----------------------------------------------------------------------------- Sprout's modules


class SproutAttentionWeights:
    """`W_Q`, `W_K`, `W_V` [head, d_model, d_head] (ln1's gain folded in), `W_O` [head, d_head, d_model],
    and the zero biases, for Sprout's Attention (fused `qkv`, `proj`). The QK-norm gains are not in
    `W_Q`/`W_K`: they act after QK-norm's per-vector rescaling (see the README on QK circuits)."""

    n_head: int
    d_head: int
    qkv: nn.Linear
    proj: nn.Linear
    norm: Ref[Optional[nn.Module]]

    def _qkv(self, i: int) -> torch.Tensor:
        d = self.n_head * self.d_head
        return fold_in(heads_in(self.qkv.weight[i * d:(i + 1) * d], self.n_head), self.norm.module)

    @property
    def W_Q(self) -> torch.Tensor:
        return self._qkv(0)

    @property
    def W_K(self) -> torch.Tensor:
        return self._qkv(1)

    @property
    def W_V(self) -> torch.Tensor:
        return self._qkv(2)

    @property
    def W_O(self) -> torch.Tensor:
        return heads_out(self.proj.weight, self.n_head)

    def _zeros(self, *shape) -> torch.Tensor:
        return self.qkv.weight.new_zeros(shape)

    @property
    def b_Q(self) -> torch.Tensor:
        return self._zeros(self.n_head, self.d_head)

    @property
    def b_K(self) -> torch.Tensor:
        return self._zeros(self.n_head, self.d_head)

    @property
    def b_V(self) -> torch.Tensor:
        return self._zeros(self.n_head, self.d_head)

    @property
    def b_O(self) -> torch.Tensor:
        return self._zeros(self.proj.weight.size(0))


class SproutMLPWeights:
    """`W_gate` (w1, through SiLU) and `W_in` (w3, the linear half) [d_model, d_mlp] with ln2's gain
    folded in, `W_out` (w2) [d_mlp, d_model], zero biases; on the hook module `mlp`, read from `ffn`."""

    norm: Ref[Optional[nn.Module]]
    ffn: Ref[Any]  # sprout.layers.FeedForward (w1, w2, w3), not imported: layers imports this module

    def _ffn(self) -> Any:
        return self.ffn.module

    @property
    def W_in(self) -> torch.Tensor:
        return fold_in(self._ffn().w3.weight.T, self.norm.module)

    @property
    def W_gate(self) -> torch.Tensor:
        return fold_in(self._ffn().w1.weight.T, self.norm.module)

    @property
    def W_out(self) -> torch.Tensor:
        return self._ffn().w2.weight.T

    @property
    def b_in(self) -> torch.Tensor:
        return self._ffn().w1.weight.new_zeros(self._ffn().w1.weight.size(0))

    @property
    def b_out(self) -> torch.Tensor:
        return self._ffn().w2.weight.new_zeros(self._ffn().w2.weight.size(0))


class SproutUnembedWeights:
    """`W_U` [d_model, vocab] (the final norm's gain folded in; the matrix is the tied embedding) and
    the zero `b_U` [vocab], on the hook module `unembed`."""

    norm: Ref[Optional[nn.Module]]
    head: Ref[nn.Linear]

    @property
    def W_U(self) -> torch.Tensor:
        return fold_in(self.head.module.weight.T, self.norm.module)

    @property
    def b_U(self) -> torch.Tensor:
        head = self.head.module.weight
        return head.new_zeros(head.size(0))


class Embed(nn.Embedding):
    """nn.Embedding (state-dict key `embed.weight`) that also answers TransformerLens' `W_E` [vocab, d_model]."""

    @property
    def W_E(self) -> torch.Tensor:
        return self.weight


class PosEmbed(nn.Embedding):
    """nn.Embedding of positions that also answers TransformerLens' `W_pos` [n_ctx, d_model]."""

    @property
    def W_pos(self) -> torch.Tensor:
        return self.weight


# ----------------------------------------------------------------------------- the walkthrough's modules


class WalkthroughAttentionWeights:
    """The walkthrough's separate heads in TransformerLens' layout; ln1 (a LayerNorm, when the step has
    one) folds into `W_Q`/`W_K`/`W_V` and its bias into `b_Q`/`b_K`/`b_V`; `b_O` is the projection's bias.
    Step 4.8's extra projection after the attention folds into `W_O`/`b_O`, so `hook_z @ W_O + b_O` is
    what the attention writes to the stream there too."""

    n_head: int
    heads: nn.ModuleList
    projection: nn.Linear
    norm: Ref[Optional[nn.Module]]
    after: Ref[Optional[nn.Module]]

    def _stacked(self, name: str) -> torch.Tensor:
        weight = torch.cat([getattr(h, name).weight for h in self.heads])  # [head * d_head, d_model]
        return heads_in(weight, self.n_head)

    @property
    def W_Q(self) -> torch.Tensor:
        return fold_in(self._stacked("query"), self.norm.module)

    @property
    def W_K(self) -> torch.Tensor:
        return fold_in(self._stacked("key"), self.norm.module)

    @property
    def W_V(self) -> torch.Tensor:
        return fold_in(self._stacked("value"), self.norm.module)

    @property
    def W_O(self) -> torch.Tensor:
        return fold_out(heads_out(self.projection.weight, self.n_head), self.after.module)

    @property
    def b_Q(self) -> torch.Tensor:
        return fold_bias(self._stacked("query"), None, self.norm.module)

    @property
    def b_K(self) -> torch.Tensor:
        return fold_bias(self._stacked("key"), None, self.norm.module)

    @property
    def b_V(self) -> torch.Tensor:
        return fold_bias(self._stacked("value"), None, self.norm.module)

    @property
    def b_O(self) -> torch.Tensor:
        return fold_out_bias(self.projection.bias, self.after.module)


class WalkthroughMLPWeights:
    """`W_in` [d_model, d_mlp] (ln2 folded in) and `b_in` (fc1's bias plus ln2's bias through fc1),
    `W_out` [d_mlp, d_model] and `b_out` (fc2, with step 4.8's extra projection folded in)."""

    fc1: nn.Linear
    fc2: nn.Linear
    norm: Ref[Optional[nn.Module]]
    after: Ref[Optional[nn.Module]]

    @property
    def W_in(self) -> torch.Tensor:
        return fold_in(self.fc1.weight.T, self.norm.module)

    @property
    def b_in(self) -> torch.Tensor:
        return fold_bias(self.fc1.weight.T, self.fc1.bias, self.norm.module)

    @property
    def W_out(self) -> torch.Tensor:
        return fold_out(self.fc2.weight.T, self.after.module)

    @property
    def b_out(self) -> torch.Tensor:
        return fold_out_bias(self.fc2.bias, self.after.module)


class WalkthroughUnembedWeights:
    """`W_U` [d_model, vocab] and `b_U` [vocab] with the final LayerNorm folded in, when the step has one."""

    weight: torch.Tensor
    bias: nn.Parameter  # nn.Linear's
    norm: Ref[Optional[nn.Module]]

    @property
    def W_U(self) -> torch.Tensor:
        return fold_in(self.weight.T, self.norm.module)

    @property
    def b_U(self) -> torch.Tensor:
        return fold_bias(self.weight.T, self.bias, self.norm.module)
