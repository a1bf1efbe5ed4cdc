"""Splicing dictionaries into a model's forward, with their latents as hook points of the model.

`spliced(model, saes)` is a context manager: inside it each SAE replaces the activation at its
`hook_name` by its reconstruction, and each transcoder replaces `hook_name_out` (an MLP's output) by
its prediction from `hook_name` (the MLP's input). Every dictionary's intermediate values are hook
points of the model under SAELens' names, so any analysis that addresses activations by name
(caches, `run_with_hooks`, patching, attribution) reaches the latents:

    {hook_name}.hook_sae_input       what the dictionary reads        [batch, pos, d_in]
    {hook_name}.hook_sae_acts_pre    its pre-activations              [batch, pos, d_sae]
    {hook_name}.hook_sae_acts_post   its latents                      [batch, pos, d_sae]
    {hook_name}.hook_sae_recons      its reconstruction / prediction  [batch, pos, d_out]
    {hook_name}.hook_sae_error       target - clean reconstruction    (with the error term only)
    {hook_name}.hook_sae_output      what the model receives

(a transcoder's points hang under its input hook, as SAELens names them by `hook_name`; its error and
output fire when the MLP's output does).

With `use_error_term=True` the model receives `recons + error`, where the error is the target minus
the reconstruction of the clean, unedited latents (SAELens' HookedSAETransformer): the forward is the
clean model's, exactly while nothing edits a latent, and an edit of a latent moves the output by its
decoder row times the change. Gradients then reach the latents through the decoder and flow upstream
through the error term alone (the encoder's input passes no gradient back), which is the clean model's gradient.

A hook on the host point itself (`blocks.1.hook_resid_post`) added inside the context runs after the
splice and sees what the model receives; one added with `prepend=True` sees the original activation.
"""
from __future__ import annotations

from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Iterator, Optional, Sequence, Union

import torch
from jaxtyping import Float
from transformer_lens.hook_points import HookPoint

from .._core.inputs import TextOrTokens, token_batch
from .._core.model import HookedModel

if TYPE_CHECKING:
    from transformer_lens import ActivationCache

    from .sae import SAE

# one SAE or transcoder, or a list of them (one per hook)
Dictionaries = Union["SAE", Sequence["SAE"]]

POINTS = ("hook_sae_input", "hook_sae_acts_pre", "hook_sae_acts_post", "hook_sae_recons", "hook_sae_error", "hook_sae_output")


def is_transcoder(sae: object) -> bool:
    return bool(getattr(sae, "transcoder", False)) or getattr(sae, "hook_name_out", None) is not None


def writes(sae: object) -> str:
    """The activation a spliced dictionary replaces: an SAE's own hook, a transcoder's output hook."""
    return getattr(sae, "hook_name_out") if is_transcoder(sae) else getattr(sae, "hook_name")


def latent_name(sae: SAE, point: str = "hook_sae_acts_post") -> str:
    """The model's hook name of one of a spliced dictionary's points, e.g. 'blocks.1.hook_resid_post.hook_sae_acts_post'."""
    if point not in POINTS:
        raise ValueError(f"a spliced dictionary has the points {', '.join(POINTS)}; got {point!r}")
    return f"{sae.hook_name}.{point}"


class _NoGradUpstream(torch.autograd.Function):
    """The identity whose backward sends zeros upstream: the encoder's input stays in the autograd graph
    (so a backward asked only for the model's parameters still reaches the latents' hooks) without
    adding the encoder's path to the gradient of what comes before."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return torch.zeros_like(grad)


def _has_hooks(*points: HookPoint) -> bool:
    return any(p._forward_hooks or p._backward_hooks for p in points)


def _predict(sae, x: torch.Tensor, points: Optional[dict]) -> torch.Tensor:
    """The dictionary's output for input x, through its hook points when given (None: no hooks fire)."""
    hp = points or {}
    if hp and hasattr(sae, "pre_acts") and hasattr(sae, "rule"):  # interp.SAE: its pre-activations are a point too
        acts = sae.rule.encode(hp["hook_sae_acts_pre"](sae.pre_acts(x)), sae)
    else:
        acts = sae.encode(x)
    acts = hp["hook_sae_acts_post"](acts) if hp else acts
    recons = sae.decode(acts)
    skip = sae.skip_term(x) if hasattr(sae, "skip_term") else None
    recons = recons if skip is None else recons + skip
    return hp["hook_sae_recons"](recons) if hp else recons


class _Splice:
    """One dictionary in one model: its hook points and the torch hooks that run it."""

    def __init__(self, model: HookedModel, sae, use_error_term: bool):
        self.model, self.sae, self.use_error_term = model, sae, bool(use_error_term)
        hooks = model.hook_dict
        names = [sae.hook_name] + ([sae.hook_name_out] if is_transcoder(sae) else [])
        for name in names:
            if name not in hooks:
                raise ValueError(f"the {type(sae).__name__} reads or writes {name!r}, which {type(model).__name__} "
                                 "has no hook point for (names look like 'blocks.0.hook_resid_post')")
        self.host = hooks[sae.hook_name]
        self.out_host = hooks[sae.hook_name_out] if is_transcoder(sae) else self.host
        clash = [p for p in POINTS if p in self.host._modules]
        if clash:
            raise ValueError(f"two dictionaries are spliced at {sae.hook_name!r}: splice one dictionary per hook")
        self.points = {p: HookPoint() for p in POINTS}
        self.pending: Optional[tuple] = None  # a transcoder's (input, prediction) until the MLP's output fires

    def attach(self) -> list:
        for name, point in self.points.items():
            self.host.add_module(name, point)
        if self.out_host is self.host:
            return [self.host.register_forward_hook(self._replace)]
        return [self.host.register_forward_hook(self._read), self.out_host.register_forward_hook(self._write)]

    def detach(self) -> None:
        for name in self.points:
            self.host._modules.pop(name, None)

    # --- the torch forward hooks -----------------------------------------------------------------

    def _input(self, x: torch.Tensor) -> torch.Tensor:
        d_in = self.sae.W_enc.shape[0]
        if x.shape[-1] != d_in:
            raise ValueError(f"{self.sae.hook_name} has shape {list(x.shape)} but the {type(self.sae).__name__} "
                             f"reads d_in={d_in}: it was made for another hook or model")
        x = x.to(self.sae.W_enc.dtype)
        if self.use_error_term:
            return _NoGradUpstream.apply(x) if x.requires_grad else x.detach()
        return x

    def _run(self, x: torch.Tensor):
        """(the activation read, prediction through the hook points)."""
        x_in, point = self._input(x), self.points["hook_sae_input"]
        if _has_hooks(point):  # a hook editing it in place must not edit the model's own activation
            x_in = x_in.clone()
        return x, _predict(self.sae, point(x_in), self.points)

    def _replace(self, module, args, x):
        return self._finish(x, *self._run(x))

    def _read(self, module, args, x):
        self.pending = self._run(x)

    def _write(self, module, args, target):
        if self.pending is None:  # the input hook did not fire (a run that starts later)
            return None
        (x, recons), self.pending = self.pending, None
        return self._finish(target, x, recons)

    def _finish(self, target: torch.Tensor, x: torch.Tensor, recons: torch.Tensor) -> torch.Tensor:
        if recons.shape[:-1] != target.shape[:-1] or recons.shape[-1] != target.shape[-1]:
            raise ValueError(f"the {type(self.sae).__name__} at {self.sae.hook_name} outputs shape {list(recons.shape)}, "
                             f"but it replaces an activation of shape {list(target.shape)}")
        out = self._with_error(target, x, recons) if self.use_error_term else recons
        return self.points["hook_sae_output"](out.to(target.dtype))

    def _with_error(self, target, x, recons):
        """recons + (target - the clean prediction from x, the unedited input)."""
        p = self.points
        target = target.to(recons.dtype)
        if _has_hooks(p["hook_sae_input"], p["hook_sae_acts_pre"], p["hook_sae_acts_post"], p["hook_sae_recons"]):
            with torch.no_grad():
                clean = _predict(self.sae, self._input(x), None)
        else:
            clean = recons.detach()
        error = target - clean
        seen = p["hook_sae_error"](error.clone() if _has_hooks(p["hook_sae_error"]) else error)
        if torch.equal(recons, clean) and (seen is error or torch.equal(seen, error)):
            # nothing was edited: the target itself, bit for bit, with the latents' gradient path kept
            return target + (recons - recons.detach())
        return recons + seen


@contextmanager
def spliced(model: HookedModel, saes: Dictionaries, use_error_term: bool = False) -> Iterator[HookedModel]:
    """Splice SAEs and transcoders into `model` for the duration of the block (see the module docstring).

    Args:
        model: a hooked model (Sprout, the walkthrough GPT).
        saes: one dictionary or a list; at most one per hook.
        use_error_term: add each dictionary's error, so the forward stays the clean model's.

    Example:
        >>> import sprout, interp
        >>> model = sprout.load("gpt-4")
        >>> sae = interp.load_sae(model, "blocks.3.hook_resid_post")
        >>> def clamp(acts, hook):  # latent 180 (full stops) held high
        ...     acts[:, :, 180] = 120.0
        ...     return acts
        >>> with interp.spliced(model, [sae], use_error_term=True):
        ...     logits = model.run_with_hooks("Zorbin Plax met", fwd_hooks=[(sae.hook_name + ".hook_sae_acts_post", clamp)])
        >>> logits.shape
        torch.Size([1, 7, 4096])
    """
    if not isinstance(use_error_term, bool):  # "no" is truthy: a string must not switch the error term on
        raise TypeError(f"use_error_term must be True or False, got {use_error_term!r}")
    saes = _as_list(saes)
    with _hook_lock(model):  # the hook table is read, and rebuilt by a splice, under the model's lock only
        for sae in saes:
            if hasattr(sae, "check_model"):  # an interp.SAE knows the model it was trained on, and its hooks' order
                sae.check_model(model, f"the {type(sae).__name__} at {sae.hook_name!r}")
        with _spliced(model, saes, use_error_term):
            yield model


def _hook_lock(model: HookedModel) -> ContextManager:
    """The model's public `hook_lock` (Sprout and the walkthrough GPT); a model without one (TransformerLens'
    own) has no lock to take."""
    lock = getattr(model, "hook_lock", None)
    return nullcontext() if lock is None else lock


@contextmanager
def _spliced(model: HookedModel, saes: list, use_error_term: bool) -> Iterator:
    """`spliced` without the checks against the model (made once by a caller that splices per batch)."""
    with _hook_lock(model):
        splices, handles = [], []
        try:
            for sae in saes:
                s = _Splice(model, sae, use_error_term)
                handles += s.attach()
                splices.append(s)
            model.setup()  # the new hook points join hook_dict / mod_dict under their dotted names
            yield model
        finally:
            for h in handles:
                h.remove()
            for s in splices:
                s.detach()
            model.setup()


class SAELensView:
    """A SAELens SAE or transcoder as a splice reads one: its hook names from its config (SAELens 6 keeps
    them in `cfg.metadata`, older releases at the top of `cfg`), its `encode` / `decode`, and the skip
    term `x @ W_skip.T` of its skip transcoders (which its own splice leaves out)."""

    def __init__(self, sae: Any) -> None:
        meta = getattr(sae.cfg, "metadata", None)
        self.sae, self.W_enc, self.encode, self.decode = sae, sae.W_enc, sae.encode, sae.decode
        self.hook_name = getattr(meta, "hook_name", None) or getattr(sae.cfg, "hook_name", None)
        self.hook_name_out = getattr(meta, "hook_name_out", None) or getattr(sae.cfg, "hook_name_out", None)
        if not self.hook_name or (self.hook_name_out is None and hasattr(sae.cfg, "d_out")):
            raise ValueError(f"this SAELens {type(sae).__name__} names no hook_name{'_out' if self.hook_name else ''} "
                             "in its cfg.metadata: set it (e.g. sae.cfg.metadata.hook_name = 'blocks.0.hook_resid_post')")

    def skip_term(self, x: torch.Tensor) -> Optional[torch.Tensor]:
        w_skip = getattr(self.sae, "W_skip", None)
        return None if w_skip is None else x @ w_skip.T.to(x.dtype)


def _is_saelens(sae: object) -> bool:
    return not hasattr(sae, "hook_name") and hasattr(sae, "cfg") and hasattr(sae, "W_enc") and hasattr(sae, "encode")


def _as_list(saes, splice: bool = True) -> list:
    if not hasattr(saes, "hook_name") and not _is_saelens(saes) and (isinstance(saes, (str, bytes)) or not hasattr(saes, "__iter__")):
        raise TypeError(f"saes must be an SAE, a Transcoder or a list of them, got {type(saes).__name__}")
    saes = [saes] if hasattr(saes, "hook_name") or _is_saelens(saes) else list(saes)
    saes = [SAELensView(s) if _is_saelens(s) else s for s in saes]
    if not saes:
        raise ValueError("no dictionaries given to splice")
    bad = [type(s).__name__ for s in saes if not hasattr(s, "hook_name") or not hasattr(s, "encode")]
    if bad:
        raise TypeError(f"expected SAEs or transcoders (with hook_name, encode, decode), got {bad[0]}")
    unhooked = [s for s in saes if not isinstance(s.hook_name, str) or (is_transcoder(s) and not
                                                                        isinstance(getattr(s, "hook_name_out", None), str))]
    if unhooked:
        what = "hook_name and hook_name_out (the MLP's input and output)" if is_transcoder(unhooked[0]) else "hook_name"
        raise ValueError(f"a spliced {type(unhooked[0]).__name__} needs {what}; got {unhooked[0].hook_name!r}"
                         + (f", {getattr(unhooked[0], 'hook_name_out', None)!r}" if is_transcoder(unhooked[0]) else ""))
    if not splice:  # only read (dead_fractions): several dictionaries may share a hook
        return saes
    names = [s.hook_name for s in saes]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"two dictionaries read {dup[0]!r}: splice one dictionary per hook")
    written = [writes(s) for s in saes]
    dup = sorted({n for n in written if written.count(n) > 1})
    if dup:
        raise ValueError(f"two dictionaries write {dup[0]!r} (an SAE there and a transcoder whose output it is, or "
                         "two transcoders): the result would depend on their order; splice one of them")
    return saes


def run_with_saes(model: HookedModel, tokens: TextOrTokens, saes: Dictionaries, use_error_term: bool = False,
                  names_filter: Optional[Callable | str | Sequence[str]] = None, **kwargs: Any
                  ) -> tuple[Float[torch.Tensor, "batch pos d_vocab"], ActivationCache]:
    """Run with the dictionaries spliced in and cache activations, latents included.

    Returns:
        (logits, cache): forward's output and an ActivationCache holding, besides the model's hooks,
        each dictionary's `{hook_name}.hook_sae_acts_post` [batch, pos, d_sae], `.hook_sae_input`,
        `.hook_sae_recons`, `.hook_sae_output` and (with the error term) `.hook_sae_error`.
        `names_filter` selects what is cached as in `run_with_cache` (default: everything).
        With `use_error_term=True` the logits are the clean model's.

    Example:
        >>> import sprout, interp
        >>> model = sprout.load("gpt-4")
        >>> sae = interp.load_sae(model, "blocks.1.hook_resid_post")
        >>> logits, cache = interp.run_with_saes(model, "Zorbin Plax met Mira. Then Zorbin", [sae])
        >>> cache["blocks.1.hook_resid_post.hook_sae_acts_post"].shape
        torch.Size([1, 16, 1536])
    """
    if isinstance(names_filter, (list, tuple)):
        names_filter = list(names_filter)
    if "attention_mask" not in kwargs and not isinstance(tokens, str):  # the token contract: ids and their mask
        batch = token_batch(model, tokens)
        tokens = batch.ids
        if batch.mask is not None:
            kwargs["attention_mask"] = batch.mask
    with spliced(model, saes, use_error_term):
        return model.run_with_cache(tokens, names_filter=names_filter, **kwargs)
