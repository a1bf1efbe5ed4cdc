"""Attention patterns of one head, a layer, or every head, as a tensor and as a long table."""
from __future__ import annotations

from typing import Optional, Union

import pandas as pd
import torch
from jaxtyping import Float

from sprout.names import act_name

from .._core.batching import TextOrTokens, token_rows
from .._core.model import HookedModel, heads_of, require_hooks, str_tokens

Selection = Optional[Union[int, list]]


@torch.inference_mode()
def pattern_tensor(model: HookedModel, data: TextOrTokens, layer: Selection = None,
                   head: Selection = None) -> Float[torch.Tensor, "layer head query_pos key_pos"]:
    """Attention patterns [n_layers_chosen, n_heads_chosen, query_pos, key_pos] for one sequence.

    `layer` and `head` are an int, a list, or None for all. Rows sum to 1; keys after the query are 0.
    """
    rows = token_rows(model, data)
    if len(rows) != 1:
        raise ValueError(f"attention patterns are for one sequence of at most {model.cfg.n_ctx} tokens; "
                         f"got {len(rows)} sequences/windows")
    layers, heads = heads_of(model, layer, head)
    names = [act_name("pattern", l) for l in layers]
    require_hooks(model, names)
    _, cache = model.run_with_cache(rows[0][None].to(model.cfg.device), names_filter=names)
    return torch.stack([cache[name][0, heads] for name in names]).float()


def attention_patterns(model: HookedModel, data: TextOrTokens, layer: Selection = None,
                       head: Selection = None) -> pd.DataFrame:
    """Attention patterns in long format, with the string tokens.

    Args:
        model: a hooked model.
        data: one text or ids [pos] / [1, pos] that fit the context.
        layer, head: an int, a list, or None for all.

    Returns:
        One row per (layer, head, query_pos, key_pos) with key_pos <= query_pos (the causal part; the
        rest is 0): `layer`, `head`, `query_pos`, `key_pos`, `query_token`, `key_token`, `weight`.
        The tensor itself is `pattern_tensor(model, data, layer, head)`.

    Example:
        >>> import torch, interp
        >>> from sprout import Sprout, SproutConfig
        >>> model = Sprout(SproutConfig(vocab_size=64, context=16, n_layer=2, n_head=2, d_model=32, d_ff=64))
        >>> df = interp.attention_patterns(model, torch.arange(4), layer=1, head=0)
        >>> len(df), round(float(df.groupby("query_pos").weight.sum().min()), 5)
        (10, 1.0)
    """
    pattern = pattern_tensor(model, data, layer, head)
    layers, heads = heads_of(model, layer, head)
    ids = token_rows(model, data)[0]
    toks = str_tokens(model, ids)
    T = len(toks)
    q, k = torch.tril_indices(T, T)  # causal (query, key) pairs, query-major
    cols: dict[str, list] = {c: [] for c in ("layer", "head", "query_pos", "key_pos", "query_token",
                                             "key_token", "weight")}
    qs, ks = q.tolist(), k.tolist()
    for i, l in enumerate(layers):
        for j, h in enumerate(heads):
            cols["layer"] += [l] * len(qs)
            cols["head"] += [h] * len(qs)
            cols["query_pos"] += qs
            cols["key_pos"] += ks
            cols["query_token"] += [toks[a] for a in qs]
            cols["key_token"] += [toks[b] for b in ks]
            cols["weight"] += pattern[i, j, q, k].tolist()
    return pd.DataFrame(cols)
