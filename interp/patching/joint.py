"""Joint path patching: a set of senders corrupted together, on one receiver head through one input.

Heads that do the same job are redundant: noising one of three previous-token heads leaves the other
two delivering the previous token, so each alone carries a small share of an induction head's key
path, while the three together carry most of it. `joint_path_patch` measures the effect of sets of
senders; `greedy_feeders` finds the smallest set that carries most of the effect by greedy forward
selection and gives each member's marginal share (the effect lost when it alone leaves the set).

Convention as in `path_patch` (noising): the base run is clean; every head in the set takes its
corrupted output, every other head and every MLP stays at its clean value, so the change reaches the
receiver only along the direct residual paths. The receiver's q (k, v) input is then its own block
read from the clean stream plus the set's corrupted-minus-clean writes (`attn.hook_result`), and that
input is patched into a clean run for the receiver head alone. Only the receiver's block and those
above it run per set. A set of one sender gives `path_patch`'s effect (tested).
"""
from __future__ import annotations

from typing import Optional, Sequence

import pandas as pd
import torch

from sprout.names import act_name

from .._core.inputs import TextOrTokens
from .._core.metrics import Metric, metric_value
from .._core.model import HookedModel, require_hooks
from .._core.patch_engine import batched_forward_from, chunk_size, clean_and_corrupted, split_metric
from .._core.specs import VIA, HeadSpec, all_heads
from .path import _input, _Recorded, as_node


def _result(l: int) -> str:
    return act_name("result", l)


def _streams(model: HookedModel, clean, corrupted, receiver):
    """The clean stream into the receiver's block [batch, pos, d_model], and every earlier head's
    corrupted-minus-clean write {layer: [batch, pos, head, d_model]}."""
    start = act_name("resid_pre", receiver.layer)
    names = [_result(l) for l in range(receiver.layer)]
    require_hooks(model, names + [start, _input(receiver.layer, "q")])
    _, clean_cache = model.run_with_cache(clean, names_filter=names + [start])
    _, corrupted_cache = model.run_with_cache(corrupted, names_filter=names)
    return clean_cache[start], {l: corrupted_cache[_result(l)] - clean_cache[_result(l)] for l in range(receiver.layer)}


def _recorded_input(model: HookedModel, resid, delta, sets, receiver, via) -> torch.Tensor:
    """The receiver layer's `via` input [n_sets * batch, pos, head, d_head] when the stream carries each
    set's corrupted-minus-clean writes. With every other head and every MLP frozen at its clean value,
    that is exactly the stream the receiver's input reads: the sets' direct paths alone."""
    stream = resid.repeat(len(sets), 1, 1)
    B = resid.shape[0]
    for i, group in enumerate(sets):
        for s in group:
            stream[i * B:(i + 1) * B] += delta[s.layer][:, :, s.head]
    recorded = {}

    def keep(act, hook):
        recorded["x"] = act.clone()
        raise _Recorded  # the rest of the block is not needed
    try:
        model.run_with_hooks(stream, start_at_layer=receiver.layer, stop_at_layer=receiver.layer + 1,
                             fwd_hooks=[(_input(receiver.layer, via), keep)])
    except _Recorded:
        pass
    return recorded["x"]


def _sets(model: HookedModel, sets, receiver) -> list[list]:
    out = []
    for group in sets:
        nodes = list(dict.fromkeys(as_node(model, s) for s in ([group] if isinstance(group, str) else group)))
        bad = [n.label for n in nodes if n.kind != "head" or n.layer >= receiver.layer]
        if bad:
            raise ValueError(f"joint senders must be heads in layers below the receiver {receiver.label}, got {bad[0]}")
        out.append(nodes)
    return out


@torch.inference_mode()
def joint_path_patch(model: HookedModel, clean: TextOrTokens, corrupted: TextOrTokens, metric: Metric, sets: list,
                     receiver: HeadSpec, via: str = "k",
                     batch_size: Optional[int] = None) -> pd.DataFrame:
    """The effect of each set of sender heads, corrupted together, on `receiver` through its `via` input.

    Args:
        clean, corrupted: token ids [batch, pos] (or text) of the same shape.
        metric: logits [batch, pos, d_vocab] -> a scalar, or [batch] (averaged).
        sets: a list of sets of heads, each a list of "L{l}H{h}" or (l, h) in layers below the receiver
            (an empty set has effect 0).
        receiver: the receiving head, "L{l}H{h}" or (l, h).
        via: "q", "k" or "v".
        batch_size: sets sharing one forward (default: as many as 256 MB of logits allow).

    Returns:
        One row per set: `set` ("L1H2+L2H2"), `size`, `receiver` (and its `receiver_layer`,
        `receiver_head`), `via`, `metric`, `base` (clean metric),
        `source` (corrupted metric), `effect` = metric - base, `share` = effect / (source - base).

    Example:
        >>> import sprout, interp
        >>> model = sprout.load("gpt-4")
        >>> clean = interp.repeated_tokens(model, half_len=16, n_seqs=4)            # random tokens, twice
        >>> corrupted = interp.repeated_tokens(model, half_len=16, n_seqs=4, seed=1)  # nothing to copy
        >>> def metric(logits):  # mean log p of each second-copy token
        ...     return logits[:, 16:-1].log_softmax(-1).gather(-1, clean[:, 17:, None]).mean()
        >>> joint = interp.patching.joint_path_patch(model, clean, corrupted, metric, [["L1H2"], ["L1H2", "L1H0"]], "L3H1")
        >>> joint["set"].tolist(), bool(joint["share"].iloc[1] > joint["share"].iloc[0])
        (['L1H2', 'L1H2+L1H0'], True)
    """
    return _Runs(model, clean, corrupted, metric, receiver, via).frame(sets, batch_size)


class _Runs:
    """One (clean, corrupted, metric, receiver, via) checked, with the runs every set shares (the clean
    stream into the receiver's block, the earlier heads' writes, the clean and corrupted metric) done
    once: `greedy_feeders` measures many lists of sets on them."""

    def __init__(self, model: HookedModel, clean: TextOrTokens, corrupted: TextOrTokens, metric: Metric,
                 receiver: HeadSpec, via: str) -> None:
        if via not in VIA:
            raise ValueError(f"via must be one of {list(VIA)}, got {via!r}")
        receiver = as_node(model, receiver)
        if receiver.kind != "head":
            raise ValueError(f"the receiver must be an attention head ('L{{layer}}H{{head}}'), got {receiver.label}")
        clean, corrupted, mask = clean_and_corrupted(model, clean, corrupted)
        if mask is not None:  # the recorded inputs are replayed from the stream without a mask
            raise ValueError("joint_path_patch needs clean and corrupted rows of equal length (no padding); "
                             "patch texts of one length, or one text at a time")
        self.model, self.clean, self.corrupted, self.metric, self.receiver, self.via = model, clean, corrupted, metric, receiver, via
        self._shared: Optional[tuple] = None

    @torch.inference_mode()
    def frame(self, sets: list, batch_size: Optional[int] = None) -> pd.DataFrame:
        model, clean, corrupted, metric, receiver, via = (self.model, self.clean, self.corrupted, self.metric,
                                                          self.receiver, self.via)
        groups = _sets(model, sets, receiver)
        if self._shared is None:
            resid, delta = _streams(model, clean, corrupted, receiver)
            self._shared = (resid, delta, metric_value(metric, model.run_with_hooks(clean)),
                            metric_value(metric, model.run_with_hooks(corrupted)))
        resid, delta, base, source = self._shared
        n_max, values = chunk_size(model, clean, batch_size), []
        for a in range(0, len(groups), n_max):
            chunk = groups[a:a + n_max]
            recorded = _recorded_input(model, resid, delta, chunk, receiver, via)

            def replace(act, hook, recorded=recorded):
                act = act.clone()
                act[:, :, receiver.head] = recorded[:, :, receiver.head]
                return act
            logits = batched_forward_from(model, resid, receiver.layer, [(_input(receiver.layer, via), replace)], len(chunk))
            values += split_metric(metric, logits, len(chunk))
        frame = pd.DataFrame({"set": ["+".join(n.label for n in g) for g in groups], "size": [len(g) for g in groups],
                              "receiver": receiver.label, "receiver_layer": receiver.layer, "receiver_head": receiver.head,
                              "via": via, "metric": values})
        frame["base"], frame["source"] = base, source
        frame["effect"] = frame["metric"] - base
        frame["share"] = frame["effect"] / (source - base) if source != base else float("nan")
        return frame


def greedy_feeders(model: HookedModel, clean: TextOrTokens, corrupted: TextOrTokens, metric: Metric, receiver: HeadSpec,
                   via: str = "k", candidates: Optional[Sequence[HeadSpec]] = None,
                   threshold: float = 0.8, max_size: Optional[int] = None) -> pd.DataFrame:
    """The smallest set of feeders that carries most of the effect, by greedy forward selection.

    The target is `threshold` times the share of all `candidates` patched together. Starting from the
    empty set, each step adds the candidate whose addition gives the largest joint share, until the
    set reaches the target (or `max_size` members, or no candidate is left). Greedy selection is not
    guaranteed to find the smallest such set, only a small one; each member's `marginal_share` (the
    joint share lost when it alone is removed) says whether it is needed given the others.

    Args:
        candidates: sender heads (default: every head in a layer below the receiver).
        threshold: fraction of all candidates' joint share the set must reach, in (0, 1].

    Returns:
        One row per member, in the order chosen: `receiver`, `via`, `sender`, `order` (1, 2, ...),
        the heads as integers (`receiver_layer`, `receiver_head`, `sender_layer`, `sender_head`),
        `own_share` (the member alone), `cumulative_share` (the set up to this member),
        `marginal_share`, `joint_share` (the whole set), `all_share` (all candidates together),
        `target` (threshold x all_share), `reached` (the set reached the target). No rows when all
        candidates together carry no positive share.
    """
    if not 0 < threshold <= 1:
        raise ValueError(f"threshold must be in (0, 1], got {threshold}")
    receiver = as_node(model, receiver)
    pool = [as_node(model, c).label for c in candidates] if candidates is not None else \
        [h.label for h in all_heads(model, below=receiver.layer)]

    runs = _Runs(model, clean, corrupted, metric, receiver, via)  # the runs every list of sets shares, done once

    def shares(sets):  # joint_path_patch's shares
        return runs.frame(sets)["share"].tolist()
    first = shares([[c] for c in pool] + [pool])
    own, all_share = dict(zip(pool, first[:-1])), first[-1]
    if not all_share > 0:
        return pd.DataFrame(columns=GREEDY_COLUMNS)
    target = threshold * all_share
    chosen: list = []
    cumulative: list[float] = []
    step = dict(own)
    while step and (not cumulative or cumulative[-1] < target) and (max_size is None or len(chosen) < max_size):
        best = max(step, key=lambda c: step[c])
        chosen.append(best)
        cumulative.append(step[best])
        rest = [c for c in pool if c not in chosen]
        step = dict(zip(rest, shares([chosen + [c] for c in rest]))) if rest and cumulative[-1] < target else {}
    joint = cumulative[-1]
    without = shares([[m for m in chosen if m != c] for c in chosen]) if len(chosen) > 1 else [0.0]
    heads = [as_node(model, c) for c in chosen]
    return pd.DataFrame({"receiver": receiver.label, "via": via, "sender": chosen, "order": range(1, len(chosen) + 1),
                         "receiver_layer": receiver.layer, "receiver_head": receiver.head,
                         "sender_layer": [h.layer for h in heads], "sender_head": [h.head for h in heads],
                         "own_share": [own[c] for c in chosen], "cumulative_share": cumulative,
                         "marginal_share": [joint - w for w in without], "joint_share": joint, "all_share": all_share,
                         "target": target, "reached": joint >= target})


GREEDY_COLUMNS = ["receiver", "via", "sender", "order", "receiver_layer", "receiver_head", "sender_layer", "sender_head",
                  "own_share", "cumulative_share", "marginal_share", "joint_share", "all_share", "target", "reached"]
