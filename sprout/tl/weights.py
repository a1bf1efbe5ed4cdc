"""What TransformerLens' weight names on the modules of Sprout and the walkthrough GPT read
(`blocks[l].attn.W_Q`, `blocks[l].mlp.W_in`, `embed.W_E`, `unembed.W_U`, ...): one short getter per name
and model, which each module class declares as its own one-line attribute (`W_Q = ReadOnly(sprout_W_Q,
"...")`, `sprout.tl.surface.ReadOnly`, read-only); `sprout/tl/stacked_weights.py` stacks them per model.
Each getter takes the module, typed by a Protocol of what it reads (`SproutAttentionParts`, ...), so this
module imports none of the model's. Also here: the norm folding (`fold_in` ...), the head layouts
(`heads_in`, `heads_out`), `Ref`, and the embeddings `Embed` and `PosEmbed`.

The layout is TransformerLens' (`W_Q` [n_heads, d_model, d_head], `W_O` [n_heads, d_head, d_model],
`W_in` [d_model, d_mlp], ...), and as with TransformerLens' default loading
(`fold_ln=True`) each norm's gain is folded into the matrices that read its output: ln1's into
`W_Q`/`W_K`/`W_V`, ln2's into `W_in`/`W_gate`, the final norm's into `W_U`. So
`blocks.{l}.ln1.hook_normalized @ W_Q[l]` is `blocks.{l}.attn.hook_q`. A LayerNorm's bias folds into
the reader's bias (`b_Q = ln1.b @ W_Q_raw`). Nothing is copied into the state dict: every name is
computed on each read from the modules' own weights (`attn.qkv.weight`, `ffn.w1.weight`, ...), which stay
the raw, trainable parameters under model.py's keys.

A norm and the modules that read it are siblings in a block (`norm1` beside `attn`), so each reader
holds its norm through a `Ref`, outside the module tree: not a parameter, not a submodule, not a
state-dict key.
"""
from __future__ import annotations

from typing import Generic, Optional, Protocol, TypeVar, cast

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
    def __init__(self, module: M = None) -> None:  # type: ignore[assignment]
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
# The Protocols' Refs are read-only properties: a protocol's plain attribute could be assigned, so it would
# have to match exactly, and a module holding a Ref[RMSNorm] would not fit a Ref[Optional[nn.Module]].


class SproutAttentionParts(Protocol):
    """What the getters read of Sprout's Attention: the fused `qkv` [3 * d_model, d_model], `proj`, ln1."""

    qkv: nn.Linear
    proj: nn.Linear
    n_head: int
    d_head: int

    @property
    def norm(self) -> Ref[Optional[nn.Module]]: ...


def sprout_qkv(attn: SproutAttentionParts, i: int) -> torch.Tensor:
    """The i-th third of `qkv` (0 query, 1 key, 2 value) as [head, d_model, d_head], ln1's gain folded in."""
    d = attn.n_head * attn.d_head
    return fold_in(heads_in(attn.qkv.weight[i * d:(i + 1) * d], attn.n_head), attn.norm.module)


def sprout_W_Q(attn: SproutAttentionParts) -> torch.Tensor:
    return sprout_qkv(attn, 0)


def sprout_W_K(attn: SproutAttentionParts) -> torch.Tensor:
    return sprout_qkv(attn, 1)


def sprout_W_V(attn: SproutAttentionParts) -> torch.Tensor:
    return sprout_qkv(attn, 2)


def sprout_W_O(attn: SproutAttentionParts) -> torch.Tensor:
    return heads_out(attn.proj.weight, attn.n_head)


def sprout_b_qkv(attn: SproutAttentionParts) -> torch.Tensor:
    """Zeros [head, d_head]: Sprout has no biases (`b_Q`, `b_K` and `b_V` all read this)."""
    return attn.qkv.weight.new_zeros((attn.n_head, attn.d_head))


def sprout_b_O(attn: SproutAttentionParts) -> torch.Tensor:
    return attn.qkv.weight.new_zeros((attn.proj.weight.size(0),))


class SwiGLUParts(Protocol):
    """What the getters read of Sprout's FeedForward: w1 (through SiLU), w3 (the linear half), w2 (out)."""

    w1: nn.Linear
    w2: nn.Linear
    w3: nn.Linear


class SproutMLPParts(Protocol):
    """What the getters read of Sprout's MLPHooks: the FeedForward and ln2's RMSNorm, both siblings."""

    @property
    def norm(self) -> Ref[Optional[nn.Module]]: ...
    @property
    def ffn(self) -> Ref[nn.Module]: ...


def _swiglu(mlp: SproutMLPParts) -> SwiGLUParts:
    # A Ref holds an nn.Module, and FeedForward's class is in sprout.layers, which imports this module.
    return cast(SwiGLUParts, mlp.ffn.module)


def sprout_W_in(mlp: SproutMLPParts) -> torch.Tensor:
    return fold_in(_swiglu(mlp).w3.weight.T, mlp.norm.module)


def sprout_W_gate(mlp: SproutMLPParts) -> torch.Tensor:
    return fold_in(_swiglu(mlp).w1.weight.T, mlp.norm.module)


def sprout_W_out(mlp: SproutMLPParts) -> torch.Tensor:
    return _swiglu(mlp).w2.weight.T


def sprout_b_in(mlp: SproutMLPParts) -> torch.Tensor:
    w1 = _swiglu(mlp).w1.weight
    return w1.new_zeros(w1.size(0))


def sprout_b_out(mlp: SproutMLPParts) -> torch.Tensor:
    w2 = _swiglu(mlp).w2.weight
    return w2.new_zeros(w2.size(0))


class SproutUnembedParts(Protocol):
    """What the getters read of Sprout's UnembedHooks: the output layer (tied to the embedding), the final norm."""

    @property
    def norm(self) -> Ref[Optional[nn.Module]]: ...
    @property
    def head(self) -> Ref[nn.Linear]: ...


def sprout_W_U(unembed: SproutUnembedParts) -> torch.Tensor:
    return fold_in(unembed.head.module.weight.T, unembed.norm.module)


def sprout_b_U(unembed: SproutUnembedParts) -> torch.Tensor:
    head = unembed.head.module.weight
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


class WalkthroughAttentionParts(Protocol):
    """What the getters read of the walkthrough's Attention: its separate heads (each with `query`, `key`,
    `value` Linears), the biased `projection`, ln1 and step 4.8's extra projection after it."""

    n_head: int
    heads: nn.ModuleList
    projection: nn.Linear

    @property
    def norm(self) -> Ref[Optional[nn.Module]]: ...
    @property
    def after(self) -> Ref[Optional[nn.Module]]: ...


def walkthrough_heads(attn: WalkthroughAttentionParts, name: str) -> torch.Tensor:
    """Every head's `name` Linear ("query", "key" or "value") as [head, d_model, d_head], not folded."""
    weight = torch.cat([getattr(h, name).weight for h in attn.heads])  # [head * d_head, d_model]
    return heads_in(weight, attn.n_head)


def walkthrough_W_Q(attn: WalkthroughAttentionParts) -> torch.Tensor:
    return fold_in(walkthrough_heads(attn, "query"), attn.norm.module)


def walkthrough_W_K(attn: WalkthroughAttentionParts) -> torch.Tensor:
    return fold_in(walkthrough_heads(attn, "key"), attn.norm.module)


def walkthrough_W_V(attn: WalkthroughAttentionParts) -> torch.Tensor:
    return fold_in(walkthrough_heads(attn, "value"), attn.norm.module)


def walkthrough_W_O(attn: WalkthroughAttentionParts) -> torch.Tensor:
    return fold_out(heads_out(attn.projection.weight, attn.n_head), attn.after.module)


def walkthrough_b_Q(attn: WalkthroughAttentionParts) -> torch.Tensor:
    return fold_bias(walkthrough_heads(attn, "query"), None, attn.norm.module)


def walkthrough_b_K(attn: WalkthroughAttentionParts) -> torch.Tensor:
    return fold_bias(walkthrough_heads(attn, "key"), None, attn.norm.module)


def walkthrough_b_V(attn: WalkthroughAttentionParts) -> torch.Tensor:
    return fold_bias(walkthrough_heads(attn, "value"), None, attn.norm.module)


def walkthrough_b_O(attn: WalkthroughAttentionParts) -> torch.Tensor:
    return fold_out_bias(attn.projection.bias, attn.after.module)


class WalkthroughMLPParts(Protocol):
    """What the getters read of the walkthrough's MLP: `fc1`, `fc2`, ln2 and step 4.8's extra projection."""

    fc1: nn.Linear
    fc2: nn.Linear

    @property
    def norm(self) -> Ref[Optional[nn.Module]]: ...
    @property
    def after(self) -> Ref[Optional[nn.Module]]: ...


def walkthrough_W_in(mlp: WalkthroughMLPParts) -> torch.Tensor:
    return fold_in(mlp.fc1.weight.T, mlp.norm.module)


def walkthrough_b_in(mlp: WalkthroughMLPParts) -> torch.Tensor:
    return fold_bias(mlp.fc1.weight.T, mlp.fc1.bias, mlp.norm.module)


def walkthrough_W_out(mlp: WalkthroughMLPParts) -> torch.Tensor:
    return fold_out(mlp.fc2.weight.T, mlp.after.module)


def walkthrough_b_out(mlp: WalkthroughMLPParts) -> torch.Tensor:
    return fold_out_bias(mlp.fc2.bias, mlp.after.module)


class WalkthroughUnembedParts(Protocol):
    """What the getters read of the walkthrough's Unembed: its own Linear weight and bias, the final norm."""

    weight: torch.Tensor
    bias: nn.Parameter  # nn.Linear's own type: a protocol's attribute must match it exactly

    @property
    def norm(self) -> Ref[Optional[nn.Module]]: ...


def walkthrough_W_U(unembed: WalkthroughUnembedParts) -> torch.Tensor:
    return fold_in(unembed.weight.T, unembed.norm.module)


def walkthrough_b_U(unembed: WalkthroughUnembedParts) -> torch.Tensor:
    return fold_bias(unembed.weight.T, unembed.bias, unembed.norm.module)
