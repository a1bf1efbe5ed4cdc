"""What a dictionary's latents are: where they fire, what they write, and what clamping one does.

`feature_report(model, sae, data)` streams the data through the model once to collect, per latent, its
density, mean and largest activation, a histogram of its nonzero activations (fixed log-spaced bins,
so memory does not grow with the data) and its top-activating tokens; a second pass over only the rows
holding those tokens reads each shown latent's activation on the tokens around each of its examples.
`logit_effects(model, sae)` reads what each latent writes straight to the logits: the decoder row
through the unembedding with the final norm's gain folded in (`model.W_U`), `W_dec @ W_U` [d_sae,
d_vocab], as direct logit attribution reads any component's output (the final norm's scale, one number
per position, is left out: it rescales every token's logit alike). `clamp_effect` checks a latent's
meaning by intervention: the latent set to a value at every position (with the error term, so nothing
else changes), and the change of each token's next-token log-probability beside its logit effect.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Sequence

import pandas as pd
import torch
import torch.nn.functional as F
from jaxtyping import Bool, Int

from .._core.batching import TextOrTokens, batches, token_rows
from .._core.model import HookedModel, str_tokens
from .clamp import clamp_baselines, clamp_verdict
from .files import hook_layer
from .settings import COUNT, check_args
from .splice import _as_list, _spliced, is_transcoder, latent_name

if TYPE_CHECKING:
    from .sae import SAE

# histogram bins of log10(activation): 1e-3 .. 1e3, 10 bins a decade (values outside go to the end bins)
BIN_EDGES = torch.linspace(-3, 3, 61, dtype=torch.float64)


@dataclass
class FeatureReport:
    """DataFrames describing a dictionary's latents (each documented in `feature_report`)."""

    table: pd.DataFrame
    contexts: pd.DataFrame
    histograms: pd.DataFrame
    logit_effects: pd.DataFrame


def _acts(model: HookedModel, sae, ids: torch.Tensor) -> torch.Tensor:
    """The dictionary's latents [batch, pos, d_sae] on ids, from a forward that stops after its layer."""
    seen = {}

    def grab(x, hook):
        seen["x"] = x

    layer = hook_layer(sae.hook_name)
    stop = None if layer is None or layer + 1 >= int(model.cfg.n_layers) else layer + 1
    model.run_with_hooks(ids, fwd_hooks=[(sae.hook_name, grab)], stop_at_layer=stop)
    return sae.encode(seen["x"])


class _Harvest:
    """Per-latent running statistics and the top n activations (with where they are)."""

    def __init__(self, d_sae: int, n: int):
        self.n_tokens, self.n = 0, n
        self.count = torch.zeros(d_sae, dtype=torch.float64)
        self.total = torch.zeros(d_sae, dtype=torch.float64)
        self.max = torch.zeros(d_sae)
        self.hist = torch.zeros(d_sae, len(BIN_EDGES) + 1, dtype=torch.float64)
        self.top = torch.zeros(0, d_sae)
        self.where = torch.zeros(0, d_sae, 2, dtype=torch.long)  # (row, pos)

    def add(self, acts: torch.Tensor, rows: list[int]) -> None:
        B, T, d = acts.shape
        flat = acts.reshape(-1, d).float()
        on = flat > 0
        self.n_tokens += B * T
        self.count += on.sum(0).double()
        self.total += flat.sum(0).double()
        self.max = torch.maximum(self.max, flat.max(0).values)
        nz = on.nonzero()
        bins = torch.bucketize(flat[on].double().log10(), BIN_EDGES)
        self.hist.view(-1).index_add_(0, nz[:, 1] * self.hist.shape[1] + bins, torch.ones(len(bins), dtype=torch.float64))
        vals, idx = flat.topk(min(self.n, B * T), dim=0)  # [n, d_sae]
        where = torch.stack([torch.tensor(rows)[idx // T], idx % T], -1)
        self.top, keep = torch.cat([self.top, vals]).topk(min(self.n, len(self.top) + len(vals)), dim=0)
        self.where = torch.cat([self.where, where]).gather(0, keep[..., None].expand(-1, -1, 2))


def _harvest(model: HookedModel, sae, rows: list[torch.Tensor], n: int, batch_size: int) -> _Harvest:
    h = _Harvest(int(sae.d_sae), n)
    for idx, ids in batches(rows, batch_size, device=model.cfg.device):
        acts = _acts(model, sae, ids)
        if not torch.isfinite(acts).all():
            raise ValueError(f"the latents of the dictionary at {sae.hook_name} hold NaN or infinite values")
        h.add(acts.cpu(), idx)
    return h


def logit_effects(model: HookedModel, sae: SAE, k: int = 10) -> pd.DataFrame:
    """Each latent's k most promoted and k most suppressed tokens: rows of `W_dec @ W_U` [d_sae, d_vocab].

    Returns:
        Rows `latent`, `direction` ("top" / "bottom"), `rank` (0 = strongest), `token` (id), `token_str`,
        `effect` (the logit added per unit of activation, before the final norm's per-position scale).
    """
    check_args("logit_effects", k=(k, "int", (1, int(model.cfg.d_vocab), "[]")))
    with torch.no_grad():
        effects = sae.W_dec.float() @ model.W_U.float().to(sae.W_dec.device)  # [d_sae, d_vocab]
        top, bottom = effects.topk(k, dim=-1), effects.topk(k, dim=-1, largest=False)
    rows = []
    for direction, (vals, ids) in (("top", top), ("bottom", bottom)):
        names = str_tokens(model, ids.reshape(-1).cpu())
        for i, (latent, rank) in enumerate(torch.cartesian_prod(torch.arange(ids.shape[0]), torch.arange(k)).tolist()):
            rows.append((latent, direction, rank, int(ids[latent, rank]), names[i], float(vals[latent, rank])))
    return pd.DataFrame(rows, columns=["latent", "direction", "rank", "token", "token_str", "effect"])


def _contexts(model: HookedModel, sae, rows, h: _Harvest, latents: list[int], n_examples: int, before: int, after: int,
              batch_size: int) -> pd.DataFrame:
    """Per shown latent and example, the tokens around it with that latent's activation on each."""
    wanted = sorted({int(h.where[r, j, 0]) for j in latents for r in range(n_examples) if h.top[r, j] > 0})
    acts_of: dict = {}
    for idx, ids in batches([rows[i] for i in wanted], batch_size, device=model.cfg.device):
        a = _acts(model, sae, ids)[..., latents].cpu()  # [batch, pos, len(latents)]
        for b, i in enumerate(idx):
            acts_of[wanted[i]] = a[b]
    out = []
    for col, j in enumerate(latents):
        for r in range(n_examples):
            if h.top[r, j] <= 0:
                break
            row, pos = (int(v) for v in h.where[r, j])
            lo, hi = max(0, pos - before), min(len(rows[row]), pos + after + 1)
            toks = str_tokens(model, rows[row][lo:hi])
            for t in range(lo, hi):
                out.append((j, r, row, t, t - pos, toks[t - lo], float(acts_of[row][t, col]), float(h.top[r, j])))
    return pd.DataFrame(out, columns=["latent", "example", "row", "pos", "offset", "token_str", "activation", "example_max"])


def _summary(ctx: pd.DataFrame, effects: pd.DataFrame) -> dict:
    """{latent: one line}: the tokens it fires on most (at its examples' peaks) and the tokens it promotes."""
    peaks = ctx[ctx.offset == 0].groupby("latent").token_str.agg(lambda s: s.value_counts().index[:3].tolist())
    top = effects[effects.direction == "top"].sort_values("rank").groupby("latent").token_str.agg(lambda s: s.tolist()[:3])
    show = lambda toks: ", ".join(repr(t) for t in toks)
    return {j: f"fires on {show(peaks[j])}; promotes {show(top.get(j, []))}" for j in peaks.index}


def feature_report(model: HookedModel, sae: SAE, data: TextOrTokens, latents: Optional[Sequence[int]] = None, n_show: int = 24,
                   n_examples: int = 6, before: int = 12, after: int = 3, k: int = 8, batch_size: int = 16,
                   seq_len: Optional[int] = None) -> FeatureReport:
    """Density, activations, top contexts, activation histograms and logit effects of a dictionary's latents.

    Args:
        model, sae: a hooked model and an `interp.SAE` / `interp.Transcoder` trained on it.
        data: text, texts or ids, cut into windows of `seq_len` (default the model's context).
        latents: the latents to show contexts and histograms for; default the `n_show` live latents
            whose top activation is largest relative to their mean (the most selective ones) spread
            over densities: half of them the densest live latents, half the most selective.
        n_examples: top-activating tokens shown per latent, each with `before` / `after` tokens around it.
        k: tokens kept per latent and direction in `logit_effects`.

    Returns:
        FeatureReport with
        `table`: one row per latent: `latent`, `density` (fraction of tokens it fires on), `mean_act`
            (mean over the tokens it fires on), `max_act`, `shown`, `summary` (a line from its top tokens,
            for the shown latents);
        `contexts`: per shown latent, example (0 = top) and token: `latent`, `example`, `row` (of the
            data's windows), `pos` (in it), `offset` (from the example's token), `token_str`, `activation`, `example_max`;
        `histograms`: `latent`, `lo`, `hi` (activation range of the bin), `count` (of nonzero activations);
        `logit_effects`: as `logit_effects(model, sae, k)`, for every latent.
    """
    (sae,) = _as_list([sae])
    check_args("feature_report", n_show=(n_show, *COUNT), n_examples=(n_examples, *COUNT), before=(before, "int", (0, None, "[")),
               after=(after, "int", (0, None, "[")), k=(k, *COUNT), batch_size=(batch_size, *COUNT),
               seq_len=(seq_len, "Optional[int]", COUNT[1]))
    for j in latents if latents is not None else []:
        check_args("feature_report", latents=(j, "int", None))
        if not 0 <= j < sae.d_sae:
            raise ValueError(f"latent {j} is out of range: the dictionary has {sae.d_sae} latents (0..{sae.d_sae - 1})")
    if hasattr(sae, "check_model"):
        sae.check_model(model, f"the {type(sae).__name__} at {sae.hook_name!r}")
    rows = token_rows(model, data, seq_len)
    with torch.inference_mode():
        h = _harvest(model, sae, rows, n_examples, batch_size)
    density = (h.count / h.n_tokens).float()
    mean_act = torch.where(h.count > 0, h.total / h.count.clamp_min(1), 0).float()
    if latents is None:
        latents = _pick(density, h.max / mean_act.clamp_min(1e-9), n_show)
    latents = [int(j) for j in latents]
    effects = logit_effects(model, sae, k)
    with torch.inference_mode():
        ctx = _contexts(model, sae, rows, h, latents, n_examples, before, after, batch_size)
    summary = _summary(ctx, effects) if len(ctx) else {}
    table = pd.DataFrame(dict(latent=range(sae.d_sae), density=density.numpy(), mean_act=mean_act.numpy(),
                              max_act=h.max.numpy()))
    table["shown"] = table.latent.isin(latents)
    table["summary"] = table.latent.map(summary).fillna("")
    return FeatureReport(table, ctx, _histograms(h, latents), effects)


def _pick(density: torch.Tensor, selectivity: torch.Tensor, n: int) -> list[int]:
    live = (density > 0).nonzero().flatten()
    dense = live[density[live].argsort(descending=True)][: n // 2].tolist()
    rest = [j for j in live[selectivity[live].argsort(descending=True)].tolist() if j not in dense]
    return dense + rest[: n - len(dense)]


def _histograms(h: _Harvest, latents: list[int]) -> pd.DataFrame:
    edges = torch.cat([torch.tensor([-torch.inf], dtype=torch.float64), BIN_EDGES, torch.tensor([torch.inf], dtype=torch.float64)])
    lo, hi = 10 ** edges[:-1], (10 ** edges[1:]).clamp(max=10 ** (BIN_EDGES[-1].item() + 0.1))
    out = []
    for j in latents:
        for b in h.hist[j].nonzero().flatten().tolist():
            out.append((j, float(lo[b]), float(hi[b]), int(h.hist[j, b])))
    return pd.DataFrame(out, columns=["latent", "lo", "hi", "count"])


def clamp_effect(model: HookedModel, sae: SAE, latent: int, data: TextOrTokens, value: Optional[float] = None, k: int = 10,
                 batch_size: int = 8, seq_len: Optional[int] = None, baselines: int = 0, seed: int = 0) -> pd.DataFrame:
    """The next-token log-probability change when one latent is clamped to `value` at every position.

    The dictionary is spliced in with its error term, so the clamped run differs from the clean model by
    the latent's change times its decoder row alone. `value` defaults to the latent's largest activation
    on the data. Measured on every real token of `data`.

    With `baselines` = n > 0, the same clamp is applied to n random latents and n random unit directions
    (`interp.saes.clamp.clamp_baselines`: same value, positions and error term), and the latent "does what
    its logit effects say" only when its agreement (mean Δ log p of its promoted minus its suppressed
    tokens) beats the 95th percentile of theirs.

    Returns:
        For the latent's k most promoted and k most suppressed tokens (`logit_effects`): `latent`,
        `direction`, `rank`, `token`, `token_str`, `effect`, `value`, `delta_logprob` (mean over positions
        of the clamped minus the clean log-probability of that token as the next one). With `baselines`,
        also (the same on every row) `agreement`, `baseline_p95`, `beats_baselines`, `baseline_pass_rate`
        (`interp.saes.clamp.clamp_verdict`).
    """
    (sae,) = _as_list([sae])
    if hasattr(sae, "check_model"):
        sae.check_model(model, f"the {type(sae).__name__} at {sae.hook_name!r}")
    if isinstance(latent, bool) or not hasattr(type(latent), "__index__"):
        raise ValueError(f"latent must be an integer in 0..{sae.d_sae - 1}, got {latent!r}")
    if not 0 <= latent.__index__() < sae.d_sae:
        raise ValueError(f"latent {latent} is out of range: the dictionary has {sae.d_sae} latents (0..{sae.d_sae - 1})")
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)):
        raise ValueError(f"value (the clamp) must be a finite number or None (the latent's largest activation), "
                         f"got {value!r}")
    check_args("clamp_effect", k=(k, *COUNT), batch_size=(batch_size, *COUNT), seq_len=(seq_len, "Optional[int]", COUNT[1]))
    latent, rows = latent.__index__(), token_rows(model, data, seq_len)
    with torch.inference_mode():
        if value is None:
            value = max(float(_acts(model, sae, ids)[..., latent].max()) for _, ids in batches(rows, batch_size, model.cfg.device))
        effects = logit_effects(model, sae, k)
        effects = effects[effects.latent == latent].reset_index(drop=True)
        tokens = torch.tensor(effects.token.values)
        delta, n = torch.zeros(len(tokens), dtype=torch.float64), 0

        def clamp(acts, hook):
            acts[..., latent] = value

        for _, ids in batches(rows, batch_size, model.cfg.device):
            clean = F.log_softmax(model.run_with_hooks(ids).float(), -1)[..., tokens]
            with _spliced(model, [sae], use_error_term=True):
                out = model.run_with_hooks(ids, fwd_hooks=[(latent_name(sae), clamp)])
            delta += (F.log_softmax(out.float(), -1)[..., tokens] - clean).double().sum((0, 1)).cpu()
            n += ids.numel()
    out = effects.assign(value=float(value), delta_logprob=(delta / n).numpy(),
                         kind="transcoder" if is_transcoder(sae) else "sae")
    if baselines:
        table = clamp_baselines(model, sae, latent, data, float(value), baselines, k, seed, batch_size, seq_len)
        out = out.assign(**clamp_verdict(table))
    return out


def latent_selectivity(model: HookedModel, sae: SAE, rows: Sequence[Int[torch.Tensor, " pos"]],
                       masks: Sequence[Bool[torch.Tensor, " pos"]]) -> pd.DataFrame:
    """How much more each latent fires on the marked tokens than on the rest.

    Args:
        rows: token ids, one 1-D tensor per sequence (each within the model's context).
        masks: one boolean tensor per row, True on the tokens of interest (e.g. the later pieces of names).

    Returns:
        One row per latent: `latent`, `fire_on` / `fire_off` (fraction of marked / other tokens it fires
        on), `mean_on` / `mean_off` (its mean activation there), `precision` (of the tokens it fires on,
        the fraction marked), sorted by `precision` then `fire_on`.
    """
    (sae,) = _as_list([sae])
    if len(rows) != len(masks) or any(len(r) != len(m) for r, m in zip(rows, masks)):
        raise ValueError("rows and masks must pair up, one mask as long as each row")
    on_n = off_n = 0
    sums = {k: torch.zeros(sae.d_sae, dtype=torch.float64) for k in ("fire_on", "fire_off", "mean_on", "mean_off")}
    with torch.inference_mode():
        for ids, mask in zip(rows, masks):
            acts = _acts(model, sae, ids[None].to(model.cfg.device))[0].cpu().double()
            mask = torch.as_tensor(mask, dtype=torch.bool)
            for side, sel in (("on", mask), ("off", ~mask)):
                sums[f"fire_{side}"] += (acts[sel] > 0).sum(0)
                sums[f"mean_{side}"] += acts[sel].sum(0)
            on_n, off_n = on_n + int(mask.sum()), off_n + int((~mask).sum())
    if on_n == 0:
        raise ValueError("no token is marked: nothing to compare")
    fired = sums["fire_on"] + sums["fire_off"]
    out = pd.DataFrame(dict(latent=range(sae.d_sae), fire_on=(sums["fire_on"] / on_n).numpy(),
                            fire_off=(sums["fire_off"] / max(off_n, 1)).numpy(), mean_on=(sums["mean_on"] / on_n).numpy(),
                            mean_off=(sums["mean_off"] / max(off_n, 1)).numpy(),
                            precision=torch.where(fired > 0, sums["fire_on"] / fired.clamp_min(1), 0).numpy()))
    return out.sort_values(["precision", "fire_on"], ascending=False).reset_index(drop=True)
