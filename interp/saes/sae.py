"""Sparse autoencoders and transcoders: one dictionary class, its kind's sparsity rule beside it.

An SAE reads an activation x [..., d_in] at one hook point and writes it as a sparse sum of learned
directions (the rows of W_dec):

    pre    = (x - b_dec) @ W_enc + b_enc          [..., d_sae]   (b_dec subtracted: apply_b_dec_to_input)
    acts   = kind.encode(pre)                      [..., d_sae]   (ReLU, TopK, JumpReLU ...: `kinds`)
    x_hat  = acts @ W_dec + b_dec                  [..., d_in]

Parameters carry SAELens' names and shapes, so the files are SAELens' (`files`). Decoder rows are kept at
unit norm for every kind (the L1 and L0 penalties and AuxK need it; for TopK it makes latents comparable).
A transcoder (Dunefsky et al. 2024, "Transcoders Find Interpretable LLM Feature Circuits") is the same
dictionary whose decoder writes to another place: it reads an MLP's input and predicts the MLP's output.
Training is in `train`.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional, Sequence, Union, cast

import torch
import torch.nn as nn
from jaxtyping import Float

from sprout.names import act_name
from sprout.settings import range_error, type_error

from .._core.identity import PathLike, check_once, fingerprint, model_config
from .._core.model import HookedModel, model_name, require_hooks
from . import files
from .files import hook_layer
from .kinds import KIND_NAMES, THRESHOLD_KINDS, TOPK_KINDS, make_kind
from .settings import SettingsError

if TYPE_CHECKING:
    from .kinds.jumprelu import JumpReLU
    from .kinds.matryoshka import Matryoshka



# each constructor argument's type and range, as `sprout.settings.Checked` states them
_FIELDS = {"d_in": ("int", (1, None, "[")), "d_sae": ("int", (1, None, "[")), "d_out": ("Optional[int]", (1, None, "[")),
           "bandwidth": ("float", (0, None, "(")), "seed": ("int", (0, 2 ** 63 - 1, "[]")),
           "skip": ("bool", None), "layer": ("Optional[int]", (0, None, "[")),
           "hook_name": ("Optional[str]", None), "hook_name_out": ("Optional[str]", None)}


def check_fields(what: str, **values: object) -> None:
    """Refuse a constructor argument of the wrong type or out of range (a bool is not a number, 1.7 not a
    seed, NaN not a bandwidth), naming the argument, before anything is allocated."""
    for name, value in values.items():
        kind, rule = _FIELDS[name]
        expected = type_error(kind, value) or range_error(rule, value)
        if expected is None and isinstance(value, str) and not value:
            expected = "a hook name (a non-empty string)"
        if expected:
            raise SettingsError(f"{what} argument {name} must be {expected}, got {value!r}")


def _check_dtype(dtype: object) -> torch.dtype:
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise SettingsError(f"dtype must be a floating torch dtype such as torch.float32, got {dtype!r}")
    return dtype


class SAE(nn.Module):
    """A sparse dictionary of one kind for the activations at one hook point.

    Args:
        d_in: the activation's width (d_model for the residual stream).
        d_sae: the number of latents.
        kind: "relu", "topk", "batchtopk", "jumprelu" or "matryoshka" (see `interp.saes.kinds` for the
            papers: Bricken et al. 2023 / Conerly et al. 2024; Gao et al. 2024; Bussmann et al. 2024;
            Rajamanoharan et al. 2024; Bussmann, Nabeshima et al. 2025).
        k: latents per row, for the TopK kinds (an int in 1..d_sae; None: min(32, d_sae)); None for the others.
        hook_name: the hook point it reads, e.g. "blocks.2.hook_resid_post" (None: not yet known).
        widths: Matryoshka's nested prefix sizes, increasing to d_sae (default d_sae/4, d_sae/2, d_sae).
        bandwidth: JumpReLU's kernel width for the straight-through estimator.
        seed: the initialisation's seed (decoder rows random unit vectors, W_enc = W_dec^T, biases 0).

    Attributes:
        W_enc [d_in, d_sae], b_enc [d_sae], W_dec [d_sae, d_in], b_dec [d_in]; threshold [d_sae]
        (JumpReLU's learned thresholds; BatchTopK's and Matryoshka's one inference threshold, repeated;
        None for the other kinds); k; hook_name; kind (the name); model_fingerprint / model_config (the
        model it was trained on, None if not known); info (what training recorded).

    Example:
        >>> import torch, interp
        >>> sae = interp.SAE(16, 64, kind="topk", k=4, hook_name="blocks.0.hook_resid_post")
        >>> acts = sae.encode(torch.randn(3, 16))
        >>> tuple(acts.shape), int((acts != 0).sum(-1).max()), tuple(sae(torch.randn(3, 16)).shape)
        ((3, 64), 4, (3, 16))
    """

    apply_b_dec_to_input = True
    transcoder = False  # a Transcoder's is True
    tied_init = True  # W_enc starts as W_dec^T (Gao et al.; Conerly et al.), where both live in one space

    def __init__(self, d_in: int, d_sae: int, kind: str = "topk", k: Optional[int] = None,
                 hook_name: Optional[str] = None, widths: Optional[Sequence[int]] = None, bandwidth: float = 0.05,
                 seed: int = 0, dtype: torch.dtype = torch.float32, device: Optional[Union[str, torch.device]] = None,
                 d_out: Optional[int] = None) -> None:
        super().__init__()
        check_fields(type(self).__name__, d_in=d_in, d_sae=d_sae, d_out=d_out, bandwidth=bandwidth, seed=seed,
                     hook_name=hook_name)
        _check_dtype(dtype)
        self.d_in, self.d_sae = d_in, d_sae
        self.d_out = self.d_in if d_out is None else d_out
        if not isinstance(kind, str):
            raise TypeError(f"kind must be one of {', '.join(KIND_NAMES)}, got {kind!r}")
        self.rule = make_kind(kind, k, self.d_sae, widths, bandwidth)
        self.kind, self.k = kind, (getattr(self.rule, "k") if kind in TOPK_KINDS else None)
        self.hook_name = hook_name
        g = torch.Generator().manual_seed(int(seed))
        w_dec = torch.randn(self.d_sae, self.d_out, generator=g, dtype=torch.float64)
        w_dec /= w_dec.norm(dim=-1, keepdim=True)
        w_enc = w_dec.T.contiguous() if self.tied_init else torch.randn(self.d_in, self.d_sae, generator=g,
                                                                             dtype=torch.float64) / self.d_in ** 0.5
        self.W_enc = nn.Parameter(w_enc.to(dtype=dtype, device=device))
        self.b_enc = nn.Parameter(torch.zeros(self.d_sae, dtype=dtype, device=device))
        self.W_dec = nn.Parameter(w_dec.to(dtype=dtype, device=device))
        self.b_dec = nn.Parameter(torch.zeros(self.d_out, dtype=dtype, device=device))
        if kind == "jumprelu":
            self.threshold: Optional[torch.Tensor] = nn.Parameter(torch.full((self.d_sae,), 0.01, dtype=dtype, device=device))
        elif kind in THRESHOLD_KINDS:
            self.register_buffer("threshold", torch.zeros(self.d_sae, dtype=dtype, device=device))
        else:
            self.threshold = None
        self.model_fingerprint: Optional[str] = None
        self.model_config: Optional[dict] = None
        self.info: dict = {}

    @property
    def widths(self) -> Optional[list[int]]:
        return list(cast("Matryoshka", self.rule).widths) if self.kind == "matryoshka" else None

    @property
    def bandwidth(self) -> Optional[float]:
        return cast("JumpReLU", self.rule).bandwidth if self.kind == "jumprelu" else None

    def _check_input(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"expected activations as a torch.Tensor [..., {self.d_in}], got {type(x).__name__}")
        if x.dim() == 0 or x.shape[-1] != self.d_in:
            where = f" (hook {self.hook_name})" if self.hook_name else ""
            raise ValueError(f"this SAE reads activations of width d_in={self.d_in}{where}; got shape {list(x.shape)}")
        return x.to(self.W_enc.dtype)

    def pre_acts(self, x: Float[torch.Tensor, "*batch d_in"]) -> Float[torch.Tensor, "*batch d_sae"]:
        """The pre-activations (x - b_dec) @ W_enc + b_enc (b_dec only where it is applied to the input)."""
        x = self._check_input(x)
        if self.apply_b_dec_to_input:
            x = x - self.b_dec
        return x @ self.W_enc + self.b_enc

    def encode(self, x: Float[torch.Tensor, "*batch d_in"]) -> Float[torch.Tensor, "*batch d_sae"]:
        """The latents of activations x [..., d_in]: [..., d_sae], sparse (the kind's inference rule)."""
        return self.rule.encode(self.pre_acts(x), self)

    def decode(self, acts: Float[torch.Tensor, "*batch d_sae"]) -> Float[torch.Tensor, "*batch d_out"]:
        """The reconstruction acts @ W_dec + b_dec of latents [..., d_sae]."""
        if not isinstance(acts, torch.Tensor) or acts.dim() == 0 or acts.shape[-1] != self.d_sae:
            raise ValueError(f"decode takes latents [..., d_sae={self.d_sae}], got "
                             f"{list(acts.shape) if isinstance(acts, torch.Tensor) else type(acts).__name__}")
        return acts.to(self.W_dec.dtype) @ self.W_dec + self.b_dec

    def forward(self, x: Float[torch.Tensor, "*batch d_in"]) -> Float[torch.Tensor, "*batch d_out"]:
        """decode(encode(x)): the reconstruction of x [..., d_in]."""
        return self.decode(self.encode(x))

    @torch.no_grad()
    def normalize_decoder_(self) -> None:
        """Decoder rows back to unit norm (after an optimizer step)."""
        self.W_dec.div_(self.W_dec.norm(dim=-1, keepdim=True).clamp_min(1e-12))

    @torch.no_grad()
    def project_decoder_grad_(self) -> None:
        """Remove from W_dec's gradient the part along each row, which would only change the row's norm
        (Bricken et al. 2023; sparsify)."""
        if self.W_dec.grad is None:
            return
        w, g = self.W_dec, self.W_dec.grad
        g.sub_((g * w).sum(-1, keepdim=True) * w)

    @torch.no_grad()
    def fold_scale_(self, scale_in: float, scale_out: float) -> None:
        """Turn a dictionary trained on (scale_in x, scale_out y) into one for (x, y), same latents up to
        the factor 1 / scale_out (decoder rows keep unit norm, TopK's choice is unchanged)."""
        self.W_enc.mul_(scale_in / scale_out)
        self.b_enc.div_(scale_out)
        self.b_dec.div_(scale_out)
        if self.threshold is not None:
            self.threshold.div_(scale_out)
        w_skip = getattr(self, "W_skip", None)  # a Transcoder's
        if w_skip is not None:
            w_skip.mul_(scale_in / scale_out)

    def check_model(self, model: HookedModel, source: str = "this SAE") -> None:
        """Raise a ValueError if `model` is not the one this dictionary was trained on (its fingerprint and
        config), lacks its hook point(s), or writes another width there."""
        check_model(self, model, source)

    def extra_repr(self) -> str:
        k = f", k={self.k}" if self.k is not None else ""
        return f"kind={self.kind!r}, d_in={self.d_in}, d_sae={self.d_sae}{k}, hook_name={self.hook_name!r}"

    def save(self, folder: PathLike) -> Path:
        """Write SAELens' layout (cfg.json + sae_weights.safetensors) into `folder`, atomically; see `files`."""
        return files.save(self, folder)

    @classmethod
    def load(cls, folder: PathLike, model: Optional[HookedModel] = None) -> SAE:
        """An SAE (or transcoder) saved by us or by SAELens at `folder`, checked against `model` if given."""
        return files.load(folder, model, expect=cls, classes=(SAE, Transcoder))


class Transcoder(SAE):
    """A sparse replacement of one MLP: reads the MLP's input, predicts its output `blocks.{l}.hook_mlp_out`.

    The input is `blocks.{l}.ln2.hook_normalized`: the stream before the MLP, divided by ln2's scale and
    before ln2's gain (and bias), which the model exposes for Sprout and the walkthrough GPT. Reading it
    rather than `hook_resid_mid` makes the transcoder blind to the stream's norm, which the MLP is blind
    to as well. Both hook names are kept (`hook_name`, `hook_name_out`) in the saved cfg, as SAELens'
    transcoder configs do. With `skip=True` a linear term x @ W_skip^T is added to the output (skip
    transcoders, Paulo et al. 2025, "Transcoders Beat Sparse Autoencoders for Interpretability").

    Args:
        d_in: the width of the input (d_model); d_sae: latents; d_out: the output's width (d_model).
        kind, k, widths, bandwidth, seed: as for `SAE`.
        skip: add the linear skip W_skip [d_out, d_in] (SAELens' shape), zero at the start.
        layer: the MLP's block; sets hook_name and hook_name_out unless they are given.

    Attributes:
        as SAE's, with W_dec [d_sae, d_out], b_dec [d_out], W_skip (or None), layer, hook_name_out.
        b_dec is not subtracted from the input (it lives in the output space).

    Example:
        >>> import torch, interp
        >>> tc = interp.Transcoder(16, 64, 16, kind="topk", k=4, skip=True, layer=1)
        >>> tc.hook_name, tc.hook_name_out, tuple(tc(torch.randn(2, 5, 16)).shape)
        ('blocks.1.ln2.hook_normalized', 'blocks.1.hook_mlp_out', (2, 5, 16))
    """

    apply_b_dec_to_input = False
    tied_init = False
    transcoder = True  # how the files and the splice tell one, with or without hook names

    def __init__(self, d_in: int, d_sae: int, d_out: Optional[int] = None, kind: str = "topk", k: Optional[int] = None,
                 skip: bool = False, layer: Optional[int] = None, hook_name: Optional[str] = None,
                 hook_name_out: Optional[str] = None, widths: Optional[Sequence[int]] = None, bandwidth: float = 0.05,
                 seed: int = 0, dtype: torch.dtype = torch.float32, device: Optional[Union[str, torch.device]] = None) -> None:
        check_fields("Transcoder", skip=skip, layer=layer, hook_name=hook_name, hook_name_out=hook_name_out)
        hook_name, hook_name_out = transcoder_hooks(layer, hook_name, hook_name_out)
        super().__init__(d_in, d_sae, kind=kind, k=k, hook_name=hook_name, widths=widths, bandwidth=bandwidth,
                         seed=seed, dtype=dtype, device=device, d_out=d_in if d_out is None else d_out)
        self.hook_name_out = hook_name_out
        self.layer = layer if layer is not None else hook_layer(hook_name)
        self.W_skip = nn.Parameter(torch.zeros(self.d_out, self.d_in, dtype=dtype, device=device)) if skip else None

    @property
    def skip(self) -> bool:
        return self.W_skip is not None

    def skip_term(self, x: Float[torch.Tensor, "*batch d_in"]) -> Optional[Float[torch.Tensor, "*batch d_out"]]:
        """x @ W_skip^T [..., d_out], or None without a skip."""
        return None if self.W_skip is None else self._check_input(x) @ self.W_skip.T

    def forward(self, x: Float[torch.Tensor, "*batch d_in"]) -> Float[torch.Tensor, "*batch d_out"]:
        """The predicted MLP output [..., d_out] of the MLP input x [..., d_in]."""
        out = self.decode(self.encode(x))
        skip = self.skip_term(x)  # None exactly without W_skip
        return out if skip is None else out + skip

    def extra_repr(self) -> str:
        return super().extra_repr() + f", d_out={self.d_out}, skip={self.skip}, hook_name_out={self.hook_name_out!r}"


def transcoder_hooks(layer: Optional[int], hook_name: Optional[str], hook_name_out: Optional[str]
                     ) -> tuple[Optional[str], Optional[str]]:
    """(input hook, output hook) of a transcoder: each given one kept, a missing one from `layer` or from
    the other's block (MLP l reads `blocks.l.ln2.hook_normalized` and writes `blocks.l.hook_mlp_out`).
    One hook alone without a block to pair it with is refused: a transcoder given its input hook only
    would otherwise write its prediction of the MLP's output over its own input."""
    block = layer if layer is not None else hook_layer(hook_name) if hook_name else hook_layer(hook_name_out)
    if (hook_name is None) != (hook_name_out is None) and block is None:
        given, missing = ("hook_name", "hook_name_out") if hook_name else ("hook_name_out", "hook_name")
        raise ValueError(f"a Transcoder reads hook_name and writes hook_name_out; {given} given without {missing}, "
                         "and no block to pair it with: give both (or layer=)")
    if block is not None:
        hook_name = hook_name or input_hook(block)
        hook_name_out = hook_name_out or output_hook(block)
    if hook_name is not None and hook_name == hook_name_out:
        raise ValueError(f"a Transcoder reads hook_name and writes hook_name_out, which must differ; both are {hook_name!r}")
    return hook_name, hook_name_out


def input_hook(layer: int) -> str:
    return act_name("normalized", layer, "ln2")


def output_hook(layer: int) -> str:
    return act_name("mlp_out", layer)


def check_model(sae: SAE, model: HookedModel, source: str = "this SAE") -> None:
    """Refuse a model this dictionary was not trained on, or one that lacks its hooks or writes another width.

    Checked once per model and state of its weights (`interp._core.identity.check_once`): a splice per
    batch hashes nothing and runs no forward after the first; an in-place edit of a weight checks again."""
    what = ("dictionary", repr(sorted((sae.model_config or {}).items())), sae.model_fingerprint, sae.hook_name,
            getattr(sae, "hook_name_out", None), sae.d_in, sae.d_out)
    check_once(model, what, lambda: _check_model(sae, model, source))


def _check_model(sae: SAE, model: HookedModel, source: str) -> None:
    if sae.model_config:  # with or without a fingerprint: a record of the model's config is compared
        theirs = model_config(model)
        diff = [f"{k}: SAE {sae.model_config.get(k)!r}, model {theirs.get(k)!r}"
                for k in sorted(set(sae.model_config) | set(theirs)) if sae.model_config.get(k) != theirs.get(k)]
        if diff:
            raise ValueError(f"{source} was trained for another model: config differs ({'; '.join(diff[:4])})")
    if sae.model_fingerprint is not None:
        mine = fingerprint(model)
        if mine != sae.model_fingerprint:
            raise ValueError(f"{source} was trained for another model: weights fingerprint {sae.model_fingerprint} "
                             f"(cfg.json metadata.sprout.model_fingerprint), this {model_name(model)}'s is {mine}")
    hooks = [h for h in (sae.hook_name, getattr(sae, "hook_name_out", None)) if h is not None]
    if not hooks:
        raise ValueError(f"{source} has no hook_name: set sae.hook_name to the hook point it reads")
    require_hooks(model, hooks)
    widths = hook_widths(model, hooks)
    if len(hooks) == 2 and list(widths) != hooks:  # hook_widths' keys come in the order the hooks fired
        raise ValueError(f"{source} reads {hooks[0]!r} and writes {hooks[1]!r}, but {model_name(model)} runs "
                         f"{hooks[1]!r} first: a transcoder's output hook must come after its input hook "
                         "(MLP l: blocks.l.ln2.hook_normalized -> blocks.l.hook_mlp_out)")
    for hook, want in zip(hooks, (sae.d_in, sae.d_out)):
        if widths[hook] != want:
            raise ValueError(f"{source} reads {want}-wide activations at {hook!r}, but {model_name(model)} "
                             f"writes {widths[hook]} there")


def hook_widths(model: HookedModel, hooks: list[str]) -> dict:
    """The last axis of each hook's activation, from a one-token forward that stops after the last layer
    needed. A hook that does not fire, or whose activation is not [batch, pos, d], is refused by name."""
    seen: dict = {}

    def grab(x, hook):
        if x.dim() != 3:
            raise ValueError(f"the activation at {hook.name!r} has shape {list(x.shape)}; dictionaries here read "
                             "[batch, pos, d] activations (the residual stream, MLP and attention outputs, norms)")
        seen.setdefault(hook.name, int(x.shape[-1]))  # keys in the order the hooks first fired

    layers = [hook_layer(h) for h in hooks]
    stop = None if any(layer is None for layer in layers) else min(max(cast(list[int], layers)) + 1, int(model.cfg.n_layers))
    ids = torch.zeros(1, 1, dtype=torch.long, device=model.cfg.device)
    with torch.inference_mode():
        model.run_with_hooks(ids, fwd_hooks=[(h, grab) for h in hooks], stop_at_layer=stop)
    missing = [h for h in hooks if h not in seen]
    if missing:
        raise ValueError(f"{model_name(model)}'s hook {missing[0]!r} did not fire in a forward: nothing to read there")
    return seen
