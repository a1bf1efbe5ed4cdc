"""Hook safety: a hook's replacement must match what it replaces; caches slice the position axis.

TransformerLens adds whatever a hook returns into the forward, so a [batch, pos, d_model] tensor
returned from `ln1.hook_scale` [batch, pos, 1] broadcasts silently into wrong numbers. Every hook
added through `hooks()`, `run_with_hooks`, `run_with_cache` or `add_hook` is wrapped so that a
replacement of another shape or dtype is an error naming the hook. A backward hook may return the
gradient bare or as PyTorch's one-tuple `(grad,)`, as TransformerLens allows.
"""
from __future__ import annotations

import functools
from typing import Callable, Optional, Union

import torch
from transformer_lens.hook_points import HookPoint, NamesFilter
from transformer_lens.utilities.slice import Slice, SliceInput

from .recycle import CacheRecycler

# Hooks whose position axis is not the one after the batch: [batch, head, query_pos, key_pos] slice the query.
_QUERY_AXIS = ("hook_attn_scores", "hook_pattern")


def checked_hook(hook: Callable, dir: str) -> Callable:
    """`hook`, wrapped so that a returned tensor of another shape or dtype raises, naming the hook."""
    @functools.wraps(hook)
    def checked(tensor, *args, hook=None, **kwargs):
        out = fn(tensor, *args, hook=hook, **kwargs)
        if out is not None and isinstance(tensor, torch.Tensor):
            grad = out[0] if dir == "bwd" and isinstance(out, tuple) and len(out) == 1 else out
            check_replacement(getattr(hook, "name", "?"), tensor, grad, dir)
        return out

    fn = hook
    return checked


def check_replacement(name: str, given: torch.Tensor, out: object, dir: str = "fwd") -> None:
    what = "activation" if dir == "fwd" else "gradient"
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"the hook on {name!r} returned a {type(out).__name__}; a hook returns None or a tensor "
                        f"replacing the {what} (shape {list(given.shape)}, dtype {given.dtype})")
    if out.shape != given.shape:
        raise ValueError(f"the hook on {name!r} returned shape {list(out.shape)} but the {what} it replaces has "
                         f"shape {list(given.shape)}; return a tensor of the same shape (nothing is broadcast)")
    if out.dtype != given.dtype:
        raise TypeError(f"the hook on {name!r} returned dtype {out.dtype} but the {what} it replaces is "
                        f"{given.dtype}; cast it back (e.g. .to({given.dtype}))")


def unknown_hook(name: str, hook_dict: dict) -> KeyError:
    """A KeyError for a hook name the model lacks, saying where the architecture differs from GPT-2's."""
    why = ""
    if name.endswith("hook_pos_embed") or name.startswith("pos_embed"):
        why = (": this model has no learned position embedding (RoPE rotates each head's queries and keys; "
               "positions show in blocks.{l}.attn.hook_rot_q / hook_rot_k, see docs/reference/differences.md "
               "(where Sprout differs from TransformerLens)")
    elif name.endswith(INPUT_HOOK_SUFFIXES):
        why = " (the input hooks need their flag: model.set_use_split_qkv_input(True) / set_use_attn_in(True))"
    return KeyError(f"no hook point named {name!r}{why}; model.hook_dict lists the {len(hook_dict)} there are")


INPUT_HOOK_SUFFIXES = ("hook_q_input", "hook_k_input", "hook_v_input", "hook_attn_in", "hook_mlp_in")


def position_axis(name: str, batched: bool = True) -> int:
    """The position axis of a hook's activation: the query axis of attention scores and patterns, else
    the axis after the batch ([batch, pos, ...])."""
    axis = 2 if name.endswith(_QUERY_AXIS) else 1
    return axis if batched else axis - 1


def _filter(names_filter):
    if names_filter is None:
        return lambda name: True
    if isinstance(names_filter, str):
        return lambda name: name == names_filter
    if isinstance(names_filter, (list, tuple, set, frozenset)):
        names = set(names_filter)
        return lambda name: name in names
    if callable(names_filter):
        return names_filter
    raise ValueError(f"names_filter must be a hook name, a list of names or a function, got {type(names_filter).__name__}")


class Store:
    """A caching hook: stores the activation under its names and returns None, so it never edits the forward
    (the attention reads this to skip its edit check, `sprout.tl.pattern_attention`)."""

    def __init__(self, save: Callable, names: tuple, is_backward: bool) -> None:
        self.save, self.names, self.is_backward = save, names, is_backward

    def __call__(self, tensor: torch.Tensor, hook: HookPoint) -> None:
        self.save(tensor, hook, self.names, self.is_backward)


def reads_only(point: HookPoint) -> bool:
    """Whether every forward hook on `point` is a `Store` (TransformerLens records each one's own function)."""
    handles = point.fwd_hooks
    return len(handles) == len(point._forward_hooks) and all(
        isinstance(getattr(h, "user_hook", None), Store) for h in handles)


def cache_hooks(hook_dict: dict[str, HookPoint], names_filter: NamesFilter = None, incl_bwd: bool = False,
                device: Optional[Union[str, torch.device]] = None, remove_batch_dim: bool = False, cache: Optional[dict] = None,
                pos_slice: Optional[Union[Slice, SliceInput]] = None, gated: Optional[Callable[[str], object]] = None,
                recycler: Optional[CacheRecycler] = None) -> tuple[dict, list, list]:
    """TransformerLens' get_caching_hooks, slicing every activation on its own position axis.

    TransformerLens decides the axis from a list of name suffixes, which does not know Sprout's
    `hook_rot_q`, `hook_q_normed` ... ([batch, pos, head, d_head]) and slices their head axis.
    One hook per hook point, storing the activation under every selected name of that point (an
    input hook and its TransformerLens 4 alias `blocks.{l}.attn.hook_q_input`). `gated(name)` says
    whether a point never fires (its flag off): the filter skips those (`run_with_cache` warns when
    its filter names one). `recycler` is told of each stored activation (`sprout.tl.recycle`).
    """
    cache = {} if cache is None else cache
    pos_slice = Slice.unwrap(pos_slice)
    select = _filter(names_filter)

    def save(tensor, hook, names=(), is_backward=False):
        x = tensor.detach().to(device)
        batched = True
        if remove_batch_dim and x.dim() > 0 and x.size(0) == 1:
            x, batched = x[0], False
        if pos_slice.slice is not None and x.dim() > position_axis(hook.name, batched):
            x = pos_slice.apply(x, dim=position_axis(hook.name, batched))
        for name in names:
            cache[name + ("_grad" if is_backward else "")] = x
        if recycler is not None and not is_backward:
            recycler.stored(x)

    by_point: dict = {}
    for name, point in hook_dict.items():
        if select(name) and (gated is None or not gated(name)):
            by_point.setdefault(id(point), (point, []))[1].append(name)
    fwd, bwd = [], []
    for point, names in by_point.values():
        # register under the point's own name unless only an alias was selected
        first = point.name if point.name in names else names[0]
        fwd.append((first, Store(save, tuple(names), is_backward=False)))
        if incl_bwd:
            bwd.append((first, Store(save, tuple(names), is_backward=True)))
    return cache, fwd, bwd


def check_buffers(hook_dict: dict, buffers: dict) -> None:
    """Buffers for run_with_cache_into: known hook names, floating-point tensors."""
    unknown = sorted(set(buffers) - set(hook_dict))
    if unknown:
        raise ValueError(f"no hook points named {unknown}")
    for name, buf in buffers.items():
        if not isinstance(buf, torch.Tensor):
            raise TypeError(f"the buffer for {name!r} must be a torch.Tensor, got {type(buf).__name__}")
        if not buf.is_floating_point():
            raise TypeError(f"the buffer for {name!r} has dtype {buf.dtype}; activations are floating point and "
                            "would be truncated: allocate it with a floating dtype (e.g. torch.float32)")


def copy_into_buffer(buffer: torch.Tensor, name: str) -> Callable[[torch.Tensor, HookPoint], None]:
    """A forward hook copying the activation into buffer[:batch, :pos, ...], refusing a buffer too small."""
    def copy_into(x, hook):
        if buffer.dim() != x.dim() or any(b < n for b, n in zip(buffer.shape, x.shape)):
            raise ValueError(f"the buffer for {name!r} has shape {list(buffer.shape)} but the activation has shape "
                             f"{list(x.shape)}: it needs as many axes, each at least as long")
        buffer[tuple(slice(0, n) for n in x.shape)].copy_(x)

    return copy_into


def through(point: HookPoint, x: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """point(x), and whether its hooks left x as it was: returned x itself (or None), unedited in place.

    Only identity counts as "no edit". A hook that returns another tensor, even one equal in value (a
    stored copy, `act.detach()`: TransformerLens' stop-gradient idiom for freezing a norm scale or an
    attention pattern), has replaced x, and the caller must use that tensor for the values and for the
    gradients, so what a freezing hook returns is what autograd sees. An in-place edit bumps x's version
    counter; inference-mode tensors keep none, so there a copy of x is compared instead."""
    if not point._forward_hooks or reads_only(point):
        return point(x), True
    if x.is_inference():
        before = x.clone()
        out = point(x)
        return out, out is x and torch.equal(out, before)
    version = x._version
    out = point(x)
    return out, out is x and x._version == version
