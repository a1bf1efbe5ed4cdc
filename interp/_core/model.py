"""What interp needs to know about a model, in one place: hook names, the final norm, token strings.

Every analysis reads activations through TransformerLens' canonical hook names only, so it runs on
any hooked model here (Sprout, the walkthrough GPT). The one thing hooks cannot give is "apply the
final norm and the unembedding to a residual vector" (the logit lens): `unembed` finds the model's
own modules for that by name, and says clearly when it does not know the model.
"""
from __future__ import annotations

from typing import Any, ContextManager, Iterator, Optional, Protocol, Sequence, TypeGuard, Union

import torch
import torch.nn as nn
from jaxtyping import Float, Int
from transformer_lens.hook_points import HookPoint

from sprout.tokenizer import decode

# (final norm, output layer) attribute pairs, in the order they are tried. Sprout keeps model.py's
# `norm` and `head` (its `ln_final` / `unembed` only hold hook points); the walkthrough GPT's are
# `ln_final` (nn.Identity at steps without a final norm) and `unembed`; nanoGPT-style models use `ln_f`.
FINAL_MODULES = (("norm", "head"), ("ln_final", "unembed"), ("ln_f", "lm_head"))


class HookedModel(Protocol):
    """The public surface of a model that `interp` reads: TransformerLens' config, hook points and run_with_*
    entry points, and the weight matrices in TransformerLens' layout. `sprout.Sprout` and the walkthrough GPT
    have it (`tests/interp/test_model_protocol.py`); a TransformerLens HookedTransformer has all of it but
    `run_with_cache_into` (our preallocated-buffer cache, which only activation harvesting calls)."""

    cfg: Any  # n_layers, n_heads, d_model, d_head, d_vocab, n_ctx, device, ... (TransformerLens' config)
    hook_dict: dict[str, HookPoint]
    blocks: Any  # an nn.ModuleList of the blocks (whose submodules differ between models)
    tokenizer: Any  # a Hugging Face tokenizer, or None

    @property
    def W_E(self) -> Float[torch.Tensor, "d_vocab d_model"]: ...
    @property
    def W_U(self) -> Float[torch.Tensor, "d_model d_vocab"]: ...
    @property
    def W_Q(self) -> Float[torch.Tensor, "layer head d_model d_head"]: ...
    @property
    def W_K(self) -> Float[torch.Tensor, "layer head d_model d_head"]: ...
    @property
    def W_V(self) -> Float[torch.Tensor, "layer head d_model d_head"]: ...
    @property
    def W_O(self) -> Float[torch.Tensor, "layer head d_head d_model"]: ...

    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...
    def run_with_cache(self, *args: Any, **kwargs: Any) -> tuple[Any, Any]: ...
    def run_with_hooks(self, *args: Any, **kwargs: Any) -> Any: ...
    def run_with_cache_into(self, tokens: Int[torch.Tensor, "batch pos"], buffers: dict, **forward_kwargs: Any) -> Any: ...
    def hooks(self, *args: Any, **kwargs: Any) -> ContextManager[Any]: ...
    def to_single_token(self, string: str) -> int: ...
    def setup(self) -> None: ...
    def parameters(self, recurse: bool = True) -> Iterator[nn.Parameter]: ...
    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]: ...


def model_name(model: object) -> str:
    return type(model).__name__


def require_hooks(model: object, names: Sequence[Optional[str]]) -> None:
    """Raise a ValueError naming each hook point in `names` that `model` does not have (None: a name not known, never there)."""
    hook_dict = getattr(model, "hook_dict", None)
    if hook_dict is None:
        raise ValueError(f"{model_name(model)} is not a hooked model (no hook_dict): interp reads activations "
                         "through TransformerLens hook points")
    missing = [n for n in names if n not in hook_dict]
    if missing:
        more = f" (and {len(missing) - 1} more of the {len(names)} it reads)" if len(missing) > 1 else ""
        raise ValueError(f"{model_name(model)} has no hook point {missing[0]!r}{more}; this analysis needs it")


def n_layers(model: HookedModel) -> int:
    return int(model.cfg.n_layers)


def n_heads(model: HookedModel) -> int:
    return int(model.cfg.n_heads)


def unembed(model: HookedModel, resid: Float[torch.Tensor, "*batch d_model"]) -> Float[torch.Tensor, "*batch d_vocab"]:
    """The model's own final norm, then its output layer: resid [..., d_model] -> logits [..., d_vocab].

    A final norm that is None or nn.Identity (a walkthrough step without one) means no norm, as in forward.

    Raises:
        ValueError: the model has none of the known (norm, output layer) module pairs.
    """
    norm, head = final_modules(model)
    return head(resid if norm is None else norm(resid))


def final_modules(model: HookedModel) -> tuple[Optional[nn.Module], nn.Module]:
    """(final norm or None, output layer) of the model, as `unembed` applies them."""
    for norm_name, head_name in FINAL_MODULES:
        if not hasattr(model, norm_name):
            continue
        norm, head = getattr(model, norm_name), getattr(model, head_name, None)
        # a module holding only hook points (Sprout's `ln_final`, `unembed`) has no weight to apply
        if _has_weight(head) and (norm is None or isinstance(norm, nn.Identity) or _has_weight(norm)):
            return norm, head
    tried = ", ".join(f"{n} + {h}" for n, h in FINAL_MODULES)
    raise ValueError(f"cannot find the final norm and output layer of {model_name(model)} "
                     f"(tried the module pairs {tried}); the logit lens needs both")


def _has_weight(module: object) -> TypeGuard[nn.Module]:
    return isinstance(module, nn.Module) and isinstance(getattr(module, "weight", None), torch.Tensor)


def str_tokens(model: HookedModel, ids: Int[torch.Tensor, "*pos"]) -> list[str]:
    """Each id of a 1-D tensor as text (the model's tokenizer; `<unk:ID>` for an id it lacks), or "#id"
    when it has none."""
    values: list[int] = ids.reshape(-1).tolist()
    tok = getattr(model, "tokenizer", None)
    if tok is None:
        return [f"#{i}" for i in values]
    return [decode(tok, [i]) for i in values]


def as_index(value: Any, what: str) -> int:  # anything: refused unless an integer
    """`value` as a layer or head number: an integer (Python or numpy), never a bool or a float like 0.7."""
    is_bool = isinstance(value, bool) or str(getattr(value, "dtype", "")) in ("bool", "torch.bool")
    if is_bool or not hasattr(type(value), "__index__"):
        raise TypeError(f"{what} must be an integer, got {value!r} ({type(value).__name__})")
    return int(value.__index__())


def heads_of(model: HookedModel, layer: Optional[Union[int, Sequence[int]]] = None,
             head: Optional[Union[int, Sequence[int]]] = None) -> tuple[list[int], list[int]]:
    """The layers and heads selected by `layer` / `head` (an int, a list, or None for all), checked."""
    def pick(value, n, what):
        single = value is not None and (isinstance(value, (bool, int, float)) or hasattr(value, "__index__"))
        chosen = list(range(n)) if value is None else [as_index(v, what) for v in ([value] if single else value)]
        bad = [v for v in chosen if not 0 <= v < n]
        if bad:
            raise ValueError(f"{what} {bad[0]} is out of range: {model_name(model)} has {n} {what}s (0..{n - 1})")
        return chosen

    return pick(layer, n_layers(model), "layer"), pick(head, n_heads(model), "head")


def logits_of(model: HookedModel, ids: Int[torch.Tensor, "batch pos"]) -> Float[torch.Tensor, "batch pos d_vocab"]:
    """The model's output logits [batch, pos, d_vocab] for ids [batch, pos], no hooks added."""
    out = model.run_with_hooks(ids)
    return out[0] if isinstance(out, tuple) else out
