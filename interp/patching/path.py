"""Path patching: the effect of one component on one head through that head's query, key or value input only.

Convention (Wang et al. 2022, "noising" by default). The base run is on the clean tokens. The sender
(a head, an MLP or the embedding) takes its value on the corrupted tokens; every other head's `hook_z`
and every MLP's `hook_mlp_out` stay frozen at their clean values, so the change reaches the receiver
only along the direct residual path. The receiver's q (or k or v) input in that run is recorded, and a
final clean run gets that recorded q (k, v) for the receiver head alone; everything downstream of the
receiver is recomputed. `effect` = metric(patched) - metric(clean): how much the metric moves when
this one edge carries corrupted information.

`direction="denoising"` swaps the roles: the base run is corrupted and the sender takes its clean
value. That is TransformerLens' `patching.get_act_patch_direct_path` (the sender's clean-minus-corrupted
write added to the receiver's own copy of the residual), and the values agree (tested).

Everything is read and written through hooks (`hook_z`, `hook_mlp_out`, `hook_embed`, `hook_q/k/v`),
so no weight matrix is needed. Recording runs one forward per chunk of senders, the patched runs one
forward per chunk of (sender, receiver) pairs (the batched engine, `interp._core.patch_engine`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Union

import pandas as pd
import torch

from sprout.names import act_name, layer_of

from .._core.inputs import TextOrTokens, masked
from .._core.metrics import Metric, check_metric, degenerate
from .._core.model import HookedModel, require_hooks
from .._core.patch_engine import batched_forward, batched_forward_from, by_layer, chunk_size, clean_and_corrupted, split_metric
from .._core.specs import VIA, Component, ComponentSpec, ComponentSpecs, HeadSpecs, as_component, as_components
from .._core.specs import all_heads as _all_heads

DIRECTIONS = ("noising", "denoising")
EMBED = act_name("embed")


# a sender or receiver (kind "head", "mlp" or "embed"); kept under its old name for callers of path_patching
Node = Component


def as_node(model: HookedModel, spec: ComponentSpec) -> Component:
    """"L1H2" or (1, 2) -> a head, "MLP1" -> an MLP, "embed" -> the embedding; checked against the model."""
    return as_component(model, spec)


def _z(l):
    return act_name("z", l)


def _mlp(l):
    return act_name("mlp_out", l)


def _input(l, via):
    return act_name(via, l)


def _source_name(node: Node) -> str:
    if node.kind == "embed":
        return EMBED
    return _z(node.layer) if node.kind == "head" else _mlp(node.layer)


def _freeze_hook(base: torch.Tensor, senders: list[Node], source: Optional[torch.Tensor]):
    """Frozen at the base value ([batch, ...]), except copy i's sender, which takes `source`."""
    def hook(act, hook):
        B = base.shape[0]
        out = base.repeat(len(senders), *([1] * (base.dim() - 1)))
        for i, s in enumerate(senders):
            if _source_name(s) == hook.name:
                assert source is not None  # hook.name is a sender's, so the caller gave its source
                rows = slice(i * B, (i + 1) * B)
                if s.kind == "head":
                    out[rows, :, s.head] = source[:, :, s.head]
                else:
                    out[rows] = source
        return out
    return hook


class _Recorded(Exception):
    """Raised by the last recording hook: nothing after the receivers' layer is needed."""


def _record(model: HookedModel, base_tokens, senders, base_cache, source_cache, receiver_layers, vias, mask) -> dict:
    """{(layer, via): receiver-layer input [n_senders * batch, pos, head, d_head]} with only the senders'
    direct paths changed. The forward stops at the last receiver input."""
    n, hooks, recorded = len(senders), [], {}
    sender_names = {_source_name(s) for s in senders}
    for l in range(max(receiver_layers)):
        for name in (_z(l), _mlp(l)):
            source = source_cache[name] if name in sender_names else None
            hooks.append((name, _freeze_hook(base_cache[name], senders, source)))
    if EMBED in sender_names:
        hooks.append((EMBED, _freeze_hook(base_cache[EMBED], senders, source_cache[EMBED])))
    wanted = {(l, via) for l in receiver_layers for via in vias}

    def keep(act, hook):
        recorded[layer_of(hook.name), hook.name[-1]] = act.clone()
        if len(recorded) == len(wanted):
            raise _Recorded
    hooks += [(_input(l, via), keep) for l, via in sorted(wanted)]
    try:
        model.run_with_hooks(base_tokens.repeat(n, 1), fwd_hooks=hooks, **masked(mask, n))
    except _Recorded:
        pass
    return recorded


def _replace_hook(pairs: list, recorded: torch.Tensor, sender_index: dict, B: int):
    def hook(act, hook):
        act = act.clone()
        for i, (s, r) in enumerate(pairs):
            j = sender_index[s]
            act[i * B:(i + 1) * B, :, r.head] = recorded[j * B:(j + 1) * B, :, r.head]
        return act
    return hook


def _pairs(senders: list[Node], receivers: list[Node]) -> list[tuple[Node, Node]]:
    for s in senders:
        if all(s.layer >= r.layer for r in receivers):
            where = "the embedding" if s.kind == "embed" else f"layer {s.layer}"
            raise ValueError(f"sender {s.label} is in {where}, at or above every receiver "
                             f"({', '.join(r.label for r in receivers)}): a sender must sit in an earlier layer")
    return [(s, r) for r in receivers for s in senders if s.layer < r.layer]


def _nodes(model: HookedModel, senders, receivers) -> tuple[list[Node], list[Node]]:
    senders, receivers = as_components(model, senders, "senders"), as_components(model, receivers, "receivers")
    bad = [r.label for r in receivers if r.kind != "head"]
    if bad:
        raise ValueError(f"receivers must be attention heads ('L{{layer}}H{{head}}'), got {bad[0]}")
    return list(dict.fromkeys(senders)), list(dict.fromkeys(receivers))


def _caches(model: HookedModel, base, source, receivers, vias, mask):
    last = max(r.layer for r in receivers)
    names = [n for l in range(last) for n in (_z(l), _mlp(l))] + [EMBED]
    require_hooks(model, names + [_input(r.layer, via) for r in receivers for via in vias])
    # the base run's stream into each receiver layer: the patched runs start there (nothing below it changes)
    starts = [n for n in dict.fromkeys(act_name("resid_pre", r.layer) for r in receivers) if n in model.hook_dict]
    _, base_cache = model.run_with_cache(base, names_filter=names + starts, **masked(mask))
    _, source_cache = model.run_with_cache(source, names_filter=names, **masked(mask))
    return base_cache, source_cache


@torch.inference_mode()
def path_patch(model: HookedModel, clean: TextOrTokens, corrupted: TextOrTokens, metric: Metric, senders: ComponentSpecs,
               receivers: HeadSpecs, via: Union[str, Sequence[str]] = "k",
               direction: str = "noising", batch_size: Optional[int] = None) -> pd.DataFrame:
    """The effect of each sender on each later receiver head through its `via` input alone.

    Args:
        model: a hooked model with hook_z, hook_mlp_out, hook_embed and hook_q/k/v.
        clean, corrupted: token ids [batch, pos] (or text; texts of unequal length are padded, and the
            metric sees NaN at padded positions) of the same shape and padding.
        metric: logits [batch, pos, d_vocab] -> a scalar, or [batch] (averaged).
        senders: components: "L{l}H{h}" or (l, h), "MLP{l}", "embed" (a list, or one).
        receivers: heads "L{l}H{h}" or (l, h) (a list, or one); each sender is paired with every
            receiver in a later layer, and a sender with none is an error.
        via: "q", "k" or "v": the receiver input the path goes through (or a list of them: one
            recording run serves them all).
        direction: "noising" (clean base run, corrupted sender) or "denoising" (corrupted base run,
            clean sender: TransformerLens' `get_act_patch_direct_path`).
        batch_size: (sender, receiver) pairs sharing one forward (default: as many as 256 MB of logits allow).

    Returns:
        One row per (sender, receiver): `sender`, `receiver`, `sender_layer`, `sender_head` (-1 for an
        MLP or the embedding, whose layer is -1), `receiver_layer`, `receiver_head`, `via`,
        `direction`, `metric` (patched), `base` (metric of the base run), `source` (metric of the other
        run), `effect` = metric - base, `recovered` = effect / (source - base).
        `frame.attrs["degenerate"]` is True (with a warning) when base and source metric are equal.

    Example:
        >>> import sprout, interp
        >>> model = sprout.load("gpt-4")
        >>> clean = interp.repeated_tokens(model, half_len=16, n_seqs=4)            # random tokens, twice
        >>> corrupted = interp.repeated_tokens(model, half_len=16, n_seqs=4, seed=1)  # nothing to copy
        >>> def metric(logits):  # mean log p of each second-copy token
        ...     return logits[:, 16:-1].log_softmax(-1).gather(-1, clean[:, 17:, None]).mean()
        >>> paths = interp.path_patch(model, clean, corrupted, metric, senders=["L1H2"], receivers=["L3H1"], via=["k", "v"])
        >>> paths.set_index("via")["effect"].round(1).to_dict()  # the previous-token head reaches L3H1 through its keys
        {'k': -0.4, 'v': -0.0}
    """
    vias = [via] if isinstance(via, str) else list(via)
    if not vias or any(v not in VIA for v in vias):
        raise ValueError(f"via must be one of {list(VIA)} (or a list of them), got {via!r}")
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {list(DIRECTIONS)}, got {direction!r}")
    # a direct path is a sender's write into the residual stream that a later head reads: a model (a
    # walkthrough step) without residual connections has none, and every effect would read 0
    require_hooks(model, [act_name("resid_pre", 0)])
    check_metric(metric)
    senders, receivers = _nodes(model, senders, receivers)
    pairs = _pairs(senders, receivers)
    clean, corrupted, mask = clean_and_corrupted(model, clean, corrupted)
    base, source = (clean, corrupted) if direction == "noising" else (corrupted, clean)
    base_cache, source_cache = _caches(model, base, source, receivers, vias, mask)
    layers = sorted({r.layer for r in receivers})
    recorded = _record(model, base, senders, base_cache, source_cache, layers, vias, mask)
    base_value, source_value = (split_metric(metric, model.run_with_hooks(ids, **masked(mask)), 1, mask)[0]
                                for ids in (base, source))
    frames = [_frame(pairs, _patched_values(model, base, base_cache, metric, pairs, recorded, senders, v, batch_size, mask),
                     v, direction, base_value, source_value) for v in vias]
    frame = pd.concat(frames, ignore_index=True)
    frame.attrs["degenerate"] = degenerate(base_value, source_value, "base and source")
    return frame


def _patched_values(model: HookedModel, base, base_cache, metric, pairs, recorded, senders, via, limit, mask) -> list[float]:
    sender_index = {s: i for i, s in enumerate(senders)}
    n_max, B = chunk_size(model, base, limit), base.shape[0]
    values: dict[tuple, float] = {}  # (sender, receiver) -> metric
    grouped = by_layer([_Pair(s, r) for s, r in pairs])
    for layer, group in grouped.items():
        for start in range(0, len(group), n_max):
            chunk = [(p.sender, p.receiver) for p in group[start:start + n_max]]
            hook = _replace_hook(chunk, recorded[layer, via], sender_index, B)
            hooks, resid = [(_input(layer, via), hook)], act_name("resid_pre", layer)
            # every copy runs the unpatched base below the receiver's layer: those layers run once, in `base_cache`
            logits = (batched_forward_from(model, base_cache[resid], layer, hooks, len(chunk), mask) if resid in base_cache
                      else batched_forward(model, base, hooks, len(chunk), mask))
            values.update(zip(chunk, split_metric(metric, logits, len(chunk), mask)))
    return [values[p] for p in pairs]


@dataclass(frozen=True)
class _Pair:
    sender: Node
    receiver: Node

    @property
    def layer(self) -> int:
        return self.receiver.layer


def _frame(pairs, values, via, direction, base_value, source_value) -> pd.DataFrame:
    frame = pd.DataFrame({
        "sender": [s.label for s, _ in pairs], "receiver": [r.label for _, r in pairs],
        "sender_layer": [s.layer for s, _ in pairs], "sender_head": [s.head for s, _ in pairs],
        "receiver_layer": [r.layer for _, r in pairs], "receiver_head": [r.head for _, r in pairs],
        "via": via, "direction": direction, "metric": values,
    })
    frame["base"], frame["source"] = base_value, source_value
    frame["effect"] = frame["metric"] - base_value
    span = source_value - base_value
    frame["recovered"] = frame["effect"] / span if span != 0 else float("nan")
    return frame


def all_heads(model: HookedModel, below: Optional[int] = None) -> list[str]:
    """Labels "L{l}H{h}" of every head (in layers below `below`, when given)."""
    return [h.label for h in _all_heads(model, below)]

