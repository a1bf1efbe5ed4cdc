"""The batched patching engine shared by activation patching (`patching`), attribution patching
(`attribution_patching`), path patching (`path_patching`) and joint path patching (`joint`).

TransformerLens runs one forward per patch. Here many patches share one forward: the corrupted batch is
stacked `n` times and copy `i` carries patch `i` (one hook call per layer patches every copy); the
layers below the patched one run once, from the stream at its `hook_resid_pre`. The metric is then
called on each copy's logits [batch, pos, d_vocab] exactly as TransformerLens calls it.

Private: the techniques' modules are the public surface; everything here takes checked ids.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union, cast

import pandas as pd
import torch
from jaxtyping import Float, Int

from sprout.names import act_name

from .inputs import TextOrTokens, masked, token_batch
from .metrics import Metric, degenerate, hide, metric_value, refuse_nan
from .model import HookedModel, n_heads, n_layers, require_hooks, unembed
from .specs import patch_label

# site (an activation name of `sprout.names.act_name`) -> layout: "vector" acts are [batch, pos, ...],
# "head" [batch, pos, head, ...], "pattern" [batch, head, query_pos, key_pos].
SITES = {"resid_pre": "vector", "attn_out": "vector", "mlp_out": "vector", "z": "head", "q": "head", "k": "head",
         "v": "head", "pattern": "pattern"}
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
        return patch_label(self.layer, self.head, self.pos)


def hook_name(site: str, layer: int) -> str:
    return act_name(site, layer)


def check_site(model: HookedModel, site: str, by: str) -> None:
    """Raise a ValueError for an unknown site or `by`, a per-head `by` on a whole-layer site, or hooks the model lacks."""
    if site not in SITES:
        raise ValueError(f"unknown site {site!r}; choose one of {list(SITES)}")
    if by not in BY:
        raise ValueError(f"unknown by={by!r}; choose one of {list(BY)}")
    if SITES[site] == "vector" and by in ("head", "head_position"):
        raise ValueError(f"site {site!r} has no heads: patch it by 'layer' or 'position'")
    require_hooks(model, [hook_name(site, l) for l in range(n_layers(model))])


def as_tokens(model: HookedModel, data: TextOrTokens) -> Int[torch.Tensor, "batch pos"]:
    """Token ids [batch, pos] from ids ([pos] or [batch, pos]) or text (one text, or a list of equal length)."""
    return token_batch(model, data).unpadded("this analysis")


def clean_and_corrupted(model: HookedModel, clean: TextOrTokens, corrupted: TextOrTokens) -> tuple[
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
    if (clean_mask is None) != (corrupted_mask is None) or (
            clean_mask is not None and not clean_mask.equal(cast(torch.Tensor, corrupted_mask))):  # both given here
        lengths = [[clean.shape[1]] * clean.shape[0] if m is None else m.sum(1).tolist() for m in (clean_mask, corrupted_mask)]
        raise ValueError(f"clean and corrupted are padded differently (real tokens per row: clean {lengths[0]}, "
                         f"corrupted {lengths[1]}): patching swaps activations position by position, so each row "
                         "needs the same real positions in both")
    if clean.equal(corrupted):
        raise ValueError("clean and corrupted are the same tokens: every patch would leave the metric where it is, "
                         "so there is nothing to measure; corrupt the input (another name, another token)")
    return clean, corrupted, clean_mask


def patches(model: HookedModel, site: str, by: str, n_pos: int) -> list[Patch]:
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


def batched_forward(model: HookedModel, tokens: Int[torch.Tensor, "batch pos"], hooks: list, n: int,
                    mask: Optional[Int[torch.Tensor, "batch pos"]] = None) -> Float[torch.Tensor, "n_batch pos d_vocab"]:
    """Logits [n * batch, pos, d_vocab] of `n` copies of `tokens` stacked copy-major, with `hooks`
    (hook name, function) acting on all copies at once ([n * batch, ...])."""
    return model.run_with_hooks(tokens.repeat(n, 1), fwd_hooks=hooks, **masked(mask, n))


def batched_forward_from(model: HookedModel, resid: Float[torch.Tensor, "batch pos d_model"], layer: int, hooks: list, n: int,
                         mask: Optional[Int[torch.Tensor, "batch pos"]] = None) -> Float[torch.Tensor, "n_batch pos d_vocab"]:
    """As `batched_forward`, but starting at block `layer` from its input stream `resid` [batch, pos,
    d_model]: every copy sees the same input below the patched layer, so those layers run once."""
    return model.run_with_hooks(resid.repeat(n, 1, 1), start_at_layer=layer, fwd_hooks=hooks, **masked(mask, n))


def chunk_size(model: HookedModel, tokens: Int[torch.Tensor, "batch pos"], limit: Optional[int], what: str = "batch_size") -> int:
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"{what} must be None or an integer >= 1, got {limit!r}")
        return limit
    return max(1, LOGIT_BUDGET // (tokens.numel() * int(model.cfg.d_vocab)))


def split_metric(metric: Metric, logits: Float[torch.Tensor, "n_batch pos d_vocab"], n: int,
                 mask: Optional[Int[torch.Tensor, "batch pos"]] = None) -> list[float]:
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


def check_logit_positions(logit_positions: object, n_pos: int) -> Optional[list[int]]:
    """`logit_positions` (None, an int or ints, negative counting from the end) as sorted positions."""
    if logit_positions is None:
        return None
    if isinstance(logit_positions, int) and not isinstance(logit_positions, bool):
        raw: Optional[list] = [logit_positions]
    else:  # ints only: a float, a str, a bool or a tensor is refused below
        raw = list(logit_positions) if isinstance(logit_positions, (list, tuple, range)) else None
    if not raw or not all(isinstance(p, int) and not isinstance(p, bool) and -n_pos <= p < n_pos for p in raw):
        raise ValueError(f"logit_positions must be positions in -{n_pos}..{n_pos - 1} (an int or a list of them), "
                         f"got {logit_positions!r}")
    return sorted({p % n_pos for p in raw})


def _logits(model: HookedModel, run_from, layer: int, hooks: list, n: int, positions: Optional[list[int]],
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
def patch_values(model: HookedModel, clean: Int[torch.Tensor, "batch pos"], corrupted: Int[torch.Tensor, "batch pos"],
                 metric: Metric, site: str,
                 todo: list[Patch], batch_size: Optional[int] = None,
                 logit_positions: Optional[list[int]] = None, mask: Optional[Int[torch.Tensor, "batch pos"]] = None) -> list[float]:
    """The metric after each patch in `todo`, in its order (clean/corrupted already checked ids, with
    their attention mask or None)."""
    layout = SITES[site]
    names = sorted({hook_name(site, p.layer) for p in todo})
    _, cache = model.run_with_cache(clean, names_filter=names, **masked(mask))
    starts = [act_name("resid_pre", layer) for layer in by_layer(todo)]
    starts = [name for name in starts if name in model.hook_dict]  # a walkthrough step without residuals has none
    _, streams = model.run_with_cache(corrupted, names_filter=starts, **masked(mask)) if starts else (None, {})
    n_max = chunk_size(model, corrupted, batch_size)
    values: dict[Patch, float] = {}
    for layer, group in by_layer(todo).items():
        source, start_name = cache[hook_name(site, layer)], act_name("resid_pre", layer)
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
def baselines(model: HookedModel, clean: Int[torch.Tensor, "batch pos"], corrupted: Int[torch.Tensor, "batch pos"], metric: Metric,
              mask: Optional[Int[torch.Tensor, "batch pos"]] = None) -> tuple[float, float]:
    """The metric on the clean and on the corrupted run, unpatched."""
    return cast(tuple[float, float],
                tuple(split_metric(metric, model.run_with_hooks(ids, **masked(mask)), 1, mask)[0] for ids in (clean, corrupted)))


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
