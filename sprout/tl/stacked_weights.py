"""The model-level TransformerLens weights: `W_Q` ... `W_U` stacked over blocks, `QK`/`OV` as
FactoredMatrix, composition scores, `tl_parameters` (what `SVDInterpreter` reads).

Each property stacks the per-module ones of `sprout/tl/weights.py` (norm gains folded in, as TransformerLens'
`fold_ln`), so the model and `blocks[l].attn.W_Q` always agree.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional

import torch
import torch.nn as nn
from transformer_lens.FactoredMatrix import FactoredMatrix
from transformer_lens.utilities.matrix import composition_scores

from ..names import block, head_label

if TYPE_CHECKING:
    from ..config import SproutTransformerLensConfig
    from .weights import Embed

_ROTARY = ("there is no learned position embedding (positional_embedding_type='rotary': RoPE rotates each "
           "head's queries and keys, so positions show in blocks.{l}.attn.hook_rot_q / hook_rot_k; see the README, "
           "'Where Sprout differs from TransformerLens')")


class TLWeights:
    """The model-level weights, stacked over blocks, as TransformerLens' HookedTransformer has them.

    Needs `blocks[l].attn` and (with an MLP) `blocks[l].mlp` answering the per-module properties,
    `embed` (an `Embed`), `unembed` answering `W_U`/`b_U`, and `cfg`.
    """

    if TYPE_CHECKING:  # what the model mixing this in provides
        blocks: nn.ModuleList
        embed: Embed
        unembed: Any  # UnembedHooks or walkthrough.Unembed, both answering W_U/b_U
        cfg: SproutTransformerLensConfig
        __call__: Callable[..., Any]

    def _stack(self, module: str, name: str) -> torch.Tensor:
        parts = []
        for l, blk in enumerate(self.blocks):
            owner = getattr(blk, module, None)
            if owner is None:
                raise AttributeError(f"block {l} has no {module} (this model's layers have none), so there "
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
            raise AttributeError(f"W_pos: {_ROTARY}")
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

    def effective_embedding(self, chunk: int = 4096) -> torch.Tensor:
        """[d_vocab, d_model]: the stream leaving block 0 when each token is the whole input, i.e. `W_E`
        plus what block 0's attention (which can only attend to the token itself) and MLP write: the
        "extended embedding" of TransformerLens' and the curriculum's circuit analyses. Read OV and QK
        circuits of later heads from it (`effective_embedding() @ OV[l, h]`) rather than from `W_E`:
        token identity often reaches a head through block 0, so W_E-based circuits can mislead. A model
        with learned positions adds W_pos[0] (the token at position 0); RoPE adds nothing at position 0.
        Runs block 0 (its hooks fire) on `chunk` tokens at a time."""
        rows = self.W_E
        if getattr(self, "pos_embed", None) is not None:
            rows = rows + self.W_pos[0]
        return torch.cat([self(part[:, None], start_at_layer=0, stop_at_layer=1, return_type="logits")[:, 0]
                          for part in rows.split(chunk)])

    @property
    def all_head_labels(self) -> list[str]:
        """["L0H0", "L0H1", ...], layer-major, as TransformerLens labels heads."""
        return [head_label(l, h) for l in range(self.cfg.n_layers) for h in range(self.cfg.n_heads)]

    def accumulated_bias(self, layer: int, mlp_input: bool = False, include_mlp_biases: bool = True) -> torch.Tensor:
        """[d_model]: the biases written to the stream before block `layer` (its attention's too with
        `mlp_input`): `b_O` and, with `include_mlp_biases`, `b_out`. Zero for Sprout, which has none."""
        total = self.embed.weight.new_zeros(self.cfg.d_model)
        blk: Any  # a block: its attn (and mlp) answer b_O (b_out)
        for l, blk in enumerate(self.blocks[:layer + 1]):
            if l < layer or mlp_input:
                total = total + blk.attn.b_O
            if l < layer and include_mlp_biases and getattr(blk, "mlp", None) is not None:
                total = total + blk.mlp.b_out
        return total

    def tl_parameters(self) -> dict[str, torch.Tensor]:
        """TransformerLens' parameter dictionary (`embed.W_E`, `blocks.{l}.attn.W_Q`, `unembed.W_U`, ...),
        folded as above; what `SVDInterpreter` reads. Rotary models have no `pos_embed.W_pos`, as in
        TransformerLens; layers without an MLP get zero MLP weights, as TransformerLens gives them."""
        cfg = self.cfg
        params = {"embed.W_E": self.W_E}
        if getattr(self, "pos_embed", None) is not None:
            params["pos_embed.W_pos"] = self.W_pos
        for l, blk in enumerate(self.blocks):
            for name in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O"):
                params[block(l) + "attn." + name] = getattr(blk.attn, name)
            mlp_names = ("W_in", "W_gate", "W_out", "b_in", "b_out") if cfg.gated_mlp else ("W_in", "W_out", "b_in", "b_out")
            for name in mlp_names:
                params[block(l) + "mlp." + name] = self._mlp_param(blk, name)
        params["unembed.W_U"] = self.W_U
        params["unembed.b_U"] = self.b_U
        return params

    def _mlp_param(self, blk: nn.Module, name: str) -> torch.Tensor:
        mlp = getattr(blk, "mlp", None)
        if mlp is not None:
            return getattr(mlp, name)
        d_model, d_mlp = self.cfg.d_model, self.cfg.d_mlp
        assert d_mlp is not None  # both models' transformer_lens_config() set it
        shape = {"W_in": (d_model, d_mlp), "W_gate": (d_model, d_mlp), "W_out": (d_mlp, d_model),
                 "b_in": (d_mlp,), "b_out": (d_model,)}[name]
        return self.embed.weight.new_zeros(shape)

    def tl_named_parameters(self) -> Iterator[tuple[str, torch.Tensor]]:
        """`tl_parameters()` as (name, tensor) pairs, like `named_parameters()`."""
        return iter(self.tl_parameters().items())
