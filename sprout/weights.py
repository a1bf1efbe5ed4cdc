"""TransformerLens' weight matrices on Sprout and the walkthrough GPT: `W_E`, `W_Q` ... `W_U`, `QK`, `OV`.

The layout is TransformerLens' (`W_Q` [n_layers, n_heads, d_model, d_head], `W_O` [n_layers, n_heads,
d_head, d_model], `W_in` [n_layers, d_model, d_mlp], ...), and as with TransformerLens' default loading
(`fold_ln=True`) each norm's gain is folded into the matrices that read its output: ln1's into
`W_Q`/`W_K`/`W_V`, ln2's into `W_in`/`W_gate`, the final norm's into `W_U`. So
`blocks.{l}.ln1.hook_normalized @ W_Q[l]` is `blocks.{l}.attn.hook_q`. A LayerNorm's bias folds into
the reader's bias (`b_Q = ln1.b @ W_Q_raw`). Nothing is copied into the state dict: every property is
computed from the modules' own weights (`attn.qkv.weight`, `ffn.w1.weight`, ...), which stay the
raw, trainable parameters under model.py's keys.

A norm and the modules that read it are siblings in a block (`norm1` beside `attn`), so each reader
holds a plain reference to the norm it reads (`link`), outside the module tree: not a parameter, not a
submodule, not a state-dict key.
"""
from __future__ import annotations

from typing import Iterator, Optional

import torch
import torch.nn as nn
from transformer_lens.FactoredMatrix import FactoredMatrix
from transformer_lens.utilities.matrix import composition_scores


def link(module: nn.Module, **siblings: Optional[nn.Module]) -> None:
    """Let `module` read its siblings' weights (e.g. the norm before it) without registering them."""
    module.__dict__.setdefault("_linked", {}).update(siblings)


def linked(module: nn.Module, name: str) -> Optional[nn.Module]:
    return module.__dict__.get("_linked", {}).get(name)


def _norm_affine(norm: Optional[nn.Module]) -> tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
    """(gain, bias) of an RMSNorm or LayerNorm; None where there is no norm or no bias."""
    if norm is None or not hasattr(norm, "weight"):
        return None, None
    return norm.weight, getattr(norm, "bias", None)


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

    def _qkv(self, i: int) -> torch.Tensor:
        d = self.n_head * self.d_head
        return fold_in(heads_in(self.qkv.weight[i * d:(i + 1) * d], self.n_head), linked(self, "norm"))

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

    def _ffn(self) -> nn.Module:
        ffn = linked(self, "ffn")
        if ffn is None:
            raise AttributeError("this MLP hook module is not linked to a feed-forward layer")
        return ffn

    @property
    def W_in(self) -> torch.Tensor:
        return fold_in(self._ffn().w3.weight.T, linked(self, "norm"))

    @property
    def W_gate(self) -> torch.Tensor:
        return fold_in(self._ffn().w1.weight.T, linked(self, "norm"))

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

    @property
    def W_U(self) -> torch.Tensor:
        return fold_in(linked(self, "head").weight.T, linked(self, "norm"))

    @property
    def b_U(self) -> torch.Tensor:
        head = linked(self, "head").weight
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
    one) folds into `W_Q`/`W_K`/`W_V` and its bias into `b_Q`/`b_K`/`b_V`; `b_O` is the projection's bias."""

    def _stacked(self, name: str) -> torch.Tensor:
        weight = torch.cat([getattr(h, name).weight for h in self.heads])  # [head * d_head, d_model]
        return heads_in(weight, self.n_head)

    @property
    def W_Q(self) -> torch.Tensor:
        return fold_in(self._stacked("query"), linked(self, "norm"))

    @property
    def W_K(self) -> torch.Tensor:
        return fold_in(self._stacked("key"), linked(self, "norm"))

    @property
    def W_V(self) -> torch.Tensor:
        return fold_in(self._stacked("value"), linked(self, "norm"))

    @property
    def W_O(self) -> torch.Tensor:
        return heads_out(self.projection.weight, self.n_head)

    @property
    def b_Q(self) -> torch.Tensor:
        return fold_bias(self._stacked("query"), None, linked(self, "norm"))

    @property
    def b_K(self) -> torch.Tensor:
        return fold_bias(self._stacked("key"), None, linked(self, "norm"))

    @property
    def b_V(self) -> torch.Tensor:
        return fold_bias(self._stacked("value"), None, linked(self, "norm"))

    @property
    def b_O(self) -> torch.Tensor:
        return self.projection.bias


class WalkthroughMLPWeights:
    """`W_in` [d_model, d_mlp] (ln2 folded in) and `b_in` (fc1's bias plus ln2's bias through fc1),
    `W_out` [d_mlp, d_model] and `b_out` (fc2)."""

    @property
    def W_in(self) -> torch.Tensor:
        return fold_in(self.fc1.weight.T, linked(self, "norm"))

    @property
    def b_in(self) -> torch.Tensor:
        return fold_bias(self.fc1.weight.T, self.fc1.bias, linked(self, "norm"))

    @property
    def W_out(self) -> torch.Tensor:
        return self.fc2.weight.T

    @property
    def b_out(self) -> torch.Tensor:
        return self.fc2.bias


class WalkthroughUnembedWeights:
    """`W_U` [d_model, vocab] and `b_U` [vocab] with the final LayerNorm folded in, when the step has one."""

    @property
    def W_U(self) -> torch.Tensor:
        return fold_in(self.weight.T, linked(self, "norm"))

    @property
    def b_U(self) -> torch.Tensor:
        return fold_bias(self.weight.T, self.bias, linked(self, "norm"))


# ----------------------------------------------------------------------------- the model


class TLWeights:
    """The model-level weights, stacked over blocks, as TransformerLens' HookedTransformer has them.

    Needs `blocks[l].attn` and (with an MLP) `blocks[l].mlp` answering the per-module properties,
    `embed` (an `Embed`), `unembed` answering `W_U`/`b_U`, and `cfg`.
    """

    def _stack(self, module: str, name: str) -> torch.Tensor:
        parts = []
        for l, block in enumerate(self.blocks):
            owner = getattr(block, module, None)
            if owner is None:
                raise AttributeError(f"blocks.{l} has no {module} (this model's layers have none), so there "
                                     f"is no {name}")
            parts.append(getattr(owner, name))
        return torch.stack(parts)

    @property
    def W_E(self) -> torch.Tensor:
        """[d_vocab, d_model]: the token embedding."""
        return self.embed.W_E

    @property
    def W_pos(self) -> torch.Tensor:
        """[n_ctx, d_model]: the learned position embedding (the walkthrough GPT; Sprout uses RoPE)."""
        pos_embed = getattr(self, "pos_embed", None)
        if pos_embed is None:
            raise AttributeError("W_pos: this model has no learned position embedding (Sprout rotates queries and "
                                 "keys with RoPE; positional_embedding_type='rotary')")
        return pos_embed.W_pos

    @property
    def W_E_pos(self) -> torch.Tensor:
        """[d_vocab + n_ctx, d_model]: `W_E` and `W_pos` stacked, the input space of full circuits."""
        return torch.cat([self.W_E, self.W_pos])

    @property
    def W_U(self) -> torch.Tensor:
        """[d_model, d_vocab]: the unembedding with the final norm folded in, so `ln_final(x) @ W_U + b_U` are the logits."""
        return self.unembed.W_U

    @property
    def b_U(self) -> torch.Tensor:
        """[d_vocab]"""
        return self.unembed.b_U

    @property
    def W_Q(self) -> torch.Tensor:
        """[n_layers, n_heads, d_model, d_head], ln1's gain folded in: `ln1.hook_normalized @ W_Q[l] + b_Q[l]` is `hook_q`."""
        return self._stack("attn", "W_Q")

    @property
    def W_K(self) -> torch.Tensor:
        """[n_layers, n_heads, d_model, d_head], ln1's gain folded in."""
        return self._stack("attn", "W_K")

    @property
    def W_V(self) -> torch.Tensor:
        """[n_layers, n_heads, d_model, d_head], ln1's gain folded in."""
        return self._stack("attn", "W_V")

    @property
    def W_O(self) -> torch.Tensor:
        """[n_layers, n_heads, d_head, d_model]: `hook_z[:, :, h] @ W_O[l, h]` is head h's write."""
        return self._stack("attn", "W_O")

    @property
    def b_Q(self) -> torch.Tensor:
        """[n_layers, n_heads, d_head]"""
        return self._stack("attn", "b_Q")

    @property
    def b_K(self) -> torch.Tensor:
        """[n_layers, n_heads, d_head]"""
        return self._stack("attn", "b_K")

    @property
    def b_V(self) -> torch.Tensor:
        """[n_layers, n_heads, d_head]"""
        return self._stack("attn", "b_V")

    @property
    def b_O(self) -> torch.Tensor:
        """[n_layers, d_model]"""
        return self._stack("attn", "b_O")

    @property
    def W_in(self) -> torch.Tensor:
        """[n_layers, d_model, d_mlp], ln2's gain folded in (Sprout: the linear half of the gate, w3)."""
        return self._stack("mlp", "W_in")

    @property
    def W_gate(self) -> Optional[torch.Tensor]:
        """[n_layers, d_model, d_mlp], ln2's gain folded in (Sprout: w1, through SiLU); None without a gated MLP."""
        if not self.cfg.gated_mlp:
            return None
        return self._stack("mlp", "W_gate")

    @property
    def W_out(self) -> torch.Tensor:
        """[n_layers, d_mlp, d_model]"""
        return self._stack("mlp", "W_out")

    @property
    def b_in(self) -> torch.Tensor:
        """[n_layers, d_mlp]"""
        return self._stack("mlp", "b_in")

    @property
    def b_out(self) -> torch.Tensor:
        """[n_layers, d_model]"""
        return self._stack("mlp", "b_out")

    @property
    def QK(self) -> FactoredMatrix:
        """[n_layers, n_heads, d_model, d_model]: `W_Q @ W_K^T`, the bilinear form of the scores before
        RoPE and QK-norm (Sprout's real scores are not bilinear in the stream; see the README)."""
        return FactoredMatrix(self.W_Q, self.W_K.transpose(-2, -1))

    @property
    def OV(self) -> FactoredMatrix:
        """[n_layers, n_heads, d_model, d_model]: `W_V @ W_O`, what each head writes per unit of attention."""
        return FactoredMatrix(self.W_V, self.W_O)

    def all_composition_scores(self, mode: str) -> torch.Tensor:
        """[n_layers, n_heads, n_layers, n_heads]: how much each head's OV feeds a later head's Q, K or V
        (Elhage et al. 2021), by TransformerLens' `composition_scores`; zero where the second head is
        not in a later layer. Sprout's Q and K composition read `QK`, which leaves out RoPE and QK-norm."""
        if mode not in ("Q", "K", "V"):
            raise ValueError(f"mode must be 'Q', 'K' or 'V', got {mode!r}")
        right = {"Q": lambda: self.QK, "K": lambda: self.QK.T, "V": lambda: self.OV}[mode]()
        scores = composition_scores(self.OV, right, broadcast_dims=True)
        layer = torch.arange(self.cfg.n_layers, device=scores.device)
        later = layer[:, None, None, None] < layer[None, None, :, None]
        return torch.where(later, scores, torch.zeros_like(scores))

    @property
    def all_head_labels(self) -> list[str]:
        """["L0H0", "L0H1", ...], layer-major, as TransformerLens labels heads."""
        return [f"L{l}H{h}" for l in range(self.cfg.n_layers) for h in range(self.cfg.n_heads)]

    def accumulated_bias(self, layer: int, mlp_input: bool = False, include_mlp_biases: bool = True) -> torch.Tensor:
        """[d_model]: the biases written to the stream before block `layer` (its attention's too with
        `mlp_input`): `b_O` and, with `include_mlp_biases`, `b_out`. Zero for Sprout, which has none."""
        total = self.embed.weight.new_zeros(self.cfg.d_model)
        for l, block in enumerate(self.blocks[:layer + 1]):
            if l < layer or mlp_input:
                total = total + block.attn.b_O
            if l < layer and include_mlp_biases and getattr(block, "mlp", None) is not None:
                total = total + block.mlp.b_out
        return total

    def tl_parameters(self) -> dict[str, torch.Tensor]:
        """TransformerLens' parameter dictionary (`embed.W_E`, `blocks.{l}.attn.W_Q`, `unembed.W_U`, ...),
        folded as above; what `SVDInterpreter` reads. Rotary models have no `pos_embed.W_pos`, as in
        TransformerLens; layers without an MLP get zero MLP weights, as TransformerLens gives them."""
        cfg = self.cfg
        params = {"embed.W_E": self.W_E}
        if getattr(self, "pos_embed", None) is not None:
            params["pos_embed.W_pos"] = self.W_pos
        for l, block in enumerate(self.blocks):
            for name in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O"):
                params[f"blocks.{l}.attn.{name}"] = getattr(block.attn, name)
            mlp_names = ("W_in", "W_gate", "W_out", "b_in", "b_out") if cfg.gated_mlp else ("W_in", "W_out", "b_in", "b_out")
            for name in mlp_names:
                params[f"blocks.{l}.mlp.{name}"] = self._mlp_param(block, name)
        params["unembed.W_U"] = self.W_U
        params["unembed.b_U"] = self.b_U
        return params

    def _mlp_param(self, block: nn.Module, name: str) -> torch.Tensor:
        mlp = getattr(block, "mlp", None)
        if mlp is not None:
            return getattr(mlp, name)
        d_model, d_mlp = self.cfg.d_model, self.cfg.d_mlp
        shape = {"W_in": (d_model, d_mlp), "W_gate": (d_model, d_mlp), "W_out": (d_mlp, d_model),
                 "b_in": (d_mlp,), "b_out": (d_model,)}[name]
        return self.embed.weight.new_zeros(shape)

    def tl_named_parameters(self) -> Iterator[tuple[str, torch.Tensor]]:
        """`tl_parameters()` as (name, tensor) pairs, like `named_parameters()`."""
        return iter(self.tl_parameters().items())
