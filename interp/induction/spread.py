"""The induction circuit measured over a spread of settings, and what holds at every one of them.

A share measured once (one seed, one length, one kind of text) can be an accident of that setting.
`circuit_spread` measures every earlier head's own share and the joint sets of `interp.patching.joint` for each
induction head and input on several settings: repeated random tokens of several seeds and lengths
(2x16 ... 2x64 tokens) and held-out name stories of several seeds. `spread_ranges` turns that into
ranges; `spread_sentences` states only what holds at every setting (and says how often the rest did).
"""
from __future__ import annotations

from typing import Optional, Sequence

import pandas as pd

from .._core.model import HookedModel
from .._core.specs import VIA, all_heads, as_head, head_label
from ..patching import GREEDY_COLUMNS, greedy_feeders, path_patch
from .circuit import find_induction_heads, induction_metric, repeated_pair, story_pair

SPREAD_COLUMNS = ["data", "seed", "length", "receiver", "via", "sender", "own_share", "joint_order", "marginal_share",
                  "joint_share", "all_share"]


def _settings(model: HookedModel, seeds, half_lens, story_seeds, n_seqs, n_stories, story_len):
    n_ctx = int(model.cfg.n_ctx)
    for seed in seeds:
        for half in sorted({min(h, n_ctx // 2) for h in half_lens}):
            yield "repeated", seed, repeated_pair(model, half_len=half, n_seqs=n_seqs, seed=seed)
    for seed in story_seeds:
        pair = story_pair(model, n_stories=n_stories, max_len=story_len, seed=seed)
        if pair is not None:
            yield "stories", seed, pair


def _one_setting(model: HookedModel, receivers, pair, threshold, max_candidates) -> pd.DataFrame:
    clean, corrupted = pair
    metric = induction_metric(clean)
    top = max(as_head(model, r).layer for r in receivers)
    senders = [h.label for h in all_heads(model, below=top)]
    own = path_patch(model, clean, corrupted, metric, senders, receivers, via=VIA)
    own["own_share"] = own["effect"] / (own["source"] - own["base"])
    joint = []
    for (receiver, via), rows in own.groupby(["receiver", "via"], sort=False):
        pool = rows.sort_values("own_share", ascending=False)["sender"].head(max_candidates or len(rows)).tolist()
        joint.append(greedy_feeders(model, clean, corrupted, metric, receiver, via, pool, threshold=threshold))
    joint = pd.concat([j for j in joint if len(j)] or [pd.DataFrame(columns=GREEDY_COLUMNS)], ignore_index=True)
    frame = own[["receiver", "via", "sender", "own_share"]].merge(
        joint[["receiver", "via", "sender", "order", "marginal_share"]], on=["receiver", "via", "sender"], how="left")
    per_input = joint.groupby(["receiver", "via"])[["joint_share", "all_share"]].first().reset_index()
    frame = frame.merge(per_input, on=["receiver", "via"], how="left")
    frame["joint_order"] = frame.pop("order").fillna(0).astype(int)
    return frame


def circuit_spread(model: HookedModel, receivers: Optional[list[str]] = None, seeds: Sequence[int] = (0, 1, 2),
                   half_lens: Sequence[int] = (16, 32, 48, 64), story_seeds: Sequence[int] = (1000, 2000, 3000),
                   n_seqs: int = 4, n_stories: int = 4, story_len: int = 128,
                   threshold: float = 0.8, min_score: float = 0.3, max_receivers: int = 2,
                   max_candidates: Optional[int] = None) -> pd.DataFrame:
    """Own shares and joint sets of every induction head's inputs, at every setting.

    Args:
        receivers: induction heads "L{l}H{h}" (default: the `max_receivers` best heads above layer 0 with
            induction score >= `min_score`).
        seeds, half_lens: repeated random tokens [A A] of each seed and half length (cut to the context),
            `n_seqs` sequences each; the corrupted run is the next seed's tokens.
        story_seeds: held-out name stories (`story_pair`, `n_stories` of up to `story_len` tokens) of each
            seed; none for a model without a tokenizer.
        threshold: the joint sets' target (`interp.patching.greedy_feeders`).
        max_candidates: the greedy selection draws from every earlier head (None), or from the
            `max_candidates` with the largest own shares at that setting (cheaper on deep models, but a
            backup head that carries nothing alone can then be missed; `all_share` is then that pool's).

    Returns:
        One row per setting, receiver, input and earlier head: `data` ("repeated" or "stories"), `seed`,
        `length` (tokens per sequence), `receiver`, `via`, `sender`, `own_share`, `joint_order` (0 when not
        in the joint set), `marginal_share` (NaN then), `joint_share`, `all_share`. Empty without
        induction heads.

    Example:
        >>> import sprout, interp
        >>> model = sprout.load("gpt-4")
        >>> spread = interp.circuit_spread(model, seeds=(0,), half_lens=(16,), story_seeds=(), max_receivers=1)
        >>> print(interp.spread_sentences(spread).splitlines()[0])  # the default: 3 seeds x 4 lengths + 3 story sets
        Over 1 settings (repeated random tokens of seeds 0 at lengths 2x16):
    """
    if receivers is None:
        found = find_induction_heads(model, min_score).head(max_receivers)
        receivers = [head_label(r.layer, r.head) for r in found.itertuples()]
    if not receivers:
        return pd.DataFrame(columns=SPREAD_COLUMNS)
    frames = []
    for data, seed, pair in _settings(model, seeds, half_lens, story_seeds, n_seqs, n_stories, story_len):
        frames.append(_one_setting(model, receivers, pair, threshold, max_candidates).assign(data=data, seed=seed, length=pair[0].shape[1]))
    return pd.concat(frames, ignore_index=True)[SPREAD_COLUMNS]


def spread_ranges(spread: pd.DataFrame) -> pd.DataFrame:
    """Per receiver, input and sender over all settings: `settings`, `in_joint_set` (how many settings had
    it in the joint set), `own_min`, `own_max`, `marginal_min`, `marginal_max` (over the settings where it
    was a member), `joint_min`, `joint_max` (the input's joint share)."""
    n = spread.groupby(["data", "seed", "length"]).ngroups
    g = spread.groupby(["receiver", "via", "sender"], sort=False)
    member = spread[spread["joint_order"] > 0].groupby(["receiver", "via", "sender"])["marginal_share"]
    joint = spread.groupby(["receiver", "via"])["joint_share"]
    out = pd.DataFrame({"settings": n, "in_joint_set": g["joint_order"].apply(lambda s: int((s > 0).sum())),
                        "own_min": g["own_share"].min(), "own_max": g["own_share"].max()})
    out["marginal_min"], out["marginal_max"] = member.min(), member.max()
    out = out.reset_index()
    out["joint_min"] = [joint.min().get((r, v)) for r, v in zip(out["receiver"], out["via"])]
    out["joint_max"] = [joint.max().get((r, v)) for r, v in zip(out["receiver"], out["via"])]
    return out


def _settings_text(spread: pd.DataFrame) -> str:
    rep = spread[spread["data"] == "repeated"]
    parts = []
    if len(rep):
        lengths = sorted(rep["length"].unique())
        parts.append(f"repeated random tokens of seeds {', '.join(map(str, sorted(rep['seed'].unique())))} at "
                     f"lengths {', '.join(f'2x{n // 2}' for n in lengths)}")
    st = spread[spread["data"] == "stories"]
    if len(st):
        parts.append(f"{st['seed'].nunique()} sets of name stories")
    return " and ".join(parts)


def spread_sentences(spread: pd.DataFrame) -> str:
    """What holds at every setting of a `circuit_spread`: per induction head and input, the heads in the
    joint set at every setting (with their ranges), those in it only sometimes (with how often), and the
    range of the set's joint share."""
    if spread.empty:
        return "no induction head to measure"
    ranges = spread_ranges(spread)
    n = int(ranges["settings"].iloc[0])
    lines = [f"Over {n} settings ({_settings_text(spread)}):"]
    names = {"k": "keys", "q": "queries", "v": "values"}
    for (receiver, via), rows in ranges.groupby(["receiver", "via"], sort=False):
        always = rows[rows["in_joint_set"] == n].sort_values("marginal_min", ascending=False)
        sometimes = rows[(rows["in_joint_set"] > 0) & (rows["in_joint_set"] < n)].sort_values("in_joint_set", ascending=False)
        text = f"{receiver}'s {names[via]}: the joint set carries {rows['joint_min'].iloc[0]:.2f}-{rows['joint_max'].iloc[0]:.2f}; "
        if len(always):
            text += "in it at every setting: " + "; ".join(
                f"{r.sender} (alone {r.own_min:.2f}-{r.own_max:.2f}, marginal {r.marginal_min:.2f}-{r.marginal_max:.2f})"
                for r in always.itertuples())
        else:
            text += "no head is in it at every setting"
        if len(sometimes):
            text += "; at some settings only: " + "; ".join(
                f"{r.sender} ({r.in_joint_set} of {n}, alone {r.own_min:.2f}-{r.own_max:.2f})" for r in sometimes.itertuples())
        lines.append("  " + text)
    return "\n".join(lines)
