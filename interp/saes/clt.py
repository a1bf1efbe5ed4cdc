"""Cross-layer transcoders: one dictionary replacing every MLP of a model at once (Anthropic's CLTs:
Ameisen et al. 2025, "Circuit Tracing", section 2.1; Lindsey et al. 2024, "Sparse Crosscoders").

The features read at block l (its MLP input `blocks.{l}.ln2.hook_normalized`, as the per-layer
transcoders read) write into the output of every MLP l' >= l (`blocks.{l'}.hook_mlp_out`):

    pre_l    = x_l @ W_enc[l] + b_enc[l]                              [..., d_sae]
    a_l      = pre_l * (pre_l > threshold[l]) * (pre_l > 0)           [..., d_sae]   (JumpReLU's rule)
    y_hat_l' = b_dec[l'] + sum_{l <= l'} a_l @ W_dec_l[:, l' - l]  (+ x_l' @ W_skip[l'].T)   [..., d_out]

A feature that an earlier layer computes and several later MLPs each rebuild is one feature here, not
one per MLP: that is why, at the same L0, a CLT's attribution graphs are shorter and lose less to errors
(the anchors: notes section 1.4). Decoders are stored compactly, per source layer, in circuit-tracer's
layout `W_dec_l [d_sae, n_layers - l, d_out]` (only the pairs l <= l'). Kinds: "batchtopk" (training:
the k x batch largest pre-activations over every layer's latents, so k is the L0 per token summed over
layers; at inference one learned threshold, repeated per latent) and "jumprelu" (a threshold per latent;
`to_jumprelu` gives the same outputs bit for bit, the kind circuit-tracer reads). Files: `clt_files`.
"""
from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace
from typing import Optional, Sequence, Union

import torch
import torch.nn as nn
from jaxtyping import Float

from .._core.identity import PathLike
from .._core.model import HookedModel, model_name
from . import clt_files
from .kinds import make_kind
from .sae import _check_dtype, check_fields, check_model, input_hook, output_hook
from .settings import SettingsError

CLT_KINDS = ("batchtopk", "jumprelu")

Layers = Union[Float[torch.Tensor, "layer *batch d"], Sequence[Float[torch.Tensor, "*batch d"]]]


class CrossLayerTranscoder(nn.Module):
    """Sparse features read at each block's MLP input, written to that MLP's output and every later one's.

    Args:
        n_layers: the model's blocks (each has encoders and a decoder bias).
        d_in: the MLP input's width (d_model); d_sae: latents per layer; d_out: the output's (d_in).
        kind: "batchtopk" or "jumprelu" (see the module docstring).
        k: BatchTopK's latents per token, summed over all layers (None: min(32, n_layers d_sae)); None for jumprelu.
        skip: a linear skip per output layer, `W_skip[l]` `[d_out, d_in]` (`x_l @ W_skip[l].T`), zero at the start.
        seed: the initialisation's seed (decoder rows random with unit norm over all their output layers).

    Attributes:
        W_enc [n_layers, d_in, d_sae], b_enc [n_layers, d_sae], W_dec (a list: W_dec[l] [d_sae, n_layers - l,
        d_out]), b_dec [n_layers, d_out], threshold [n_layers, d_sae], W_skip [n_layers, d_out, d_in] or None;
        hook_names / hook_names_out (per layer); model_fingerprint, model_config, info, as `interp.SAE`'s.

    Example:
        >>> import torch, interp
        >>> clt = interp.CrossLayerTranscoder(3, 16, 32, kind="jumprelu")
        >>> x = torch.randn(3, 5, 16)                       # [layer, pos, d_in]: every MLP's input
        >>> tuple(clt(x).shape), tuple(clt.decoder(0, 2).shape), list(clt.writes(1))
        ((3, 5, 16), (32, 16), [1, 2])
    """

    transcoder = True

    def __init__(self, n_layers: int, d_in: int, d_sae: int, d_out: Optional[int] = None, kind: str = "batchtopk",
                 k: Optional[int] = None, skip: bool = False, seed: int = 0, dtype: torch.dtype = torch.float32,
                 device: Optional[Union[str, torch.device]] = None) -> None:
        super().__init__()
        check_fields("CrossLayerTranscoder", d_in=d_in, d_sae=d_sae, d_out=d_out, seed=seed, skip=skip)
        if isinstance(n_layers, bool) or not isinstance(n_layers, int) or n_layers < 1:
            raise SettingsError(f"CrossLayerTranscoder argument n_layers must be an int >= 1, got {n_layers!r}")
        if kind not in CLT_KINDS:
            raise SettingsError(f"a CrossLayerTranscoder's kind must be one of {', '.join(CLT_KINDS)}, got {kind!r}")
        _check_dtype(dtype)
        self.n_layers, self.d_in, self.d_sae = n_layers, d_in, d_sae
        self.d_out = d_in if d_out is None else d_out
        self.kind, self.rule = kind, make_kind(kind, k, n_layers * d_sae)
        self.k: Optional[int] = getattr(self.rule, "k", None)
        L, g = n_layers, torch.Generator().manual_seed(int(seed))
        decs = [torch.randn(d_sae, L - l, self.d_out, generator=g, dtype=torch.float64) for l in range(L)]
        decs = [w / w.flatten(1).norm(dim=-1)[:, None, None] for w in decs]
        w_enc = torch.randn(L, d_in, d_sae, generator=g, dtype=torch.float64) / d_in ** 0.5
        self.W_enc = nn.Parameter(w_enc.to(dtype=dtype, device=device))
        self.b_enc = nn.Parameter(torch.zeros(L, d_sae, dtype=dtype, device=device))
        self.W_dec = nn.ParameterList([nn.Parameter(w.to(dtype=dtype, device=device)) for w in decs])
        self.b_dec = nn.Parameter(torch.zeros(L, self.d_out, dtype=dtype, device=device))
        self.register_buffer("threshold", torch.zeros(L, d_sae, dtype=dtype, device=device))
        self.W_skip = nn.Parameter(torch.zeros(L, self.d_out, d_in, dtype=dtype, device=device)) if skip else None
        self.hook_names = [input_hook(l) for l in range(L)]
        self.hook_names_out = [output_hook(l) for l in range(L)]
        self.model_fingerprint: Optional[str] = None
        self.model_config: Optional[dict] = None
        self.info: dict = {}

    threshold: torch.Tensor

    @property
    def skip(self) -> bool:
        return self.W_skip is not None

    # --- one layer at a time (what attribution reads) -----------------------------------------------

    def _x(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"expected layer {layer}'s MLP input as a torch.Tensor [..., {self.d_in}], got {type(x).__name__}")
        if x.dim() == 0 or x.shape[-1] != self.d_in:
            raise ValueError(f"this cross-layer transcoder reads {self.d_in}-wide activations at {self.hook_names[layer]!r};"
                             f" got shape {list(x.shape)}")
        return x.to(self.W_enc.dtype)

    def _layer(self, layer: int) -> int:
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < self.n_layers:
            raise ValueError(f"layer must be a block 0..{self.n_layers - 1} of this cross-layer transcoder, got {layer!r}")
        return layer

    def pre_acts(self, layer: int, x: Float[torch.Tensor, "*batch d_in"]) -> Float[torch.Tensor, "*batch d_sae"]:
        """x @ W_enc[layer] + b_enc[layer]: the pre-activations of the features read at `layer`."""
        layer = self._layer(layer)
        return self._x(layer, x) @ self.W_enc[layer] + self.b_enc[layer]

    def encode(self, layer: int, x: Float[torch.Tensor, "*batch d_in"]) -> Float[torch.Tensor, "*batch d_sae"]:
        """The activations [..., d_sae] of the features read at `layer` (the inference rule: a threshold)."""
        return self.rule.encode(self.pre_acts(layer, x), SimpleNamespace(threshold=self.threshold[layer]))

    def writes(self, layer: int) -> range:
        """The output layers the features read at `layer` write to: layer..n_layers-1."""
        return range(self._layer(layer), self.n_layers)

    def decoder(self, source: int, out: int) -> Float[torch.Tensor, "d_sae d_out"]:
        """The decoder [d_sae, d_out] of the features read at `source` into MLP `out`'s output (source <= out)."""
        if out not in self.writes(source):
            raise ValueError(f"the features read at layer {source} write to layers {source}..{self.n_layers - 1}, "
                             f"not to {out}")
        return self.W_dec[source][:, out - source]

    def skip_term(self, out: int, x: Float[torch.Tensor, "*batch d_in"]) -> Optional[Float[torch.Tensor, "*batch d_out"]]:
        """x @ W_skip[out].T [..., d_out] from MLP `out`'s input, or None without a skip."""
        return None if self.W_skip is None else self._x(out, x) @ self.W_skip[self._layer(out)].T

    # --- every layer at once ------------------------------------------------------------------------

    def _all(self, xs: Layers, what: str) -> list[torch.Tensor]:
        if isinstance(xs, torch.Tensor) and xs.dim() >= 2 and xs.shape[0] == self.n_layers:
            return list(xs.unbind(0))
        if not isinstance(xs, torch.Tensor) and isinstance(xs, Sequence) and len(xs) == self.n_layers:
            return list(xs)
        got = list(xs.shape) if isinstance(xs, torch.Tensor) else f"{type(xs).__name__} of {len(xs) if hasattr(xs, '__len__') else '?'}"
        raise ValueError(f"{what} are one tensor per layer: [n_layers={self.n_layers}, ..., d] or a list of "
                         f"{self.n_layers} tensors; got {got}")

    def encode_all(self, xs: Layers) -> list[torch.Tensor]:
        """Every layer's feature activations, from every MLP's input ([n_layers, ..., d_in] or a list)."""
        return [self.encode(l, x) for l, x in enumerate(self._all(xs, "the MLP inputs"))]

    def decode_layer(self, out: int, acts: Sequence[torch.Tensor]) -> Float[torch.Tensor, "*batch d_out"]:
        """MLP `out`'s reconstruction without the skip: `b_dec[out] + sum over l <= out of acts[l] @ W_dec[l][:, out - l]`
        (`acts[l]` [..., d_sae] for every l <= out)."""
        total = self.b_dec[out] + acts[0].to(self.W_enc.dtype) @ self.decoder(0, out)
        for source in range(1, out + 1):
            total = total + acts[source].to(self.W_enc.dtype) @ self.decoder(source, out)
        return total

    def decode(self, acts: Layers) -> Float[torch.Tensor, "layer *batch d_out"]:
        """`b_dec[l'] + sum over l <= l' of acts[l] @ W_dec[l][:, l' - l]`, for every output layer l' (no skip)."""
        acts = self._all(acts, "the activations")
        outs = [self.decode_layer(o, acts) for o in range(self.n_layers)]
        return torch.stack(outs)

    def forward(self, xs: Layers) -> Float[torch.Tensor, "layer *batch d_out"]:
        """The reconstruction of every MLP's output [n_layers, ..., d_out] from every MLP's input."""
        xs = self._all(xs, "the MLP inputs")
        out = self.decode(self.encode_all(xs))
        if self.W_skip is None:
            return out
        return out + torch.stack([self._x(l, x) @ self.W_skip[l].T for l, x in enumerate(xs)])

    # --- training's upkeep --------------------------------------------------------------------------

    @torch.no_grad()
    def decoder_norms(self) -> Float[torch.Tensor, "layer d_sae"]:
        """Each feature's decoder norm over all the layers it writes to."""
        return torch.stack([w.flatten(1).norm(dim=-1) for w in self.W_dec])

    @torch.no_grad()
    def normalize_decoder_(self) -> None:
        """Each feature's whole decoder (all its output layers together) back to unit norm."""
        for w in self.W_dec:
            w.div_(w.flatten(1).norm(dim=-1).clamp_min(1e-12)[:, None, None])

    @torch.no_grad()
    def project_decoder_grad_(self) -> None:
        """Remove from each feature's decoder gradient the part along its (whole) decoder."""
        for w in self.W_dec:
            if w.grad is not None:
                flat_w, flat_g = w.flatten(1), w.grad.flatten(1)
                w.grad.sub_(((flat_g * flat_w).sum(-1))[:, None, None] * w)

    @torch.no_grad()
    def fold_scales_(self, scale_in: Sequence[float], scale_out: Sequence[float]) -> None:
        """Turn a CLT trained on (scale_in[l] x_l, scale_out[l] y_l) into one for (x_l, y_l) with the same
        activations: the input scales go into the encoders, the output scales into the decoders and b_dec."""
        s_in = torch.tensor(list(scale_in), dtype=self.W_enc.dtype, device=self.W_enc.device)
        s_out = torch.tensor(list(scale_out), dtype=self.W_enc.dtype, device=self.W_enc.device)
        self.W_enc.mul_(s_in[:, None, None])
        for l, w in enumerate(self.W_dec):
            w.div_(s_out[l:][None, :, None])
        self.b_dec.div_(s_out[:, None])
        if self.W_skip is not None:
            self.W_skip.mul_((s_in / s_out)[:, None, None])

    def to_jumprelu(self) -> "CrossLayerTranscoder":
        """The same CLT as kind "jumprelu" (BatchTopK's one threshold per latent): equal outputs bit for bit."""
        if self.kind == "jumprelu":
            return self
        out = copy.deepcopy(self)
        out.kind, out.rule, out.k = "jumprelu", make_kind("jumprelu", None, self.n_layers * self.d_sae), None
        out.info = {**copy.deepcopy(self.info), "converted_from": self.kind}
        return out

    # --- the model it belongs to, files ---------------------------------------------------------------

    def check_model(self, model: HookedModel, source: str = "this cross-layer transcoder") -> None:
        """Refuse a model with another number of blocks, another fingerprint or config, or other hooks and widths."""
        if int(model.cfg.n_layers) != self.n_layers:
            raise ValueError(f"{source} has {self.n_layers} layers, {model_name(model)} has {int(model.cfg.n_layers)} "
                             "blocks: it replaces every MLP of a model of its own depth")
        for l in range(self.n_layers):
            view = SimpleNamespace(model_config=self.model_config, model_fingerprint=self.model_fingerprint,
                                   hook_name=self.hook_names[l], hook_name_out=self.hook_names_out[l], d_in=self.d_in,
                                   d_out=self.d_out)
            check_model(view, model, f"{source} (layer {l})")  # type: ignore[arg-type]

    def extra_repr(self) -> str:
        k = f", k={self.k}" if self.k is not None else ""
        return f"kind={self.kind!r}, n_layers={self.n_layers}, d_in={self.d_in}, d_sae={self.d_sae}{k}, skip={self.skip}"

    def save(self, folder: PathLike) -> Path:
        """Write cfg.json + sae_weights.safetensors into `folder` (see `clt_files`)."""
        return clt_files.save(self, folder)

    @classmethod
    def load(cls, folder: PathLike, model: Optional[HookedModel] = None) -> "CrossLayerTranscoder":
        """A cross-layer transcoder saved by `save`, checked against `model` if given."""
        return clt_files.load(folder, model, cls)
