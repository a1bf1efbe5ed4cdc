"""The model-level TransformerLens weights: the per-module ones of `sprout/tl/weights.py` stacked over
blocks (`W_Q` ... `W_out`), `QK`/`OV` as FactoredMatrix, `tl_parameters` (what
`SVDInterpreter` reads). A model holds a `StackedWeights` as `model.weights`, and `HookedLM` declares
each name on the model (`W_Q = stacked(...)`), so the model and `blocks[l].attn.W_Q` always agree.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Protocol, TypeVar

import torch
import torch.nn as nn
from transformer_lens.FactoredMatrix import FactoredMatrix

from ..names import block, head_label
from .surface import ReadOnly

if TYPE_CHECKING:
    from ..config import SproutTransformerLensConfig
    from .weights import Embed

T = TypeVar("T")

_ROTARY = ("there is no learned position embedding (positional_embedding_type='rotary': RoPE rotates each "
           "head's queries and keys, so positions show in blocks.{l}.attn.hook_rot_q / hook_rot_k; see docs/reference/differences.md "
           "(where Sprout differs from TransformerLens)")


class Layered(Protocol):
    """What `StackedWeights` reads of its model: blocks whose `attn` (and `mlp`) answer the per-module
    weights, `embed` (an `Embed`), `unembed` answering `W_U`/`b_U`, `cfg`, the forward (and, when the model
    has learned positions, `pos_embed`, looked up by name: Sprout has none)."""

    @property
    def cfg(self) -> SproutTransformerLensConfig: ...
    @property
    def blocks(self) -> nn.ModuleList: ...
    @property
    def embed(self) -> Embed: ...
    @property
    def unembed(self) -> Any: ...  # UnembedHooks or walkthrough.Unembed, both answering W_U/b_U
    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...


def stacked(get: Callable[[StackedWeights], T], doc: str) -> ReadOnly[T]:
    """A read-only model attribute: `get(model.weights)`, with the docstring TransformerLens users read."""
    return ReadOnly(lambda model: get(model.weights), doc)


class StackedWeights:
    """The model-level weights of one model, stacked over its blocks as TransformerLens' HookedTransformer
    has them; nothing is stored, every read computes from the modules' parameters. A plain object, not a
    module: it adds no state-dict key and no second path to the model's hooks."""

    def __init__(self, model: Layered) -> None:
        self.model = model

    def stack(self, module: str, name: str) -> torch.Tensor:
        """blocks[l].<module>.<name> for every l, stacked on a new first axis."""
        parts = []
        for l, blk in enumerate(self.model.blocks):
            owner = getattr(blk, module, None)
            if owner is None:
                raise AttributeError(f"block {l} has no {module} (this model's layers have none), so there "
                                     f"is no {name}")
            parts.append(getattr(owner, name))
        return torch.stack(parts)

    @property
    def pos_embed(self) -> Optional[Any]:
        return getattr(self.model, "pos_embed", None)

    @property
    def W_E(self) -> torch.Tensor:
        return self.model.embed.W_E

    @property
    def W_pos(self) -> torch.Tensor:
        if self.pos_embed is None:
            raise AttributeError(f"W_pos: {_ROTARY}")
        return self.pos_embed.W_pos

    @property
    def W_E_pos(self) -> torch.Tensor:
        return torch.cat([self.W_E, self.W_pos])

    @property
    def W_U(self) -> torch.Tensor:
        return self.model.unembed.W_U

    @property
    def b_U(self) -> torch.Tensor:
        return self.model.unembed.b_U

    @property
    def W_gate(self) -> Optional[torch.Tensor]:
        return self.stack("mlp", "W_gate") if self.model.cfg.gated_mlp else None

    @property
    def QK(self) -> FactoredMatrix:
        return FactoredMatrix(self.stack("attn", "W_Q"), self.stack("attn", "W_K").transpose(-2, -1))

    @property
    def OV(self) -> FactoredMatrix:
        return FactoredMatrix(self.stack("attn", "W_V"), self.stack("attn", "W_O"))

    def effective_embedding(self, chunk: int = 4096) -> torch.Tensor:
        """[d_vocab, d_model]: the stream leaving block 0 when each token is the whole input, i.e. `W_E`
        plus what block 0's attention (which can only attend to the token itself) and MLP write: the
        "extended embedding" of TransformerLens' and the curriculum's circuit analyses. Read OV and QK
        circuits of later heads from it (`effective_embedding() @ OV[l, h]`) rather than from `W_E`:
        token identity often reaches a head through block 0, so W_E-based circuits can mislead. A model
        with learned positions adds W_pos[0] (the token at position 0); RoPE adds nothing at position 0.
        Runs block 0 (its hooks fire) on `chunk` tokens at a time."""
        rows = self.W_E
        if self.pos_embed is not None:
            rows = rows + self.W_pos[0]
        return torch.cat([self.model(part[:, None], start_at_layer=0, stop_at_layer=1, return_type="logits")[:, 0]
                          for part in rows.split(chunk)])

    @property
    def all_head_labels(self) -> list[str]:
        cfg = self.model.cfg
        return [head_label(l, h) for l in range(cfg.n_layers) for h in range(cfg.n_heads)]

    def accumulated_bias(self, layer: int, mlp_input: bool = False, include_mlp_biases: bool = True) -> torch.Tensor:
        """[d_model]: the biases written to the stream before block `layer` (its attention's too with
        `mlp_input`): `b_O` and, with `include_mlp_biases`, `b_out`. Zero for Sprout, which has none."""
        total = self.model.embed.weight.new_zeros(self.model.cfg.d_model)
        blk: Any  # a block: its attn (and mlp) answer b_O (b_out)
        for l, blk in enumerate(self.model.blocks[:layer + 1]):
            if l < layer or mlp_input:
                total = total + blk.attn.b_O
            if l < layer and include_mlp_biases and getattr(blk, "mlp", None) is not None:
                total = total + blk.mlp.b_out
        return total

    def tl_parameters(self) -> dict[str, torch.Tensor]:
        """TransformerLens' parameter dictionary (`embed.W_E`, `blocks.{l}.attn.W_Q`, `unembed.W_U`, ...),
        folded as the weight properties are; what `SVDInterpreter` reads. Rotary models have no
        `pos_embed.W_pos`, as in TransformerLens; layers without an MLP get zero MLP weights, as
        TransformerLens gives them."""
        model = self.model
        params = {"embed.W_E": self.W_E}
        if self.pos_embed is not None:
            params["pos_embed.W_pos"] = self.W_pos
        mlp_names = ("W_in", "W_gate", "W_out", "b_in", "b_out") if model.cfg.gated_mlp else ("W_in", "W_out", "b_in", "b_out")
        for l, blk in enumerate(model.blocks):
            for name in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O"):
                params[block(l) + "attn." + name] = getattr(blk.attn, name)
            for name in mlp_names:
                params[block(l) + "mlp." + name] = self._mlp_param(blk, name)
        params["unembed.W_U"] = self.W_U
        params["unembed.b_U"] = self.b_U
        return params

    def _mlp_param(self, blk: nn.Module, name: str) -> torch.Tensor:
        mlp = getattr(blk, "mlp", None)
        if mlp is not None:
            return getattr(mlp, name)
        d_model, d_mlp = self.model.cfg.d_model, self.model.cfg.d_mlp
        assert d_mlp is not None  # both models' transformer_lens_config() set it
        shape = {"W_in": (d_model, d_mlp), "W_gate": (d_model, d_mlp), "W_out": (d_mlp, d_model),
                 "b_in": (d_mlp,), "b_out": (d_model,)}[name]
        return self.model.embed.weight.new_zeros(shape)

    def tl_named_parameters(self) -> Iterator[tuple[str, torch.Tensor]]:
        """`tl_parameters()` as (name, tensor) pairs, like `named_parameters()`."""
        return iter(self.tl_parameters().items())
