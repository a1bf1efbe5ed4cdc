"""What every hooked language model here shares: HookedTransformer's forward contract and TransformerLens'
run_with_* entry points (thread-safe, with checked hooks); the text methods are `text_io.TextIO`'s.

A model subclasses `HookedLM` and defines `run_layers(x, attn_mask, positions, start_at_layer,
stop_at_layer, past_kv_cache)`: the layers alone. `forward` reads TransformerLens' arguments (`sprout.tl.forward`).
"""
from __future__ import annotations

import threading
import warnings
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, Optional, cast

import torch
from transformer_lens.hook_points import HookPoint
from transformer_lens.HookedRootModule import HookedRootModule

from . import generation, text
from .activation_cache import SproutActivationCache
from .forward import check_loss_tokens, check_resid, check_return_type, finish, layer_range, tl_loss
from .hook_checks import cache_hooks, check_buffers, checked_hook, copy_into_buffer, unknown_hook
from .recycle import CacheRecycler
from .text_io import TextIO, TextOrTokens


def hooked(*points: HookPoint) -> bool:
    """Whether any of these hook points has a forward or backward hook attached right now."""
    return any(p._forward_hooks or p._backward_hooks for p in points)


def follow_weights(model):
    """Set `model.cfg.device` and `.dtype` to the embedding's: what `_apply` (every `.to()`, `.cuda()`,
    `.half()`) calls after moving or casting the weights, so reading `cfg` never changes anything."""
    model.cfg.device, model.cfg.dtype = str(model.embed.weight.device), model.embed.weight.dtype
    return model


def _not_attn_result(name: str) -> bool:
    return not name.endswith("attn.hook_result")


def _selects(names_filter, name: str) -> bool:
    """Whether TransformerLens' names_filter (a name, a list of names or a predicate) selects `name`."""
    if isinstance(names_filter, str):
        return name == names_filter
    if isinstance(names_filter, list):
        return name in names_filter
    return bool(names_filter(name))


def padding_masks(attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """attention_mask [batch, pos] (1 = token, 0 = padding) -> (positions [batch, pos], attn_mask [batch, 1, pos, pos]).

    Each real token's position counts real tokens only, so left padding does not shift positions.
    A query may attend to earlier real keys and to itself: padded keys get no attention from any other
    position, and a padded query (which no one reads) attends to itself, so no row is empty (an empty
    softmax row is NaN, and NaN times a zero weight would still reach real positions).
    """
    keep = attention_mask.bool()
    T = keep.size(1)
    positions = (keep.long().cumsum(1) - 1).clamp(min=0)
    causal = torch.ones(T, T, dtype=torch.bool, device=keep.device).tril()
    diagonal = torch.eye(T, dtype=torch.bool, device=keep.device)
    return positions, (causal & (keep[:, None, :] | diagonal))[:, None]


def _show_user_hook(points, checked, hook) -> None:
    """`list_hooks()` reports the user's own function, not the shape-checking wrapper around it."""
    for point in points:
        for handle in point.fwd_hooks + point.bwd_hooks:
            if handle.user_hook is checked:
                handle.user_hook = hook


class HookedLM(TextIO, HookedRootModule):
    """A HookedRootModule with TransformerLens' forward contract (see `sprout.tl.forward`).

    Subclasses set `self.config`, `self.cfg` (its `transformer_lens_config()`, which their blocks read
    for the hook flags), `self.embed`, `self.tokenizer`, build their layers, define `run_layers`, then
    call `self.setup()`.

    Threads: one lock per model. `hooks()`, `run_with_hooks`, `run_with_cache` and a plain call
    `model(...)` hold it, so two threads never see each other's hooks or activations; the second waits.
    """

    if TYPE_CHECKING:  # what the subclasses build (see above)
        config: Any  # SproutConfig or WalkthroughConfig
        blocks: torch.nn.ModuleList
        run_layers: Callable[..., torch.Tensor]

    cache_recycler: CacheRecycler  # the last cache's memory, reused by the next (`sprout.tl.recycle`)

    def __init__(self, *args):
        super().__init__(*args)
        self._lock = threading.RLock()
        self.cache_recycler = CacheRecycler()

    def __getstate__(self):
        state = self.__dict__.copy()
        state.pop("_lock", None)
        state.pop("cache_recycler", None)
        return state

    def __setstate__(self, state):
        super().__setstate__(state)
        self._lock = threading.RLock()
        self.cache_recycler = CacheRecycler()

    def _apply(self, fn, recurse: bool = True):
        if "cache_recycler" in self.__dict__:  # (not yet during nn.Module's own set-up) caches of the old
            self.cache_recycler.release()  # device or dtype would only hold memory the next cache cannot reuse
        return follow_weights(super()._apply(fn, recurse))

    def __call__(self, *args, **kwargs):
        with self._lock:
            return super().__call__(*args, **kwargs)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    # --- forward ----------------------------------------------------------------------------------

    def forward(self, input: TextOrTokens, return_type: Optional[str] = "logits", loss_per_token: bool = False,
                prepend_bos: Optional[bool] = None, padding_side: Optional[str] = None,
                start_at_layer: Optional[int] = None, tokens: Optional[torch.Tensor] = None,
                shortformer_pos_embed=None, attention_mask: Optional[torch.Tensor] = None,
                stop_at_layer: Optional[int] = None, past_kv_cache=None, *,
                targets: Optional[torch.Tensor] = None, loss_mask: Optional[torch.Tensor] = None):
        """Token ids [batch, pos] (or text, or a list of texts) through the model, as HookedTransformer.

        `model(tokens)` is the logits [batch, pos, vocab], a plain Tensor; `return_type` "logits",
        "loss" (position t predicts token t + 1; with `targets=` [batch, pos] model.py's loss of every
        position against its target, `loss_mask=` weighting them), "both" (logits, loss) or None;
        `loss_per_token`; `attention_mask` [batch, pos] (1 token, 0 padding; texts of unequal length
        are padded and masked on their own); `prepend_bos` (text only, as in TransformerLens:
        `<|endoftext|>` first; default `model.cfg.default_prepend_bos`); `padding_side`;
        `past_kv_cache` (a `TransformerLensKeyValueCache`, `sprout.tl.generation`: the input is the
        positions after the cached ones, and is appended to it); `start_at_layer=S` (input is then the
        stream entering block S [batch, pos, d_model], checked; `tokens=` its ids for a loss);
        `stop_at_layer=L` returns the stream leaving block L-1 [batch, pos, d_model], firing no
        `blocks.L.*` hook; negative layers count from the end.
        The course's `logits, loss = model(idx, targets)` is `sprout.model.GPT`'s (`GPT.from_sprout`).
        """
        check_return_type(return_type, targets, loss_mask)
        start_at_layer, stop_at_layer = layer_range(len(self.blocks), start_at_layer, stop_at_layer)
        if start_at_layer is not None:
            x = check_resid(input, self.cfg, start_at_layer)
            idx = None if tokens is None else text.check_tokens(self, tokens)
            if idx is not None:
                check_loss_tokens(idx, x)
        elif isinstance(input, torch.Tensor) and prepend_bos is None:
            idx = x = text.check_tokens(self, input)  # the fast path: ids in
        else:
            if isinstance(input, (str, list, tuple)):
                idx, padded = text.tokens_and_mask(self, input, prepend_bos, padding_side)
            else:
                text.check_prepend_bos(self, prepend_bos)
                idx, padded = text.check_tokens(self, input), None
            attention_mask = padded if attention_mask is None else attention_mask
            x = idx
        if shortformer_pos_embed is not None:
            raise ValueError("shortformer_pos_embed is for shortformer models; this model has no positional stream to add")
        if attention_mask is None and idx is not None and isinstance(input, torch.Tensor) and (
                past_kv_cache is not None or padding_side == "left"):
            # TransformerLens reads the padding off the pad token here (a cache, or left padding asked for)
            attention_mask = text.mask_from_padding(self, idx, padding_side, prepend_bos)
        positions = attn_mask = None
        if past_kv_cache is not None:
            attention_mask, positions, attn_mask = generation.cache_masks(
                self, past_kv_cache, attention_mask, x[..., 0] if start_at_layer is not None else cast(torch.Tensor, idx))
        elif attention_mask is None and targets is None and idx is not None:
            text.warn_if_left_padded(self, idx)
        if attention_mask is not None and past_kv_cache is None:
            # idx is None only with start_at_layer (the branches above)
            attention_mask = text.check_attention_mask(
                attention_mask, x[..., 0] if start_at_layer is not None else cast(torch.Tensor, idx))
            positions, attn_mask = padding_masks(attention_mask)
        out = self.run_layers(x, attn_mask, positions, start_at_layer, stop_at_layer, past_kv_cache)
        if stop_at_layer is not None:
            return out
        return finish(out, idx, targets, loss_mask, attention_mask, return_type, loss_per_token)

    def input_to_embed(self, input: TextOrTokens, prepend_bos: Optional[bool] = None, padding_side: Optional[str] = None,
                       attention_mask: Optional[torch.Tensor] = None):
        """TransformerLens 4.3's input_to_embed: `(residual, tokens, None, attention_mask)`, the stream
        entering block 0 [batch, pos, d_model] (the embedding; RoPE adds no positional stream, hence the
        None where a shortformer model returns one), the ids [batch, pos] and the padding mask or None.
        `model(residual, start_at_layer=0, attention_mask=attention_mask)` resumes the forward."""
        if isinstance(input, (str, list, tuple)):
            tokens, padded = text.tokens_and_mask(self, input, prepend_bos, padding_side)
            attention_mask = padded if attention_mask is None else attention_mask
        else:
            tokens = text.check_tokens(self, input)  # ids in: prepend_bos does not apply, as in TransformerLens
        residual = self(tokens, stop_at_layer=0, attention_mask=attention_mask, return_type="logits")
        return residual, tokens, None, attention_mask

    def loss_fn(self, logits: torch.Tensor, tokens: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                per_token: bool = False) -> torch.Tensor:
        """TransformerLens' loss: mean cross-entropy of each next token (per_token: [batch, pos - 1])."""
        tokens = text.as_ids(tokens)
        return tl_loss(logits, tokens.long(), attention_mask, per_token)

    # --- hooks ------------------------------------------------------------------------------------

    @contextmanager
    def hooks(self, fwd_hooks=[], bwd_hooks=[], reset_hooks_end: bool = True, clear_contexts: bool = False):
        """TransformerLens' hooks() context, holding this model's lock until it exits.

        Hooks are active for every forward of this model in this thread until the `with` block ends,
        including in a generator suspended inside it; other threads wait for the block to end.
        """
        with self._lock, super().hooks(fwd_hooks, bwd_hooks, reset_hooks_end, clear_contexts) as model:
            yield model

    def _enable_hook(self, name, hook, dir):
        if isinstance(name, str):
            self._known_hook(name)
        checked = checked_hook(hook, dir)
        super()._enable_hook(name, checked, dir)
        points = [self.mod_dict[name]] if isinstance(name, str) else self.hook_dict.values()
        _show_user_hook(points, checked, hook)

    def _known_hook(self, name: str) -> None:
        if name not in self.mod_dict or not isinstance(self.mod_dict[name], HookPoint):
            raise unknown_hook(name, self.hook_dict)

    def add_hook(self, name, hook, dir="fwd", is_permanent=False, level=None, prepend=False):
        if isinstance(name, str):
            self._known_hook(name)
        super().add_hook(name, hook, dir=dir, is_permanent=is_permanent, level=level, prepend=prepend)

    def check_and_add_hook(self, hook_point, hook_point_name, hook, dir="fwd", is_permanent=False, level=None,
                           prepend=False):
        checked = checked_hook(hook, dir)
        super().check_and_add_hook(hook_point, hook_point_name, checked, dir, is_permanent, level, prepend)
        _show_user_hook([hook_point], checked, hook)

    def get_caching_hooks(self, names_filter=None, incl_bwd: bool = False, device=None, remove_batch_dim: bool = False,
                          cache: Optional[dict] = None, pos_slice=None):
        """TransformerLens' caching hooks, except that `pos_slice` slices every hook on its position axis."""
        self.is_caching = True
        recycler = self.cache_recycler if self.cache_recycler.active else None
        return cache_hooks(self.hook_dict, names_filter, incl_bwd, device, remove_batch_dim, cache, pos_slice,
                           gated=self._gated_flag, recycler=recycler)

    def _gated_flag(self, name: str) -> Optional[str]:
        """The flag (off) without which hook point `name` never fires; None here (see `sprout.tl.hook_flags`)."""
        return None

    def run_with_cache(self, *model_args, **kwargs):
        """Run and cache activations: `logits, cache = model.run_with_cache(tokens_or_text)`.

        Returns forward's output (as `forward` documents: the logits, or what `return_type` asks for)
        and an `ActivationCache`. `names_filter` selects hooks; `pos_slice` keeps those positions of every
        activation; `incl_bwd=True` also caches the loss's gradient at each hook as `<name>_grad` (pass
        `return_type="loss"` or "both"), leaving the parameters' `.grad` as they were.

        As in TransformerLens, caching everything (no `names_filter`) leaves out each head's separate
        write to the stream, `attn.hook_result` [batch, pos, head, d_model], unless
        `model.cfg.use_attn_result` is True: it is n_head times the size of the stream, costs an extra
        pass per layer (measured: 16% of the memory and ~7% of the time of a full Sprout cache), and
        TransformerLens rebuilds it from `hook_z` and `W_O` when asked (`cache.stack_head_results`).
        Name it in `names_filter` to cache it anyway.

        Memory: the model keeps the tensors of its last cache and lets go of them one by one while the
        next is filled, so the next reuses their memory instead of page-faulting it in anew (measured:
        a full cache 1.1-1.2x the plain forward on one thread, 1.6-1.8x without; `sprout.tl.recycle`).
        `model.cache_recycler.release()` frees a dropped cache at once; `.max_bytes = 0` turns it off.
        """
        names_filter = kwargs.get("names_filter")
        if names_filter is None and not getattr(self.cfg, "use_attn_result", False):
            kwargs["names_filter"] = _not_attn_result
        if names_filter is not None and not any(_selects(names_filter, name) for name in self.hook_dict):
            shown = "" if callable(names_filter) else f" {names_filter!r}"
            warnings.warn(f"names_filter{shown} matched none of the model's {len(self.hook_dict)} hook points, "
                          "so the cache will be empty (names look like 'blocks.0.hook_resid_post'; "
                          "model.hook_dict lists them all)", stacklevel=2)
        if isinstance(names_filter, (str, list, tuple, set)):
            named = [names_filter] if isinstance(names_filter, str) else list(names_filter)
            off = [(n, self._gated_flag(n)) for n in named if isinstance(n, str) and self._gated_flag(n)]
            if off:
                warnings.warn(f"names_filter names {off[0][0]!r}, which fires only with model.cfg.{off[0][1]} on, so "
                              f"the cache will not hold it: call model.set_{off[0][1]}(True) first", stacklevel=2)
        batched = not kwargs.get("remove_batch_dim", False)
        with self._lock:
            if kwargs.get("incl_bwd"):
                out, cache = self._run_with_cache_and_grads(model_args, dict(kwargs))
            else:
                with self.cache_recycler.cycle():
                    out, cache = super().run_with_cache(*model_args, **kwargs)
        return out, SproutActivationCache(cache, self, has_batch_dim=batched)

    def _run_with_cache_and_grads(self, model_args, kwargs):
        # TransformerLens calls `.backward()` on the output, which fills every parameter's .grad;
        # torch.autograd.grad runs the same backward (firing the same backward hooks) and leaves .grad alone.
        options = {k: kwargs.pop(k) for k in ("names_filter", "device", "remove_batch_dim", "pos_slice") if k in kwargs}
        reset, clear = kwargs.pop("reset_hooks_end", True), kwargs.pop("clear_contexts", False)
        kwargs.pop("incl_bwd")
        cache, fwd, bwd = self.get_caching_hooks(incl_bwd=True, **options)
        with self.hooks(fwd_hooks=fwd, bwd_hooks=bwd, reset_hooks_end=reset, clear_contexts=clear):
            out = self(*model_args, **kwargs)
            loss = out[1] if isinstance(out, tuple) else out
            if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
                raise ValueError("run_with_cache(incl_bwd=True) caches gradients of the loss: pass return_type='loss' "
                                 "(or 'both'; with targets=... for model.py's loss)")
            params = [p for p in self.parameters() if p.requires_grad]
            if not loss.requires_grad or not params:
                raise ValueError("run_with_cache(incl_bwd=True) needs gradients: the parameters do not require grad "
                                 "or autograd is off (torch.no_grad / inference_mode)")
            torch.autograd.grad(loss, params, allow_unused=True)
        return out, cache

    def run_with_hooks(self, *model_args, **kwargs):
        """Run with temporary hooks (removed afterwards, even if the forward raises); output as forward's."""
        return super().run_with_hooks(*model_args, **kwargs)

    def run_with_cache_into(self, tokens: torch.Tensor, buffers: dict, **forward_kwargs):
        """Run, copying each named activation into a preallocated buffer instead of a new tensor.

        For streaming analyses over many batches: `buffers` maps hook names to floating-point tensors
        with as many axes as the activations and each at least as long ([batch, pos, ...]); each is
        filled in `[:batch, :pos]`. A buffer too small or of an integer dtype is an error naming the hook.
        Returns forward's output.
        """
        check_buffers(self.hook_dict, buffers)
        hooks = [(name, copy_into_buffer(buffers[name], name)) for name in buffers]
        return self.run_with_hooks(tokens, fwd_hooks=hooks, **forward_kwargs)
