"""The dictionaries a replacement model runs on: what attribution needs to know of them, in one place.

A graph reads each dictionary's features at one input hook per layer (`blocks.{l}.ln2.hook_normalized`)
and writes their decoder vectors into MLP outputs (`blocks.{l}.hook_mlp_out`). A per-layer transcoder
(`interp.Transcoder`) reads layer l and writes layer l only; a cross-layer transcoder reads layer l and
writes every layer l' >= l. Attribution, head loadings and interventions only call the methods of
`Dictionaries` below (input_hook, output_hook, d_sae, encoder, pre_acts, encode, writes, decoder, bias,
skip, modules, to, dtype, scan, n_layers), so a cross-layer set is a subclass overriding them (`writes(l)` returning
`range(l, n_layers)`, `decoder(l, l')` its [d_sae, d_model] block, `bias(l')` and `skip(l', x)` the output
layer's) and nothing else changes: `as_dictionaries` and `ReplacementModel` take any `Dictionaries` as it is.
"""
from __future__ import annotations

import copy
from typing import Literal, Mapping, Optional, Sequence, Union

import torch
from jaxtyping import Float

from sprout.names import layer_of

from .._core.model import HookedModel, model_name, n_layers, require_hooks
from ..saes import CrossLayerTranscoder, Transcoder, load_clt, load_transcoder

TranscoderInput = Union[None, Literal["clt"], Sequence[Transcoder], Mapping[int, Transcoder], CrossLayerTranscoder,
                        "Dictionaries"]


class Dictionaries:
    """One per-layer transcoder for every block of one model (the extension point for cross-layer sets).

    Args:
        transcoders: one `interp.Transcoder` per block, in block order (`transcoders[l]` reads block l's
            MLP input), or a mapping {layer: transcoder}.
        n_layers: the model's number of blocks; every one must have its transcoder.
        scan: a name for this set (circuit-tracer's `scan`, which its page shows); default
            "<model>-transcoders".
    """

    def __init__(self, transcoders: Union[Sequence[Transcoder], Mapping[int, Transcoder]], n_layers: int,
                 scan: Optional[str] = None) -> None:
        by_layer = _by_layer(transcoders)
        missing = [l for l in range(n_layers) if l not in by_layer]
        if missing:
            raise ValueError(f"the transcoder set is missing layer(s) {missing}: an attribution graph replaces every "
                             f"MLP, so give one transcoder for each of the model's {n_layers} blocks")
        extra = sorted(l for l in by_layer if not 0 <= l < n_layers)
        if extra:
            raise ValueError(f"transcoder(s) for layer(s) {extra}, but the model has blocks 0..{n_layers - 1}")
        self.transcoders = [by_layer[l] for l in range(n_layers)]
        self.n_layers = n_layers
        self.scan = scan

    # --- what attribution reads -------------------------------------------------------------------

    def input_hook(self, layer: int) -> str:
        """The hook point the features of `layer` read (`blocks.{l}.ln2.hook_normalized`)."""
        return str(self.transcoders[layer].hook_name)

    def output_hook(self, layer: int) -> str:
        """The hook point whose activation the dictionaries replace at `layer` (`blocks.{l}.hook_mlp_out`)."""
        return str(self.transcoders[layer].hook_name_out)

    def d_sae(self, layer: int) -> int:
        return int(self.transcoders[layer].d_sae)

    def encoder(self, layer: int) -> Float[torch.Tensor, "d_in d_sae"]:
        """The encoder of the features read at `layer`: pre-activations are x @ W + b_enc."""
        return self.transcoders[layer].W_enc

    def pre_acts(self, layer: int, x: Float[torch.Tensor, "*batch d_in"]) -> Float[torch.Tensor, "*batch d_sae"]:
        return self.transcoders[layer].pre_acts(x)

    def encode(self, layer: int, x: Float[torch.Tensor, "*batch d_in"]) -> Float[torch.Tensor, "*batch d_sae"]:
        return self.transcoders[layer].encode(x)

    def writes(self, layer: int) -> range:
        """The output layers the features read at `layer` write to: just `layer` for per-layer transcoders."""
        return range(layer, layer + 1)

    def decoder(self, source: int, out: int) -> Float[torch.Tensor, "d_sae d_out"]:
        """The decoder rows of the features read at `source` into the output of layer `out`."""
        if out != source:
            raise ValueError(f"a per-layer transcoder of layer {source} writes only to layer {source}, not {out}")
        return self.transcoders[source].W_dec

    def bias(self, out: int) -> Float[torch.Tensor, " d_out"]:
        """The constant part of the output at `out` (the decoder bias)."""
        return self.transcoders[out].b_dec

    def skip(self, out: int, x: Float[torch.Tensor, "*batch d_in"]) -> Optional[Float[torch.Tensor, "*batch d_out"]]:
        """The linear skip term of layer `out` from its input x (None without one)."""
        return self.transcoders[out].skip_term(x)

    def modules(self) -> list[torch.nn.Module]:
        """The modules holding the weights (the replacement model marks them constant while it runs)."""
        return list(self.transcoders)

    def to(self, dtype: torch.dtype) -> "Dictionaries":
        """A copy in `dtype` (the originals are left as they are)."""
        other = copy.copy(self)
        other.transcoders = [copy.deepcopy(t).to(dtype) for t in self.transcoders]
        return other

    @property
    def dtype(self) -> torch.dtype:
        return self.transcoders[0].W_enc.dtype


class CrossLayerDictionaries(Dictionaries):
    """A cross-layer transcoder as a replacement model's dictionaries: the features read at layer l write
    to every MLP output l' >= l (`interp.CrossLayerTranscoder`).

    Args:
        clt: the cross-layer transcoder (one for all blocks).
        n_layers: the model's number of blocks; the CLT must have as many.
        scan: a name for the set (default "<model>-clt").
    """

    def __init__(self, clt: CrossLayerTranscoder, n_layers: int, scan: Optional[str] = None) -> None:
        if clt.n_layers != n_layers:
            raise ValueError(f"the cross-layer transcoder has {clt.n_layers} layers, the model {n_layers} blocks: "
                             "an attribution graph replaces every MLP")
        self.clt, self.transcoders, self.n_layers = clt, [], n_layers
        self.scan = scan or f"sprout-{clt.model_fingerprint or 'unknown-model'}-clt"

    def input_hook(self, layer: int) -> str:
        return self.clt.hook_names[layer]

    def output_hook(self, layer: int) -> str:
        return self.clt.hook_names_out[layer]

    def d_sae(self, layer: int) -> int:
        return self.clt.d_sae

    def encoder(self, layer: int) -> Float[torch.Tensor, "d_in d_sae"]:
        return self.clt.W_enc[layer]

    def pre_acts(self, layer: int, x: Float[torch.Tensor, "*batch d_in"]) -> Float[torch.Tensor, "*batch d_sae"]:
        return self.clt.pre_acts(layer, x)

    def encode(self, layer: int, x: Float[torch.Tensor, "*batch d_in"]) -> Float[torch.Tensor, "*batch d_sae"]:
        return self.clt.encode(layer, x)

    def writes(self, layer: int) -> range:
        """Every output layer from `layer` on."""
        return self.clt.writes(layer)

    def decoder(self, source: int, out: int) -> Float[torch.Tensor, "d_sae d_out"]:
        return self.clt.decoder(source, out)

    def bias(self, out: int) -> Float[torch.Tensor, " d_out"]:
        return self.clt.b_dec[out]

    def skip(self, out: int, x: Float[torch.Tensor, "*batch d_in"]) -> Optional[Float[torch.Tensor, "*batch d_out"]]:
        return self.clt.skip_term(out, x)

    def modules(self) -> list[torch.nn.Module]:
        return [self.clt]

    def to(self, dtype: torch.dtype) -> "CrossLayerDictionaries":
        other = copy.copy(self)
        other.clt = copy.deepcopy(self.clt).to(dtype)
        return other

    @property
    def dtype(self) -> torch.dtype:
        return self.clt.W_enc.dtype


def _by_layer(transcoders: Union[Sequence[Transcoder], Mapping[int, Transcoder]]) -> dict[int, Transcoder]:
    items = list(transcoders.items()) if isinstance(transcoders, Mapping) else list(enumerate(transcoders))
    by_layer: dict[int, Transcoder] = {}
    for layer, tc in items:
        if not isinstance(tc, Transcoder):
            raise TypeError(f"transcoders[{layer}] is a {type(tc).__name__}; expected an interp.Transcoder "
                            "(interp.load_transcoder(model, layer) loads a shipped one)")
        read, written = layer_of(str(tc.hook_name)), layer_of(str(tc.hook_name_out))
        if read != layer or written != layer:
            raise ValueError(f"transcoders[{layer}] reads {tc.hook_name!r} and writes {tc.hook_name_out!r}: it is the "
                             f"transcoder of another layer, not of layer {layer}")
        by_layer[layer] = tc
    return by_layer


def as_dictionaries(model: HookedModel, transcoders: TranscoderInput) -> Dictionaries:
    """The checked dictionaries for `model`: None loads the demo's shipped transcoders (found by the
    weights' fingerprint), "clt" its shipped cross-layer transcoder (`interp.load_clt`); a list or mapping
    of transcoders is checked against the model (trained on it, its hooks and widths) and must cover every
    layer; a `CrossLayerTranscoder` is checked the same way."""
    if isinstance(transcoders, Dictionaries):
        if transcoders.n_layers != n_layers(model):
            raise ValueError(f"the dictionaries cover {transcoders.n_layers} layers, {model_name(model)} has "
                             f"{n_layers(model)}")
        return transcoders
    if isinstance(transcoders, str) and transcoders == "clt":
        transcoders = load_clt(model)
    if isinstance(transcoders, CrossLayerTranscoder):
        transcoders.check_model(model)
        clt = CrossLayerDictionaries(transcoders, n_layers(model))
        require_hooks(model, [clt.input_hook(l) for l in range(clt.n_layers)])
        return clt
    if transcoders is None:
        loaded = [load_transcoder(model, layer) for layer in range(n_layers(model))]
        return Dictionaries(loaded, n_layers(model), scan=_scan_name(loaded))
    if isinstance(transcoders, (str, bytes, torch.Tensor)) or not hasattr(transcoders, "__len__"):
        got = repr(transcoders) if isinstance(transcoders, str) else type(transcoders).__name__
        raise TypeError(f"transcoders must be None (the shipped ones), 'clt' (the shipped cross-layer one), a list of "
                        f"interp.Transcoder (one per layer) or a mapping {{layer: Transcoder}}, got {got}")
    dicts = Dictionaries(transcoders, n_layers(model))
    for layer, tc in enumerate(dicts.transcoders):
        tc.check_model(model, f"the transcoder for layer {layer}")
    require_hooks(model, [dicts.input_hook(l) for l in range(dicts.n_layers)])
    dicts.scan = _scan_name(dicts.transcoders)
    return dicts


def _scan_name(transcoders: Sequence[Transcoder]) -> str:
    fp = transcoders[0].model_fingerprint or "unknown-model"
    return f"sprout-{fp}-transcoders"
