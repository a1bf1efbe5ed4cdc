"""The induction circuit of a model in one call: which heads feed each induction head, through which input, how much.

Induction heads are found by their induction score on repeated random tokens (`head_scores`). For
each one, every head of an earlier layer is a candidate sender, measured three ways:

- path patching (`path_patch`, noising) through the receiver's query, key and value, on two kinds of
  data: repeated random tokens (clean: [A A], corrupted: another [B B]) and held-out name stories
  (clean: one story, corrupted: another cut to the same length). The metric is the mean log
  probability of the next token at the positions an induction head can predict (the query's token
  and the one before it occurred earlier, and the token that followed comes next);
  `share` = effect / (corrupted - clean metric): the part of the whole corruption this one edge carries.
- composition score (`composition_scores`) against its random baseline and its percentile among all
  the model's composing pairs (the baseline that discriminates: trained pairs mostly beat random ones);
- ablation (`ablate_heads`, zero): how much the loss on repeated tokens rises without the sender.

A sender `feeds` a receiver through an input when its share on repeated random tokens is at least
`min_share` and at least `relative` times the largest share into that input. Relative, because heads
doing the same job are redundant: noising one of three previous-token heads leaves the other two
intact, so each carries a small share alone (gpt-4's L1H2 and L2H2 each move a few percent of the
key path), yet they stand far above every other head. The shares of different senders can add to
more than 1 (they overlap) or less (the rest goes through MLPs, the embedding and other paths).

Joint effects name what single shares miss (`interp.patching.joint`): per induction head and input, the
smallest set of senders whose joint patch carries `joint_threshold` (default 80%) of what all
earlier heads carry together, found by greedy forward selection, and each member's marginal share
(the joint share lost when it alone leaves the set). A backup head that carries nothing alone, because
the others still deliver its signal, shows up there with a marginal share of its own.
"""
from __future__ import annotations

import math
import numbers
import random
from typing import Optional, Union

import pandas as pd
import torch
from jaxtyping import Bool, Int

from sprout.material import generate_story
from sprout.names import act_name
from sprout.tokenizer import encode

from .._core.inputs import TextOrTokens, TokenBatch, token_rows
from .._core.loss import hooked_loss
from .._core.metrics import Metric
from .._core.model import HookedModel, require_hooks
from .._core.patch_engine import clean_and_corrupted
from .._core.specs import VIA, Head, all_heads, as_head
from ..data import repeated_tokens
from ..heads import ablate_heads, ablation_hooks, composition_scores, head_scores, target_mask
from ..patching import GREEDY_COLUMNS, greedy_feeders, path_patch

# (clean, corrupted) token ids [batch, pos] of one shape
IdPair = tuple[Int[torch.Tensor, "batch pos"], Int[torch.Tensor, "batch pos"]]


def induction_positions(tokens: Int[torch.Tensor, "batch pos"]) -> Bool[torch.Tensor, "batch pos"]:
    """bool [batch, pos]: positions q whose next token an induction head predicts (some key k with
    t[k-1] = t[q], t[k-2] = t[q-1] and t[k] = t[q+1])."""
    mask = target_mask(tokens, "induction")  # [batch, query, key]
    nxt = torch.zeros_like(tokens)
    nxt[:, :-1] = tokens[:, 1:]
    hit = mask & (tokens[:, None, :] == nxt[:, :, None])
    hit[:, -1] = False
    return hit.any(-1)


def induction_metric(tokens: Int[torch.Tensor, "batch pos"]) -> Metric:
    """logits [batch, pos, d_vocab] -> mean log p(next token) over the clean tokens' induction positions."""
    where = induction_positions(tokens)
    if not where.any():
        raise ValueError("the clean tokens have no position an induction head could predict")
    nxt = torch.zeros_like(tokens)
    nxt[:, :-1] = tokens[:, 1:]

    def metric(logits):
        logp = logits.float().log_softmax(-1).gather(-1, nxt[..., None])[..., 0]
        return (logp * where).sum() / where.sum()
    return metric


def repeated_pair(model: HookedModel, half_len: int = 24, n_seqs: int = 8, seed: int = 0) -> IdPair:
    """Clean [A A] and corrupted [B B] repeated random tokens, ids [n_seqs, 2 half_len] each."""
    half_len = min(half_len, int(model.cfg.n_ctx) // 2)
    return (repeated_tokens(model, half_len, n_seqs, seed=seed), repeated_tokens(model, half_len, n_seqs, seed=seed + 1))


def story_pair(model: HookedModel, n_stories: int = 8, max_len: int = 128, seed: int = 1000) -> Optional[IdPair]:
    """Clean and corrupted name stories (generated, names never seen in training), cut to one length:
    ids [n_stories, pos] each; None for a model without a tokenizer."""
    if getattr(model, "tokenizer", None) is None:
        return None
    texts = [generate_story(random.Random(f"circuit-{seed}-{i}")) for i in range(2 * n_stories)]
    stories = [torch.tensor(encode(model.tokenizer, t), dtype=torch.long) for t in texts]
    T = min(min(len(s) for s in stories), max_len, int(model.cfg.n_ctx))
    ids = torch.stack([s[:T] for s in stories]).to(model.cfg.device)
    return ids[:n_stories], ids[n_stories:]


def checked_pair(model: HookedModel, pair: tuple[TextOrTokens, TextOrTokens], what: str) -> IdPair:
    """(clean, corrupted) ids [batch, pos] of one shape, unpadded and different, or an error naming `what`."""
    if isinstance(pair, (str, torch.Tensor)) or not hasattr(pair, "__len__") or len(pair) != 2:
        raise TypeError(f"induction_circuit's {what} must be a (clean, corrupted) pair of token ids [batch, pos] "
                        f"(or texts), got {type(pair).__name__}")
    clean, corrupted, mask = clean_and_corrupted(model, *pair)
    if mask is not None:
        TokenBatch(clean, mask).unpadded(f"induction_circuit's {what} (its metric counts induction positions)")
    return clean, corrupted


def _edges(model: HookedModel, receivers: list[str], pair, senders: list[str], label: str) -> pd.DataFrame:
    clean, corrupted = pair
    frame = path_patch(model, clean, corrupted, induction_metric(clean), senders, receivers, via=VIA)
    span = frame["source"] - frame["base"]
    # a span of 0 (the corruption does not move the metric) leaves every share undefined, not infinite
    frame[f"share_{label}"] = (frame["effect"] / span).where(span != 0)
    return frame[["sender", "receiver", "via", f"share_{label}"]]


def find_induction_heads(model: HookedModel, min_score: float = 0.3) -> pd.DataFrame:
    """Heads above layer 0 whose induction score on repeated random tokens is at least min_score."""
    scores = head_scores(model, "induction")
    return scores[(scores["score"] >= min_score) & (scores["layer"] > 0)].reset_index(drop=True)


def induction_circuit(model: HookedModel, data: Optional[tuple[TextOrTokens, TextOrTokens]] = None, min_score: float = 0.3,
                      min_share: float = 0.02, relative: float = 0.25, stories: Union[bool, tuple[TextOrTokens, TextOrTokens]] = True,
                      joint_threshold: float = 0.8) -> tuple[pd.DataFrame, str]:
    """For each induction head, the earlier heads feeding its queries, keys and values.

    Args:
        model: a hooked model with hook_z, hook_mlp_out, hook_embed, hook_q/k/v (and, for the
            composition column, TransformerLens' weight properties).
        data: None (seeded repeated random tokens), or (clean, corrupted) ids [batch, pos] to use instead.
        min_score: induction score that makes a head an induction head.
        min_share, relative: a sender feeds a receiver's input when its share is at least `min_share`
            and at least `relative` times the largest share into that input.
        stories: also measure on held-out name stories (needs a tokenizer): True (8 stories of up to 128
            tokens), False, or (clean, corrupted) story ids [batch, pos] from `story_pair`.
        joint_threshold: the joint set of an input grows (greedy forward selection, on the repeated
            tokens) until it carries this fraction of all earlier heads' joint share.

    Returns:
        (frame, summary). The frame has one row per (receiver, sender, via): `receiver`,
        `induction_score`, `sender`, `via`, `share_repeated`, `share_stories` (NaN without stories),
        `composition`, `baseline`, `composition_percentile` (among all the model's composing pairs),
        `ablation_delta` (loss rise when the sender is zeroed), `feeds`,
        `joint_order` (1, 2, ... for members of the input's joint set, in the order chosen; 0 otherwise),
        `marginal_share` (NaN for non-members), and per (receiver, via) `joint_share`, `all_share`
        (every earlier head together) and `joint_ablation_delta` (loss rise with the whole set zeroed);
        and the heads as integers: `receiver_layer`, `receiver_head`, `sender_layer`, `sender_head`.
        The summary names, per induction head and input, the feeding heads with their numbers.

    Example:
        >>> import sprout, interp
        >>> model = sprout.load("gpt-4")
        >>> small = (interp.repeated_tokens(model, 8, 2), interp.repeated_tokens(model, 8, 2, seed=1))
        >>> frame, summary = interp.induction_circuit(model, data=small, stories=False)
        >>> print(summary.splitlines()[0])  # the top induction head, then what feeds each of its inputs
        L3H1 (induction score 0.99)
    """
    require_hooks(model, [act_name("embed")])
    for name, value in (("min_score", min_score), ("min_share", min_share), ("relative", relative)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise ValueError(f"induction_circuit: {name} must be a finite number, got {value!r}")
    pair = repeated_pair(model) if data is None else checked_pair(model, data, "data")  # checked before any work
    inductions = find_induction_heads(model, min_score)
    if inductions.empty:
        return pd.DataFrame(columns=COLUMNS), f"no head scores {min_score} or more as an induction head"
    story = story_pair(model) if stories is True else (checked_pair(model, stories, "stories") if stories else None)
    frame = _add_weights_and_ablation(model, _edge_rows(model, inductions, pair, story))
    best = frame.groupby(["receiver", "via"])["share_repeated"].transform("max")
    frame["feeds"] = (frame["share_repeated"] >= min_share) & (frame["share_repeated"] >= relative * best)
    frame = add_joint(model, frame, pair, joint_threshold)
    for role in ("receiver", "sender"):
        heads = [as_head(model, label) for label in frame[role]]
        frame[f"{role}_layer"], frame[f"{role}_head"] = [h.layer for h in heads], [h.head for h in heads]
    return frame[COLUMNS], summarize(frame, joint_threshold)


ABLATION_SEQS, ABLATION_BATCH = 4, 8  # the ablation columns' data: n_seqs, and ablate_heads' default batch size
COLUMNS = ["receiver", "induction_score", "sender", "via", "share_repeated", "share_stories", "composition",
           "baseline", "composition_percentile", "ablation_delta", "feeds", "joint_order", "marginal_share", "joint_share",
           "all_share", "joint_ablation_delta", "receiver_layer", "receiver_head", "sender_layer", "sender_head"]


def joint_sets(model: HookedModel, receivers: list[str], pair: IdPair, threshold: float = 0.8) -> pd.DataFrame:
    """`greedy_feeders` for every receiver and input on one (clean, corrupted) pair, stacked."""
    clean, corrupted = pair
    metric = induction_metric(clean)
    frames = [greedy_feeders(model, clean, corrupted, metric, r, via, threshold=threshold) for r in receivers for via in VIA]
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=GREEDY_COLUMNS)


def add_joint(model: HookedModel, frame: pd.DataFrame, pair: IdPair, threshold: float) -> pd.DataFrame:
    """The joint-set columns of `induction_circuit`'s frame, measured on `pair`."""
    joint = joint_sets(model, list(dict.fromkeys(frame["receiver"])), pair, threshold)
    members = joint.set_index(["receiver", "via", "sender"])
    key = list(zip(frame["receiver"], frame["via"], frame["sender"]))
    frame["joint_order"] = [int(members["order"].get(k, 0)) for k in key]
    frame["marginal_share"] = [float(members["marginal_share"].get(k, float("nan"))) for k in key]
    groups = joint.groupby(["receiver", "via"])
    half = min(24, int(model.cfg.n_ctx) // 2)
    ablation = _joint_ablations(model, {g: list(rows["sender"]) for g, rows in groups}, half)
    per_group = groups[["joint_share", "all_share"]].first()
    pairs = list(zip(frame["receiver"], frame["via"]))
    frame["joint_share"] = [float(per_group["joint_share"].get(k, float("nan"))) for k in pairs]
    frame["all_share"] = [float(per_group["all_share"].get(k, float("nan"))) for k in pairs]
    frame["joint_ablation_delta"] = [ablation.get(k, float("nan")) for k in pairs]
    return frame


def _joint_ablations(model: HookedModel, sets: dict, half_len: int) -> dict:
    """{key: loss rise with every sender of sets[key] zeroed at once}: `ablate_heads`' joint delta (the
    same data and loss), with the clean loss computed once and without its per-head rows."""
    if not sets:
        return {}
    rows = token_rows(model, repeated_tokens(model, half_len, ABLATION_SEQS))
    clean = hooked_loss(model, rows, ABLATION_BATCH, half_len, [])
    ablated: dict[frozenset, float] = {}  # inputs often share a set: each set of heads is zeroed once
    for senders in sets.values():
        if frozenset(senders) not in ablated:
            hooks = ablation_hooks([as_head(model, s) for s in senders])
            ablated[frozenset(senders)] = hooked_loss(model, rows, ABLATION_BATCH, half_len, hooks)
    return {key: ablated[frozenset(senders)] - clean for key, senders in sets.items()}


def _edge_rows(model: HookedModel, inductions: pd.DataFrame, pair, story) -> pd.DataFrame:
    receivers = [Head(int(r.layer), int(r.head)).label for r in inductions.itertuples()]
    senders = [h.label for h in all_heads(model, below=int(inductions["layer"].max()))]
    frame = _edges(model, receivers, pair, senders, "repeated")
    if story is not None:
        frame = frame.merge(_edges(model, receivers, story, senders, "stories"), on=["sender", "receiver", "via"])
    else:
        frame["share_stories"] = float("nan")
    scores = {Head(int(r.layer), int(r.head)).label: r.score for r in inductions.itertuples()}
    frame["induction_score"] = frame["receiver"].map(scores)
    return frame


def _add_weights_and_ablation(model: HookedModel, frame: pd.DataFrame) -> pd.DataFrame:
    comps = []
    for via in VIA:
        try:
            c = composition_scores(model, via)
        except ValueError:  # no weight properties: the composition columns stay empty
            continue
        comps.append(c.assign(via=via)[["sender", "receiver", "via", "score", "baseline", "percentile"]])
    if comps:
        comps = pd.concat(comps).rename(columns={"score": "composition", "percentile": "composition_percentile"})
        frame = frame.merge(comps, on=["sender", "receiver", "via"], how="left")
    else:
        frame["composition"], frame["baseline"], frame["composition_percentile"] = (float("nan"),) * 3
    senders = sorted({as_head(model, s) for s in frame["sender"]})
    ablation = ablate_heads(model, senders, together=False, n_seqs=ABLATION_SEQS, half_len=min(24, int(model.cfg.n_ctx) // 2),
                            batch_size=ABLATION_BATCH)
    per_head = {r.label: r.delta for r in ablation.itertuples() if r.label in set(frame["sender"])}
    frame["ablation_delta"] = frame["sender"].map(per_head)
    return frame


def summarize(frame: pd.DataFrame, threshold: float = 0.8) -> str:
    """A few lines: per induction head and input, the heads that feed it with share, composition and
    ablation, then the input's joint set with its members' marginal shares."""
    lines = []
    for receiver, rows in frame.groupby("receiver", sort=False):
        lines.append(f"{receiver} (induction score {rows['induction_score'].iloc[0]:.2f})")
        for via, name in (("k", "keys"), ("q", "queries"), ("v", "values")):
            these = rows[rows["via"] == via]
            if these["share_repeated"].isna().all():
                lines.append(f"  {name}: undefined (the metric is the same on the clean and the corrupted tokens)")
                continue
            fed = these[these["feeds"]].sort_values("share_repeated", ascending=False)
            parts = [f"{r.sender} ({_edge_numbers(r)})" for r in fed.itertuples()]
            lines.append(f"  {name}: " + ("; ".join(parts) if parts else "no single head above the threshold"))
            lines.append(_joint_line(rows[rows["via"] == via], threshold))
    return "\n".join(lines)


def _joint_line(rows: pd.DataFrame, threshold: float) -> str:
    members = rows[rows["joint_order"] > 0].sort_values("joint_order")
    if members.empty:
        return "    jointly: the earlier heads together carry no share"
    first = members.iloc[0]
    names = " + ".join(members["sender"])
    marginal = ", ".join(f"{r.sender} {r.marginal_share:+.2f}" for r in members.itertuples())
    verb = "carries" if len(members) == 1 else "carry"
    return (f"    jointly: {names} {verb} {first.joint_share:.2f} (all earlier heads together {first.all_share:.2f}; "
            f"greedy forward selection to {threshold:.0%} of that); marginal shares {marginal}; "
            f"ablating the set +{first.joint_ablation_delta:.2f} nats")


def _edge_numbers(r) -> str:
    text = f"share {r.share_repeated:.2f} on repeated tokens"
    if pd.notna(r.share_stories):
        text += f", {r.share_stories:.2f} on stories"
    if pd.notna(r.composition):
        text += (f", composition {r.composition:.2f} (percentile {r.composition_percentile:.0f} of the model's pairs; "
                 f"random {r.baseline:.2f})")
    return text + f", ablation +{r.ablation_delta:.2f} nats"
