"""The replacement model: a model made linear on one prompt, from token embeddings and transcoder features
to feature pre-activations and logits (Ameisen et al. 2025, "Circuit Tracing", section 2).

On a prompt, three things are held at their values and every non-linearity goes with them:

* every attention pattern (`blocks.{l}.attn.hook_pattern`) and every norm's scale (`ln1`, `ln2`,
  `ln_final` `hook_scale`): hooks return the stored tensors, so the forward is the clean one and autograd
  sees constants (`sprout.tl.hook_checks.through`). QK-norm and RoPE act only on queries and keys,
  which feed nothing but the frozen pattern, so they fall outside the linear map with it;
* each MLP's output (`blocks.{l}.hook_mlp_out`) is replaced by the transcoders' reconstruction, with
  the features' activations held, plus the linear skip term (computed live from the MLP's input),
  the decoder bias, and an **error** = true output - reconstruction, held too. The output is therefore
  the true one, and what flows backwards is the skip path alone;
* positions before `prefix` (e.g. a BOS) are constants: their features and errors are no nodes.

Then the logits and each feature's pre-activation (x_in @ W_enc + b_enc at its input hook) are affine
in the sources: token embeddings (`hook_embed`), feature decoder vectors times activations, errors.
Everything goes through hook names, so Sprout and the walkthrough GPT (LayerNorm: its scale is frozen
the same way; the mean subtraction is linear; its learned position embeddings are a constant, the token
nodes being `hook_embed`) are both served.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Iterator, Optional, Sequence

import torch
from jaxtyping import Float, Int

from sprout.names import act_name

from .._core.inputs import TextOrTokens, token_batch
from .._core.model import HookedModel, model_name, n_layers
from .dictionaries import Dictionaries, TranscoderInput, as_dictionaries

FROZEN_SUFFIXES = ("ln1.hook_scale", "ln2.hook_scale", "attn.hook_pattern")


def frozen_hook_names(model: HookedModel) -> list[str]:
    """The hook points a replacement model holds at their prompt values: every block's ln1 and ln2 scales and
    attention pattern, and the final norm's scale (those the model has: a walkthrough step without norms has none)."""
    names = [f"blocks.{l}.{s}" for l in range(n_layers(model)) for s in FROZEN_SUFFIXES]
    names.append(act_name("scale", layer_type="ln_final"))
    return [n for n in names if n in model.hook_dict]


@dataclass
class FrozenPrompt:
    """One prompt's values that the replacement model holds (all detached, batch axis dropped).

    Attributes:
        tokens: [pos] the prompt's ids.
        frozen: {hook name: [1, ...]} each frozen scale and pattern.
        embed: [pos, d_model] the token embeddings (`hook_embed`).
        x_in: per layer [pos, d_in], what the features read.
        mlp_out: per layer [pos, d_model], the true MLP outputs.
        acts: per layer [pos, d_sae], the features' activations.
        errors: [n_layers, pos, d_model], true output - reconstruction, at every position.
        logits: [pos, d_vocab] the model's logits.
        prefix: how many leading positions are constants.
    """

    tokens: Int[torch.Tensor, " pos"]
    frozen: dict[str, torch.Tensor]
    embed: Float[torch.Tensor, "pos d_model"]
    x_in: list[torch.Tensor]
    mlp_out: list[torch.Tensor]
    acts: list[torch.Tensor]
    errors: Float[torch.Tensor, "layer pos d_model"]
    logits: Float[torch.Tensor, "pos d_vocab"]
    prefix: int

    @property
    def n_pos(self) -> int:
        return int(self.tokens.numel())


@dataclass
class FrozenRun:
    """A forward of the frozen linear model on a batch of copies of the prompt.

    Attributes:
        embed: [batch, pos, d_model] the token embeddings it ran on (a leaf requiring grad if asked; where
            the run broadcast one prompt's, a zero-stride view of them: read it, never write to it).
        errors: per layer [batch, pos, d_model] the error terms it ran on (leaves requiring grad if asked,
            views as `embed`).
        x_in: per layer [batch, pos, d_in] what each layer's features read (in the autograd graph).
        logits: [batch, pos, d_vocab]; None for a run that stopped after the last block (`logits=False`).
    """

    embed: torch.Tensor
    errors: list[torch.Tensor]
    x_in: list[torch.Tensor]
    logits: Optional[torch.Tensor]

    def pre_acts(self, dicts: Dictionaries) -> list[torch.Tensor]:
        """Every feature's pre-activation per layer [batch, pos, d_sae]."""
        return [dicts.pre_acts(l, x) for l, x in enumerate(self.x_in)]


class ReplacementModel:
    """A model and its transcoders, made linear on a prompt (see the module docstring).

    Args:
        model: a hooked model (Sprout, the walkthrough GPT).
        transcoders: None (the demo's shipped ones), "clt" (its shipped cross-layer transcoder), one
            `interp.Transcoder` per layer, an `interp.CrossLayerTranscoder`, or a `Dictionaries`.
        prefix: leading positions held constant (their features and errors are no nodes); 1 by default,
            as circuit-tracer holds position 0 (a BOS, or the first token of a model trained without one).

    Example:
        >>> rm = interp.ReplacementModel(model, transcoders)                        # doctest: +SKIP
        >>> torch.allclose(rm.forward("The king"), model("The king")[0], atol=1e-5)  # doctest: +SKIP
        True
    """

    def __init__(self, model: HookedModel, transcoders: TranscoderInput = None, *, prefix: int = 1) -> None:
        if isinstance(prefix, bool) or not isinstance(prefix, int) or prefix < 0:
            raise ValueError(f"prefix must be a number of leading positions (an int >= 0), got {prefix!r}")
        self.model = model
        self.dicts = as_dictionaries(model, transcoders)
        if self.dicts.dtype != _model_dtype(model):
            raise TypeError(f"the transcoders are {self.dicts.dtype} but {model_name(model)} is {_model_dtype(model)}: "
                            "cast both to one dtype (interp.attribute(..., dtype=) does)")
        self.prefix = prefix
        self.frozen_names = frozen_hook_names(model)

    @property
    def n_layers(self) -> int:
        return self.dicts.n_layers

    def tokens(self, prompt: TextOrTokens) -> Int[torch.Tensor, " pos"]:
        """The prompt's checked ids [pos] (one text, or ids [pos] / [1, pos])."""
        ids = token_batch(self.model, prompt).ids
        if ids.shape[0] != 1:
            raise ValueError(f"an attribution graph is of one prompt; got a batch of {ids.shape[0]}")
        if ids.shape[1] <= self.prefix:
            raise ValueError(f"the prompt has {ids.shape[1]} token(s), no more than prefix={self.prefix}: nothing "
                             "is left to attribute")
        return ids[0]

    @torch.no_grad()
    def freeze(self, prompt: TextOrTokens) -> FrozenPrompt:
        """The clean forward of `prompt`, and every value the replacement model holds."""
        tokens = self.tokens(prompt)
        _check_no_dropout(self.model)
        _check_flags(self.model)
        d = self.dicts
        inputs = [d.input_hook(l) for l in range(d.n_layers)]
        outputs = [d.output_hook(l) for l in range(d.n_layers)]
        names = self.frozen_names + ["hook_embed"] + inputs + outputs
        logits, cache = self.model.run_with_cache(tokens[None], names_filter=names)
        _check_finite({"logits": logits, **{n: cache[n] for n in names}})
        x_in = [cache[n][0] for n in inputs]
        acts = [d.encode(l, x) for l, x in enumerate(x_in)]
        mlp_out = [cache[n][0] for n in outputs]
        recons = [reconstruction(d, l, x_in[l], acts) for l in range(d.n_layers)]
        _check_finite({f"the transcoder of layer {l}'s output": r for l, r in enumerate(recons)})
        errors = torch.stack([m - r for m, r in zip(mlp_out, recons)])
        return FrozenPrompt(tokens, {n: cache[n] for n in self.frozen_names}, cache["hook_embed"][0], x_in, mlp_out,
                            acts, errors, logits[0], self.prefix)

    def run(self, frozen: FrozenPrompt, *, batch: int = 1, embed: Optional[torch.Tensor] = None,
            acts: Optional[Sequence[torch.Tensor]] = None, errors: Optional[torch.Tensor] = None,
            grad: bool = False, extra_hooks: Sequence[tuple[str, Callable]] = (), logits: bool = True) -> FrozenRun:
        """The frozen linear model on `batch` copies of the prompt, from these sources (default: the prompt's).

        Args:
            frozen: what `freeze` returned.
            batch: copies of the prompt.
            embed: token embeddings [pos, d_model] or [batch, pos, d_model].
            acts: per layer the features' activations [pos, d_sae] or [batch, pos, d_sae].
            errors: [n_layers, pos, d_model] or [n_layers, batch, pos, d_model].
            grad: make `embed` and each layer's errors leaves that require grad (the gradient at an error
                leaf is the gradient at that MLP output).
            extra_hooks: more (name, hook) pairs for this forward (e.g. routing gradients through one head).
            logits: False stops after the last block (no final norm, no unembedding: `FrozenRun.logits` is
                None), which is all the features' pre-activations need; it saves a [batch, pos, d_vocab]
                product forwards and backwards.

        Returns:
            FrozenRun: the logits and what the features read, in the autograd graph.
        """
        _check_flags(self.model)
        d, B, T = self.dicts, batch, frozen.n_pos
        embed_in = _batched(frozen.embed if embed is None else embed, B)
        acts_in = frozen.acts if acts is None else acts
        err_in = [_batched(e, B) for e in (frozen.errors if errors is None else errors)]
        if grad:
            # leaves as the copies' zero-stride views: the gradient is still one per copy, and B copies of
            # the prompt's embeddings and errors are never stored
            embed_in = embed_in.detach().requires_grad_(True)
            err_in = [e.detach().requires_grad_(True) for e in err_in]
        with _constant_weights(self.model, d):  # the copies share the prompt's activations: [pos, d_model], broadcast
            fixed = [d.bias(l) + sum((acts_in[s] @ d.decoder(s, l) for s in _sources_of(d, l)), torch.zeros(()))
                     for l in range(d.n_layers)]
        x_in: list = [None] * d.n_layers
        hooks = [(n, _returns(v.expand(B, *v.shape[1:]))) for n, v in frozen.frozen.items()]
        hooks.append(("hook_embed", _returns(embed_in)))
        for l in range(d.n_layers):
            hooks.append((d.input_hook(l), _capture(x_in, l)))
            hooks.append((d.output_hook(l), _mlp_output(d, l, x_in, fixed[l], err_in[l])))
        hooks += list(extra_hooks)
        stop = {} if logits else {"stop_at_layer": n_layers(self.model)}
        with torch.enable_grad() if grad else contextlib.nullcontext(), _constant_weights(self.model, d):
            out = self.model.run_with_hooks(frozen.tokens[None].expand(B, T), fwd_hooks=hooks, **stop)
        return FrozenRun(embed_in, err_in, x_in, out if logits else None)

    def forward(self, prompt: TextOrTokens) -> Float[torch.Tensor, "pos d_vocab"]:
        """The replacement model's logits [pos, d_vocab] on `prompt`, held at its own values: the model's."""
        with torch.no_grad():
            logits = self.run(self.freeze(prompt)).logits
        assert logits is not None  # a run with logits=True
        return logits[0]


def reconstruction(d: Dictionaries, out: int, x_in: torch.Tensor, acts: Sequence[torch.Tensor]) -> torch.Tensor:
    """The dictionaries' output at layer `out`: b_dec + skip(x_in) + the decoder rows of every feature
    writing there, times their activations ([..., d_model])."""
    total = d.bias(out) + sum((acts[s] @ d.decoder(s, out) for s in _sources_of(d, out)), torch.zeros(()))
    skip = d.skip(out, x_in)
    return total if skip is None else total + skip


def _sources_of(d: Dictionaries, out: int) -> list[int]:
    """The layers whose features write into layer `out`'s output."""
    return [s for s in range(out + 1) if out in d.writes(s)]


def _batched(x: torch.Tensor, batch: int) -> torch.Tensor:
    """[..., pos, d] or [batch, pos, d] -> [batch, pos, d]."""
    return x.expand(batch, *x.shape) if x.dim() == 2 else x


def _returns(value: torch.Tensor) -> Callable:
    def hook(act, hook):
        return value
    return hook


def _capture(store: list, layer: int) -> Callable:
    def hook(act, hook):
        store[layer] = act
    return hook


def _mlp_output(d: Dictionaries, layer: int, x_in: list, fixed: torch.Tensor, error: torch.Tensor) -> Callable:
    """The hook replacing layer's MLP output by skip(x_in, live) + the held part (bias and features, fixed,
    plus the error), summed as the forward reaches it so that no layer's [batch, pos, d_model] sum waits."""
    def hook(act, hook):
        skip = d.skip(layer, x_in[layer])
        out = fixed + error
        return (out if skip is None else out + skip).to(act.dtype)
    return hook


@contextlib.contextmanager
def _constant_weights(model: HookedModel, d: Dictionaries) -> Iterator[None]:
    """The model's and the dictionaries' weights marked as not requiring grad for one forward, then as they
    were. The frozen model is linear in its sources alone; a weight that requires grad makes autograd keep
    every matmul's input for a weight gradient no one asks for (on gpt-4, a third of a batched run's peak)."""
    params = [p for m in (model, *d.modules()) if isinstance(m, torch.nn.Module) for p in m.parameters()
              if p.requires_grad]
    for p in params:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in params:
            p.requires_grad_(True)


def _check_finite(tensors: dict) -> None:
    bad = [name for name, t in tensors.items() if not torch.isfinite(t).all()]
    if bad:
        raise ValueError(f"NaN or infinite activations at {', '.join(bad[:3])}: the model (or its transcoders) "
                         "gives no finite values on this prompt, so no graph can be built")


def _check_flags(model: HookedModel) -> None:
    on = [f for f in ("use_split_qkv_input", "use_attn_in") if getattr(model.cfg, f, False)]
    if on:
        raise ValueError(f"model.cfg.{on[0]} is on: each head then normalises its own copy of the stream and "
                         "ln1's frozen scale would not reach the heads; call model.set_" + on[0] + "(False) first")


def _check_no_dropout(model: HookedModel) -> None:
    modules = model.named_modules() if isinstance(model, torch.nn.Module) else []
    live = [n for n, m in modules if isinstance(m, torch.nn.Dropout) and m.p > 0 and m.training]
    if live:
        raise ValueError(f"{model_name(model)} is in training mode with dropout ({live[0]}): a graph of a random "
                         "forward is no graph of the model; call model.eval() first")


def _model_dtype(model: HookedModel) -> torch.dtype:
    return next(iter(model.parameters())).dtype
