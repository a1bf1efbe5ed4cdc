"""Activation patching sweeps: put one clean activation into the corrupted run, see how far the metric comes back.

The convention is TransformerLens' `patching.get_act_patch_*` (denoising): the model runs on the
corrupted tokens, one piece of one activation (a layer, a head, a position, a head at a position) is
replaced by its value on the clean tokens, and the metric is read from the patched logits. The values
equal TransformerLens' within float rounding (tested against `get_act_patch_*`).

What differs is the cost. TransformerLens runs one forward per patch. Here many patches share one
forward: the corrupted batch is stacked `n` times and copy `i` carries patch `i` (one hook call per
layer patches every copy). The metric is then called on each copy's logits [batch, pos, d_vocab]
exactly as TransformerLens calls it. (Running the layers before the patched one once and copying at
its `hook_resid_pre` would save more, but Sprout's hooks refuse a replacement of another shape.)

A metric maps logits [batch, pos, d_vocab] to a scalar, or to one value per batch row ([batch]),
which is averaged; anything else is refused naming the metric (`_metrics`). Texts of unequal token
length are padded: every forward gets their attention mask, and the metric sees NaN at padded
positions (a metric that reads them is refused). Clean equal to corrupted is an error; a metric equal
on both runs gets a warning and `frame.attrs["degenerate"] = True`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Union

import pandas as pd
import torch
from jaxtyping import Float, Int

from ._inputs import TextOrTokens, token_batch
from ._metrics import Metric, check_metric, degenerate, hide, metric_value, refuse_nan
from ._model import n_heads, n_layers, require_hooks, unembed
from ._specs import head_label

__all__ = ["SITES", "Metric", "metric_value", "patch", "patch_tensor"]

# site -> (hook name template, layout): "vector" acts are [batch, pos, ...], "head" [batch, pos, head, ...],
# "pattern" [batch, head, query_pos, key_pos].
SITES = {
    "resid_pre": ("blocks.{l}.hook_resid_pre", "vector"),
    "attn_out": ("blocks.{l}.hook_attn_out", "vector"),
    "mlp_out": ("blocks.{l}.hook_mlp_out", "vector"),
    "z": ("blocks.{l}.attn.hook_z", "head"),
    "q": ("blocks.{l}.attn.hook_q", "head"),
    "k": ("blocks.{l}.attn.hook_k", "head"),
    "v": ("blocks.{l}.attn.hook_v", "head"),
    "pattern": ("blocks.{l}.attn.hook_pattern", "pattern"),
}
BY = ("layer", "position", "head", "head_position")
# elements of logits held at once by one batched forward (copies x batch x pos x d_vocab): 256 MB of float32
LOGIT_BUDGET = 2 ** 26


@dataclass(frozen=True)
class Patch:
    """One patch: a layer, and the head and position it is limited to (None: all of them)."""

    layer: int
    head: Optional[int] = None
    pos: Optional[int] = None

    @property
    def label(self) -> str:
        name = f"L{self.layer}" if self.head is None else head_label(self.layer, self.head)
        return name if self.pos is None else f"{name}@{self.pos}"


def hook_name(site: str, layer: int) -> str:
    return SITES[site][0].format(l=layer)


def check_site(model, site: str, by: str) -> None:
    """Raise a ValueError for an unknown site or `by`, a per-head `by` on a whole-layer site, or hooks the model lacks."""
    if site not in SITES:
        raise ValueError(f"unknown site {site!r}; choose one of {list(SITES)}")
    if by not in BY:
        raise ValueError(f"unknown by={by!r}; choose one of {list(BY)}")
    if SITES[site][1] == "vector" and by in ("head", "head_position"):
        raise ValueError(f"site {site!r} has no heads: patch it by 'layer' or 'position'")
    require_hooks(model, [hook_name(site, l) for l in range(n_layers(model))])


def as_tokens(model, text_or_tokens) -> torch.Tensor:
    """Token ids [batch, pos] from ids ([pos] or [batch, pos]) or text (one text, or a list of equal length)."""
    return token_batch(model, text_or_tokens).unpadded("this analysis")


def clean_and_corrupted(model, clean: TextOrTokens, corrupted: TextOrTokens) -> tuple[
        Int[torch.Tensor, "batch pos"], Int[torch.Tensor, "batch pos"], Optional[Int[torch.Tensor, "batch pos"]]]:
    """Both inputs as ids [batch, pos] of the same shape and padding, and their attention mask (None: unpadded).

    Raises a ValueError naming the shapes when they differ, naming the lengths when the rows are padded
    differently (a patch swaps position p of one run into position p of the other), and when clean and
    corrupted are the same tokens (every patch would change nothing).
    """
    (clean, clean_mask), (corrupted, corrupted_mask) = token_batch(model, clean), token_batch(model, corrupted)
    if clean.shape != corrupted.shape:
        raise ValueError(f"clean and corrupted must have the same [batch, pos] shape (patching swaps activations "
                         f"position by position); got clean {tuple(clean.shape)} and corrupted {tuple(corrupted.shape)}")
    if (clean_mask is None) != (corrupted_mask is None) or (clean_mask is not None and corrupted_mask is not None
                                                          and not clean_mask.equal(corrupted_mask)):
        lengths = [[clean.shape[1]] * clean.shape[0] if m is None else m.sum(1).tolist() for m in (clean_mask, corrupted_mask)]
        raise ValueError(f"clean and corrupted are padded differently (real tokens per row: clean {lengths[0]}, "
                         f"corrupted {lengths[1]}): patching swaps activations position by position, so each row "
                         "needs the same real positions in both")
    if clean.equal(corrupted):
        raise ValueError("clean and corrupted are the same tokens: every patch would leave the metric where it is, "
                         "so there is nothing to measure; corrupt the input (another name, another token)")
    return clean, corrupted, clean_mask


def patches(model, site: str, by: str, n_pos: int) -> list[Patch]:
    """Every patch of a sweep, in TransformerLens' order (layer, then position, then head)."""
    layers, heads, positions = range(n_layers(model)), range(n_heads(model)), range(n_pos)
    if by == "layer":
        return [Patch(l) for l in layers]
    if by == "position":
        return [Patch(l, pos=p) for l in layers for p in positions]
    if by == "head":
        return [Patch(l, h) for l in layers for h in heads]
    if site == "pattern":  # TransformerLens' pattern_by_pos orders (layer, head, dest_pos)
        return [Patch(l, h, p) for l in layers for h in heads for p in positions]
    return [Patch(l, h, p) for l in layers for p in positions for h in heads]


def _write(act: torch.Tensor, source: torch.Tensor, p: Patch, layout: str) -> None:
    """Copy the patched piece of `source` (one clean activation, [batch, ...]) into `act` in place."""
    idx: tuple[Union[slice, int], ...]
    if layout == "pattern":  # [batch, head, query_pos, key_pos]; a position is a destination (query) row
        idx = (slice(None), slice(None) if p.head is None else p.head, slice(None) if p.pos is None else p.pos)
    else:  # [batch, pos, (head,) ...]
        idx = (slice(None), slice(None) if p.pos is None else p.pos) + (() if p.head is None else (p.head,))
    act[idx] = source[idx]


def _patch_hook(chunk: list[Patch], source: torch.Tensor, layout: str):
    def hook(act, hook):
        B = source.shape[0]
        act = act.clone()
        for i, p in enumerate(chunk):
            _write(act[i * B:(i + 1) * B], source, p, layout)
        return act
    return hook


def masked(mask: Optional[torch.Tensor], n: int = 1) -> dict:
    """The forward's keyword for `n` stacked copies of a batch with attention mask [batch, pos] (or None)."""
    return {} if mask is None else {"attention_mask": mask.repeat(n, 1)}


def batched_forward(model, tokens: torch.Tensor, hooks: list, n: int, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Logits [n * batch, pos, d_vocab] of `n` copies of `tokens` stacked copy-major, with `hooks`
    (hook name, function) acting on all copies at once ([n * batch, ...])."""
    return model.run_with_hooks(tokens.repeat(n, 1), fwd_hooks=hooks, **masked(mask, n))


def batched_forward_from(model, resid: torch.Tensor, layer: int, hooks: list, n: int,
                         mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """As `batched_forward`, but starting at block `layer` from its input stream `resid` [batch, pos,
    d_model]: every copy sees the same input below the patched layer, so those layers run once."""
    return model.run_with_hooks(resid.repeat(n, 1, 1), start_at_layer=layer, fwd_hooks=hooks, **masked(mask, n))


def chunk_size(model, tokens: torch.Tensor, limit: Optional[int], what: str = "patches_per_forward") -> int:
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"{what} must be None or an integer >= 1, got {limit!r}")
        return limit
    return max(1, LOGIT_BUDGET // (tokens.numel() * int(model.cfg.d_vocab)))


def split_metric(metric: Metric, logits: torch.Tensor, n: int, mask: Optional[torch.Tensor] = None) -> list[float]:
    """The metric of each of `n` stacked copies' logits, NaN at padded positions; a metric reading them is refused."""
    B = logits.shape[0] // n
    logits = hide(logits, mask)
    values = [metric_value(metric, logits[i * B:(i + 1) * B]) for i in range(n)]
    refuse_nan(values, mask=mask)
    return values


def by_layer(items: list) -> dict[int, list]:
    groups: dict[int, list] = {}
    for item in items:
        groups.setdefault(item.layer, []).append(item)
    return groups


def check_logit_positions(logit_positions, n_pos: int) -> Optional[list[int]]:
    """`logit_positions` (None, an int or ints, negative counting from the end) as sorted positions."""
    if logit_positions is None:
        return None
    raw: Optional[list]
    if isinstance(logit_positions, int) and not isinstance(logit_positions, bool):
        raw = [logit_positions]
    else:  # ints only: a float, a str, a bool or a tensor is refused below
        raw = list(logit_positions) if isinstance(logit_positions, (list, tuple, range)) else None
    if not raw or not all(isinstance(p, int) and not isinstance(p, bool) and -n_pos <= p < n_pos for p in raw):
        raise ValueError(f"logit_positions must be positions in -{n_pos}..{n_pos - 1} (an int or a list of them), "
                         f"got {logit_positions!r}")
    return sorted({p % n_pos for p in raw})


def _logits(model, run_from, layer: int, hooks: list, n: int, positions: Optional[list[int]],
            mask: Optional[torch.Tensor]) -> torch.Tensor:
    """One batched forward from `layer` ((tokens, 0) or (stream, layer)); with `positions`, only those
    positions are unembedded and every other logit is NaN."""
    start, kind = run_from
    if positions is None:
        if kind == "tokens":
            return batched_forward(model, start, hooks, n, mask)
        return batched_forward_from(model, start, layer, hooks, n, mask)
    x = start.repeat(n, 1) if kind == "tokens" else start.repeat(n, 1, 1)
    resid = model.run_with_hooks(x, fwd_hooks=hooks, stop_at_layer=n_layers(model), **masked(mask, n),
                                 **({} if kind == "tokens" else {"start_at_layer": layer}))
    picked = unembed(model, resid[:, positions])
    logits = picked.new_full((*resid.shape[:2], picked.shape[-1]), float("nan"))
    logits[:, positions] = picked
    return logits


@torch.inference_mode()
def patch_values(model, clean: torch.Tensor, corrupted: torch.Tensor, metric: Metric, site: str,
                 todo: list[Patch], patches_per_forward: Optional[int] = None,
                 logit_positions: Optional[list[int]] = None, mask: Optional[torch.Tensor] = None) -> list[float]:
    """The metric after each patch in `todo`, in its order (clean/corrupted already checked ids, with
    their attention mask or None)."""
    layout = SITES[site][1]
    names = sorted({hook_name(site, p.layer) for p in todo})
    _, cache = model.run_with_cache(clean, names_filter=names, **masked(mask))
    starts = [f"blocks.{layer}.hook_resid_pre" for layer in by_layer(todo)]
    starts = [name for name in starts if name in model.hook_dict]  # a walkthrough step without residuals has none
    _, streams = model.run_with_cache(corrupted, names_filter=starts, **masked(mask)) if starts else (None, {})
    n_max = chunk_size(model, corrupted, patches_per_forward)
    values: dict[Patch, float] = {}
    for layer, group in by_layer(todo).items():
        source, start_name = cache[hook_name(site, layer)], f"blocks.{layer}.hook_resid_pre"
        run_from = (streams[start_name], "stream") if start_name in starts else (corrupted, "tokens")
        for start in range(0, len(group), n_max):
            chunk = group[start:start + n_max]
            hooks = [(hook_name(site, layer), _patch_hook(chunk, source, layout))]
            logits = _logits(model, run_from, layer, hooks, len(chunk), logit_positions, mask)
            chunk_values = split_metric(metric, logits, len(chunk), mask)
            refuse_nan(chunk_values, logit_positions)
            values.update(zip(chunk, chunk_values))
    return [values[p] for p in todo]


@torch.inference_mode()
def baselines(model, clean: torch.Tensor, corrupted: torch.Tensor, metric: Metric,
              mask: Optional[torch.Tensor] = None) -> tuple[float, float]:
    """The metric on the clean and on the corrupted run, unpatched."""
    clean_value, corrupted_value = (split_metric(metric, model.run_with_hooks(ids, **masked(mask)), 1, mask)[0]
                                    for ids in (clean, corrupted))
    return clean_value, corrupted_value


def patch_frame(todo: list[Patch], site: str, values: dict, clean_value: float, corrupted_value: float) -> pd.DataFrame:
    """One row per patch: `site`, `layer`, `head`, `pos` (-1: all), `label`, the value columns, `clean`,
    `corrupted`, and `recovered` = (metric - corrupted) / (clean - corrupted) for each value column."""
    frame = pd.DataFrame({
        "site": site, "layer": [p.layer for p in todo], "head": [-1 if p.head is None else p.head for p in todo],
        "pos": [-1 if p.pos is None else p.pos for p in todo], "label": [p.label for p in todo], **values,
    })
    frame["clean"], frame["corrupted"] = clean_value, corrupted_value
    span = clean_value - corrupted_value
    frame["recovered"] = (frame[next(iter(values))] - corrupted_value) / span if span != 0 else float("nan")
    frame.attrs["degenerate"] = degenerate(clean_value, corrupted_value)
    return frame


def patch(model, clean: TextOrTokens, corrupted: TextOrTokens, metric: Metric, site: str = "resid_pre",
          by: str = "position", patches_per_forward: Optional[int] = None,
          logit_positions: Union[int, Sequence[int], None] = None) -> pd.DataFrame:
    """Activation patching sweep (denoising): the metric with one clean piece of `site` in the corrupted run.

    Args:
        model: a hooked model (Sprout, the walkthrough GPT at a step with the site's hooks).
        clean, corrupted: token ids [batch, pos] (or [pos], text, or a list of texts: padded, and the
            metric then sees NaN at padded positions) of the same shape and padding.
        metric: logits [batch, pos, d_vocab] -> a scalar, or [batch] (averaged over rows).
        site: one of `SITES`: resid_pre, attn_out, mlp_out, z, q, k, v, pattern.
        by: "layer" (the whole activation), "position", "head" (all positions), or "head_position";
            a pattern's position is its destination (query) row, as in TransformerLens.
        patches_per_forward: patches sharing one forward (default: as many as 256 MB of logits allow).
        logit_positions: the positions whose logits the metric reads (an int or a list, e.g. -1): only
            those are unembedded in the sweep's forwards (the unembedding is a large share of their cost)
            and the metric sees NaN everywhere else; a metric that then returns NaN is refused. The
            metric still receives logits [batch, pos, d_vocab], so it needs no change.

    Returns:
        One row per patch (columns in `patch_frame`); `metric` is the patched value, equal to
        TransformerLens' `patching.get_act_patch_<site>_<by>` at that index. `frame.attrs["degenerate"]`
        is True (with a warning) when the metric is the same on clean and corrupted.

    Example:
        >>> frame = interp.patch(model, clean_ids, corrupted_ids, metric, site="z", by="head")
    """
    check_site(model, site, by)
    check_metric(metric)
    clean, corrupted, mask = clean_and_corrupted(model, clean, corrupted)
    todo = patches(model, site, by, corrupted.shape[1])
    positions = check_logit_positions(logit_positions, corrupted.shape[1])
    values = patch_values(model, clean, corrupted, metric, site, todo, patches_per_forward, positions, mask)
    clean_value, corrupted_value = baselines(model, clean, corrupted, metric, mask)
    return patch_frame(todo, site, {"metric": values}, clean_value, corrupted_value)


def patch_tensor(frame: pd.DataFrame, column: str = "metric") -> Float[torch.Tensor, " layer *pos_head"]:
    """A patch frame's values in TransformerLens' layout: [layer], [layer, pos], [layer, head], or
    [layer, pos, head] ([layer, head, pos] for pattern)."""
    axes = [a for a in ("layer", "pos", "head") if (frame[a] >= 0).any()]
    if (frame["site"] == "pattern").all() and axes == ["layer", "pos", "head"]:
        axes = ["layer", "head", "pos"]
    shape = [int(frame[a].max()) + 1 for a in axes]
    out = torch.full(shape, float("nan"))
    index = tuple(torch.tensor(frame[a].to_numpy()) for a in axes)
    out[index] = torch.tensor(frame[column].to_numpy(), dtype=out.dtype)
    return out

