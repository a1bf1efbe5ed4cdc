"""The key-value cache of generation: TransformerLens' own `TransformerLensKeyValueCache` on our models.

Per layer the keys and values of every position seen so far, [batch, pos_so_far, head, d_head], and the
attention mask over them (`new_cache` makes one). `cache_masks` reads and extends it for the new positions
of a forward: their mask, their positions counting real tokens, and the attention mask over the whole
sequence.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator, Optional, Protocol

import torch
from jaxtyping import Bool, Int
from transformer_lens.cache.key_value_cache import TransformerLensKeyValueCache

from .text import check_attention_mask


def padding_masks(attention_mask: Int[torch.Tensor, "batch pos"]
                  ) -> tuple[Int[torch.Tensor, "batch pos"], Bool[torch.Tensor, "batch 1 pos pos"]]:
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


class Configured(Protocol):
    """What the cache reads of a model: its TransformerLens config (layers, heads, d_head, n_ctx, device)."""

    @property
    def cfg(self) -> Any: ...


def new_cache(model: Configured, batch_size: int = 1) -> TransformerLensKeyValueCache:
    """An empty TransformerLens key-value cache for `model` ([batch, 0, head, d_head] per layer)."""
    return TransformerLensKeyValueCache.init_cache(model.cfg, model.cfg.device, batch_size)


def cache_length(cache: TransformerLensKeyValueCache) -> int:
    return int(cache[0].past_keys.size(1))


def _check_cache(model, cache, batch: int) -> int:
    entries = getattr(cache, "entries", None)
    if entries is None or not hasattr(cache, "append_attention_mask"):
        raise TypeError(f"past_kv_cache must be a TransformerLensKeyValueCache (sprout.tl.kv_cache.new_cache(model, "
                        f"batch_size)), got {type(cache).__name__}")
    if len(entries) != model.cfg.n_layers:
        raise ValueError(f"past_kv_cache has {len(entries)} layers but the model has {model.cfg.n_layers}")
    lengths = sorted({int(e.past_keys.size(1)) for e in entries} | {int(e.past_values.size(1)) for e in entries})
    if len(lengths) > 1:
        raise ValueError(f"past_kv_cache is spoilt: its layers hold {lengths[0]}..{lengths[-1]} positions (a forward "
                         "that extended some blocks only, e.g. one stopped by an error); start a new cache with "
                         "sprout.tl.kv_cache.new_cache(model, batch_size)")
    keys = entries[0].past_keys
    want = (batch, model.cfg.n_heads, model.cfg.d_head)
    if (keys.size(0), keys.size(2), keys.size(3)) != want:
        raise ValueError(f"past_kv_cache holds keys of shape {tuple(keys.shape)}, but this input needs "
                         f"[{batch}, pos, {want[1]}, {want[2]}] (batch, pos, head, d_head)")
    past = keys.size(1)
    if cache.previous_attention_mask.shape != (batch, past):
        raise ValueError(f"past_kv_cache's attention mask has shape {tuple(cache.previous_attention_mask.shape)} "
                         f"but it holds {past} positions of a batch of {batch}")
    return past


def check_cache_layers(cache: TransformerLensKeyValueCache, start_at_layer: Optional[int], stop_at_layer: Optional[int],
                       n_layers: int) -> None:
    """A forward that grows a key-value cache runs every block, so that every layer's entry grows by the same
    positions: a stop before the last block, or a start after the first, is refused (a frozen cache, which
    is read and not grown, takes any range, as in TransformerLens)."""
    if getattr(cache, "frozen", False):
        return
    if stop_at_layer is not None and stop_at_layer < n_layers:
        raise ValueError(f"stop_at_layer={stop_at_layer} with past_kv_cache would extend the cache of blocks "
                         f"0..{stop_at_layer - 1} only; run the whole model with a cache, stop_at_layer without one, "
                         "or freeze the cache first (cache.freeze())")
    if start_at_layer:
        raise ValueError(f"start_at_layer={start_at_layer} with past_kv_cache would leave blocks 0..{start_at_layer - 1}"
                         "'s cache behind; run the whole model with a cache, start_at_layer without one, or "
                         "freeze the cache first (cache.freeze())")


@contextmanager
def all_or_nothing(cache: Optional[TransformerLensKeyValueCache]) -> Iterator[None]:
    """The cache as it was, restored, when the block is left by an exception (a hook raising, Ctrl-C):
    a forward extends every layer's entry and the mask, or none of them."""
    if cache is None:
        yield
        return
    entries = getattr(cache, "entries", None) or []
    saved = [(e.past_keys, e.past_values) for e in entries], getattr(cache, "previous_attention_mask", None)
    try:
        yield
    except BaseException:
        for e, (keys, values) in zip(entries, saved[0]):
            e.past_keys, e.past_values = keys, values
        if saved[1] is not None:
            cache.previous_attention_mask = saved[1]
        raise


def cache_masks(model: Configured, cache: TransformerLensKeyValueCache, attention_mask: Optional[Int[torch.Tensor, "batch _pos"]],
                ids: Int[torch.Tensor, "batch new_pos"]) -> tuple[Int[torch.Tensor, "batch new_pos"], Int[torch.Tensor, "batch new_pos"],
                                                                 Bool[torch.Tensor, "batch 1 new_pos all_pos"]]:
    """The new positions' mask, RoPE / learned positions and attention mask, reading and extending the cache.

    Args:
        ids: the new positions [batch, new_pos] (token ids, or the stream's first channel).
        attention_mask: the new positions' mask [batch, new_pos] (1 token, 0 padding), or the whole
            sequence's [batch, past + new_pos] (TransformerLens' input_to_embed returns that), or None.

    Returns:
        (mask [batch, new_pos], positions [batch, new_pos] counting real tokens of the whole sequence,
        attn_mask [batch, 1, new_pos, past + new_pos], True = may attend).
    """
    B, T = ids.shape
    past = _check_cache(model, cache, B)
    n_ctx = model.cfg.n_ctx
    if past + T > n_ctx:
        raise ValueError(f"past_kv_cache holds {past} positions and {T} more would make {past + T}, longer than the "
                         f"model's context of {n_ctx} tokens")
    if attention_mask is None:
        attention_mask = torch.ones(B, T, dtype=torch.long, device=ids.device)
    if past and attention_mask.dim() == 2 and attention_mask.shape == (B, past + T):
        # TransformerLens' input_to_embed hands back the whole mask, cached positions included
        full = check_attention_mask(attention_mask, torch.empty(B, past + T, device=ids.device))
        if not getattr(cache, "frozen", False):
            cache.previous_attention_mask = full.to(cache.previous_attention_mask)
        attention_mask = full[:, past:]
    else:
        attention_mask = check_attention_mask(attention_mask, ids)
        full = cache.append_attention_mask(attention_mask)
    keep = full.to(ids.device).bool()  # [batch, past + new]
    positions = (keep.long().cumsum(1) - 1).clamp(min=0)[:, past:]
    query = torch.arange(past, past + T, device=ids.device)[:, None]
    key = torch.arange(past + T, device=ids.device)[None, :]
    # As `padding_masks`: earlier real keys, and always itself, so no softmax row is empty.
    attn_mask = (key <= query) & (keep[:, None, :] | (key == query))
    return attention_mask, positions, attn_mask[:, None]
