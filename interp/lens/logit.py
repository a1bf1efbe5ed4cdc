"""The logit lens: read the residual stream after each block as if the model stopped there.

At each layer boundary the stream goes through the model's own final norm and output layer (nostalgebraist
2020). Layer 0 is the stream after the embedding (`blocks.0.hook_resid_pre`), layer l the stream after
block l (`blocks.{l-1}.hook_resid_post`); with `include_mid`, layer l + 0.5 is `blocks.{l}.hook_resid_mid`,
halfway through block l + 1. The last layer is exactly the model's output.

Only one chunk of positions' full-vocabulary logits exists at a time; what is kept per position is the
top-k and a few statistics.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator, Optional

import numpy as np
import pandas as pd
import torch

from sprout.names import act_name

from .._core.batching import TextOrTokens, batches, token_rows
from .._core.model import HookedModel, n_layers, require_hooks, str_tokens, unembed


def lens_sites(model: HookedModel, include_mid: bool = False) -> list[tuple[float, str]]:
    """(layer, hook name) for every layer boundary the lens reads, in depth order."""
    sites: list[tuple[float, str]] = [(0, act_name("resid_pre", 0))]
    for l in range(n_layers(model)):
        if include_mid:
            sites.append((l + 0.5, act_name("resid_mid", l)))
        sites.append((l + 1, act_name("resid_post", l)))
    return sites


# Rows of a layer's [rows, vocab] logits whose statistics are computed at once: small enough that their
# passes over the logits stay in cache. Measured (Sprout preset, 4,096 tokens, 2 cores): on whole
# [batch * pos, vocab] tensors the statistics took ~1.6x the time of the floor (one forward + one
# unembedding and top-k per layer); in chunks of 128 rows the whole lens takes ~1.2x.
CHUNK = 128

# (index of the site in `lens_sites`, resid [rows, d_model]) -> resid [rows, d_model], applied before the
# unembedding: the tuned lens' translators. None reads the stream as it is (the logit lens).
Translator = Callable[[int, torch.Tensor], torch.Tensor]


@torch.inference_mode()
def _lens_batches(model: HookedModel, data, k: int, batch_size: int, include_mid: bool, seq_len: Optional[int],
                  stats: bool, translator: Optional[Translator] = None) -> Iterator[dict]:
    """Per batch: the lens' top-k and statistics at every layer and position, each [layer, batch, pos, ...].

    p_next / log_p_next / is_top1 / rank_next have pos - 1 columns (the last position has no next token);
    rank_next, entropy and kl_to_final are None unless `stats` (each is another pass over the vocabulary
    per layer). `translator` maps each stream before the unembedding; the last site is the model's output
    and is never translated.
    """
    sites = lens_sites(model, include_mid)
    names = [name for _, name in sites]
    require_hooks(model, names)
    L = len(names)
    for row_ids, ids in batches(token_rows(model, data, seq_len), batch_size, device=model.cfg.device):
        # the last stream's lens is the model's own output, which the forward computes anyway
        logits, cache = model.run_with_cache(ids, names_filter=names[:-1])
        B, T = ids.shape
        n = B * T
        nxt = torch.cat([ids[:, 1:], ids[:, -1:]], 1).reshape(n, 1)  # the last column is a placeholder
        f32: dict[str, Any] = dict(dtype=torch.float32, device=ids.device)
        top_probs, top_ids = torch.empty(L, n, k, **f32), torch.empty(L, n, k, dtype=torch.long, device=ids.device)
        p_next = torch.empty(L, n, **f32)
        rank_next = torch.empty(L, n, dtype=torch.int32, device=ids.device) if stats else None
        entropy, kl = (torch.empty(L, n, **f32), torch.zeros(L, n, **f32)) if stats else (None, None)
        final = logits.reshape(n, -1).float()
        if stats:  # sum p_final log p_final, per position
            neg_h_final = torch.cat([(lp.exp() * lp).sum(-1) for lp in
                                     (torch.log_softmax(final[a:a + CHUNK], dim=-1) for a in range(0, n, CHUNK))])
        for l, name in enumerate(names):
            # one unembedding per layer, as one matmul (the floor's); the statistics then go through it in
            # chunks. Only this layer's [batch * pos, vocab] logits exist at a time.
            if l == L - 1:
                z_all = final
            else:
                resid = cache[name].reshape(n, -1)
                z_all = unembed(model, resid if translator is None else translator(l, resid)).float()
            for a in range(0, n, CHUNK):
                s = slice(a, a + CHUNK)
                z = z_all[s]  # [rows, vocab]
                top_z, top_ids[l, s] = z.topk(k, dim=-1)
                p = torch.softmax(z, dim=-1)
                # log-sum-exp from the top token: z_top - log p_top (p_top >= 1 / d_vocab: no underflow)
                lse = top_z[:, :1] - p.gather(-1, top_ids[l, s, :1]).log()
                top_probs[l, s] = (top_z - lse).exp()
                z_next = z.gather(-1, nxt[s])
                p_next[l, s] = (z_next - lse)[:, 0]  # log p; exponentiated once per batch below
                if stats:
                    assert rank_next is not None and entropy is not None and kl is not None  # made with stats
                    rank_next[l, s] = (z > z_next).sum(-1, dtype=torch.int32)  # int32: no bool -> int64 copy
                    entropy[l, s] = lse[:, 0] - (p * z).sum(-1)  # -sum p log p, with log p = z - lse
                    if l < L - 1:  # KL(final || lens) = sum p_final log p_final - sum p_final (z - lse)
                        p_final = torch.softmax(final[s], dim=-1)
                        kl[l, s] = neg_h_final[s] - (p_final * z).sum(-1) + lse[:, 0]
            del z_all
        del cache

        def shaped(t, *rest):
            return None if t is None else t.view(L, B, T, *rest)

        log_p_next = shaped(p_next)[..., :-1]
        yield dict(rows=row_ids, ids=ids, layers=[layer for layer, _ in sites], sites=names,
                   top_ids=shaped(top_ids, k), top_probs=shaped(top_probs, k),
                   log_p_next=log_p_next, p_next=log_p_next.exp(), is_top1=shaped(top_ids, k)[..., :-1, 0] == ids[:, 1:],
                   rank_next=shaped(rank_next)[..., :-1] if stats else None,
                   entropy=shaped(entropy), kl_to_final=shaped(kl))


def logit_lens(model: HookedModel, data: TextOrTokens, k: int = 5, batch_size: int = 8,
               include_mid: bool = False, seq_len: Optional[int] = None, stats: bool = False) -> pd.DataFrame:
    """The logit lens at every layer boundary and position.

    Args:
        model: a hooked model (Sprout, the walkthrough GPT).
        data: a text, a list of texts, or ids [pos] / [batch, pos]; rows longer than
            `seq_len` (default the model's context) are cut into windows, each its own `seq`.
        k: how many top tokens to keep per position and layer.
        batch_size: sequences per forward pass.
        include_mid: also read the stream halfway through each block (after attention).
        stats: also rank_next, entropy and kl_to_final (more passes over the whole vocabulary at every
            layer: measured ~1.3x the time of the lens without them).

    Returns:
        One row per (seq, layer, pos), sorted so, with columns
        `seq` (row of the input), `layer` (0 = after the embedding, l = after block l; l + 0.5 = after
        block l + 1's attention, only with include_mid), `site` (the hook read), `pos`, `token` (the
        input token at pos), `next_token` (the actual next token; None at the last position),
        `top_tokens` / `top_ids` / `top_probs` (the lens' k most likely next tokens, most likely first),
        `p_next` (probability of the actual next token; NaN at the last position), `is_top1` (the next
        token is the lens' top token); with `stats`, also `rank_next` (0-based rank of the next token
        among the whole vocabulary; -1 at the last position), `entropy` (nats) and `kl_to_final`
        (KL(final output || lens) in nats; 0 at the last layer).

    Example:
        >>> import torch, interp
        >>> from sprout import Sprout, SproutConfig
        >>> model = Sprout(SproutConfig(vocab_size=64, context=16, n_layer=2, n_head=2, d_model=32, d_ff=64))
        >>> df = interp.logit_lens(model, torch.arange(10), k=3)
        >>> sorted(df.layer.unique().tolist()), len(df)
        ([0, 1, 2], 30)
    """
    return lens_frame(model, data, k, batch_size, include_mid, seq_len, stats)


def lens_frame(model: HookedModel, data: TextOrTokens, k: int, batch_size: int, include_mid: bool,
               seq_len: Optional[int], stats: bool, translator: Optional[Translator] = None) -> pd.DataFrame:
    """`logit_lens`' frame, each stream first mapped by `translator` (the tuned lens; None: the logit lens)."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    k = min(k, int(model.cfg.d_vocab))
    parts = []
    for b in _lens_batches(model, data, k, batch_size, include_mid, seq_len, stats, translator):
        L, B, T = b["top_probs"].shape[:3]
        ids = b["ids"].cpu()

        def rows_first(t, *rest):  # [layer, batch, pos, ...] -> [batch * layer * pos, ...], row-major
            return t.cpu().transpose(0, 1).reshape(B * L * T, *rest).numpy()

        pad = torch.full((L, B, 1), -1)  # the last position has no next token: rank -1, p NaN
        part = {
            "seq": np.repeat(np.asarray(b["rows"]), L * T),
            "layer": np.tile(np.repeat(np.asarray(b["layers"], dtype=float), T), B),
            "site": np.tile(np.repeat(np.asarray(b["sites"], dtype=object), T), B),
            "pos": np.tile(np.arange(T), B * L),
            "token_id": np.repeat(ids.numpy()[:, None, :], L, axis=1).reshape(-1),
            "next_id": np.repeat(torch.cat([ids[:, 1:], pad[0]], 1).numpy()[:, None, :], L, axis=1).reshape(-1),
            "top_ids": rows_first(b["top_ids"], k),
            "top_probs": rows_first(b["top_probs"], k),
            "p_next": rows_first(torch.cat([b["p_next"].cpu(), pad.float().fill_(float("nan"))], 2)),
            "is_top1": rows_first(torch.cat([b["is_top1"].cpu(), pad.bool().fill_(False)], 2)),
        }
        if stats:
            part.update(rank_next=rows_first(torch.cat([b["rank_next"].cpu().long(), pad], 2)),
                        entropy=rows_first(b["entropy"]), kl_to_final=rows_first(b["kl_to_final"]))
        parts.append(part)
    cols = {key: np.concatenate([part[key] for part in parts]) for key in parts[0]}
    order = np.argsort(cols["seq"], kind="stable")  # batches group rows by length: put seqs back in order
    cols = {key: v[order] for key, v in cols.items()}
    # every id shown, decoded once
    has_next = cols["next_id"] >= 0
    shown = np.concatenate([cols["token_id"], np.where(has_next, cols["next_id"], cols["token_id"]),
                            cols["top_ids"].reshape(-1)])
    used, where = np.unique(shown,
                            return_inverse=True)
    text = np.asarray(str_tokens(model, torch.from_numpy(used)), dtype=object)
    n = len(order)
    text_of = text[where]
    next_token = text_of[n:2 * n]
    next_token[~has_next] = None
    layer = cols["layer"]
    df = pd.DataFrame({
        "seq": cols["seq"], "layer": layer.astype(int) if not include_mid else layer, "site": cols["site"],
        "pos": cols["pos"], "token": text_of[:n], "next_token": next_token,
        "top_tokens": text_of[2 * n:].reshape(n, k).tolist(), "top_ids": cols["top_ids"].tolist(),
        "top_probs": cols["top_probs"].tolist(), "p_next": cols["p_next"], "is_top1": cols["is_top1"],
    })
    if stats:
        df.insert(df.columns.get_loc("p_next") + 1, "rank_next", cols["rank_next"])
        df["entropy"], df["kl_to_final"] = cols["entropy"], cols["kl_to_final"]
    return df


def lens_summary(frame: pd.DataFrame) -> pd.DataFrame:
    """Per-layer averages of a `logit_lens` frame.

    Returns:
        One row per layer: `layer`, `site`, `mean_top1_prob` (the lens' confidence: mean probability of
        its top token, over all positions), `frac_next_top1` (how often the actual next token is the
        top token, over positions that have one), `mean_p_next`, `mean_entropy` and `mean_kl_to_final`
        (when the frame has them: `logit_lens(..., stats=True)`), `n_positions`.

    Example:
        >>> import torch, interp
        >>> from sprout import Sprout, SproutConfig
        >>> model = Sprout(SproutConfig(vocab_size=64, context=16, n_layer=2, n_head=2, d_model=32, d_ff=64))
        >>> summary = interp.lens_summary(interp.logit_lens(model, torch.arange(10)))
        >>> summary.columns[:3].tolist()
        ['layer', 'site', 'mean_top1_prob']
    """
    f = frame.assign(top1_prob=frame.top_probs.str[0], has_next=frame.next_token.notna())
    g = f.groupby(["layer", "site"], sort=True)
    with_next = f[f.has_next].groupby(["layer", "site"], sort=True)
    out = {"mean_top1_prob": g.top1_prob.mean(), "frac_next_top1": with_next.is_top1.mean(),
           "mean_p_next": with_next.p_next.mean()}
    for col in ("entropy", "kl_to_final"):
        if col in frame:
            out[f"mean_{col}"] = g[col].mean()
    out["n_positions"] = g.size()
    return pd.DataFrame(out).reset_index()


@torch.inference_mode()
def lens_dataset_summary(model: HookedModel, data: TextOrTokens, batch_size: int = 8, include_mid: bool = False,
                         seq_len: Optional[int] = None) -> pd.DataFrame:
    """`lens_summary` over a whole dataset, streamed: memory does not grow with the number of tokens.

    Same columns as `lens_summary`; equal to `lens_summary(logit_lens(model, data))` up to float
    rounding, without ever building the per-position table.

    Example:
        >>> import torch, interp
        >>> from sprout import Sprout, SproutConfig
        >>> model = Sprout(SproutConfig(vocab_size=64, context=16, n_layer=2, n_head=2, d_model=32, d_ff=64))
        >>> interp.lens_dataset_summary(model, torch.randint(0, 64, (4, 16))).n_positions.tolist()
        [64, 64, 64]
    """
    acc: dict[float, dict] = {}
    for b in _lens_batches(model, data, 1, batch_size, include_mid, seq_len, stats=True):
        for l, (layer, site) in enumerate(zip(b["layers"], b["sites"])):
            a = acc.setdefault(layer, dict(site=site, top1=0.0, n=0, hit=0, p_next=0.0, n_next=0, entropy=0.0, kl=0.0))
            a["top1"] += b["top_probs"][l, ..., 0].double().sum().item()
            a["entropy"] += b["entropy"][l].double().sum().item()
            a["kl"] += b["kl_to_final"][l].double().sum().item()
            a["n"] += b["entropy"][l].numel()
            a["hit"] += b["is_top1"][l].sum().item()
            a["p_next"] += b["p_next"][l].double().sum().item()
            a["n_next"] += b["p_next"][l].numel()
    return pd.DataFrame([{
        "layer": layer, "site": a["site"], "mean_top1_prob": a["top1"] / a["n"],
        "frac_next_top1": a["hit"] / a["n_next"] if a["n_next"] else float("nan"),
        "mean_p_next": a["p_next"] / a["n_next"] if a["n_next"] else float("nan"),
        "mean_entropy": a["entropy"] / a["n"], "mean_kl_to_final": a["kl"] / a["n"], "n_positions": a["n"],
    } for layer, a in sorted(acc.items())])


def first_top1_layer(frame: pd.DataFrame) -> pd.DataFrame:
    """The first layer at which the actual next token becomes the lens' top-1, per position.

    Returns:
        One row per (seq, pos) that has a next token: `seq`, `pos`, `token`, `next_token`,
        `first_top1_layer` (NaN if it never is, not even at the output), `top1_at_output` (bool).

    Example:
        >>> import torch, interp
        >>> from sprout import Sprout, SproutConfig
        >>> model = Sprout(SproutConfig(vocab_size=64, context=16, n_layer=2, n_head=2, d_model=32, d_ff=64))
        >>> interp.first_top1_layer(interp.logit_lens(model, torch.arange(10))).columns.tolist()
        ['seq', 'pos', 'token', 'next_token', 'first_top1_layer', 'top1_at_output']
    """
    f = frame[frame.next_token.notna()]
    last = f.layer.max()
    first = f[f.is_top1].groupby(["seq", "pos"]).layer.min().rename("first_top1_layer")
    at_out = f[f.layer == last].set_index(["seq", "pos"]).is_top1.rename("top1_at_output")
    base = f[f.layer == last].set_index(["seq", "pos"])[["token", "next_token"]]
    out = base.join(first).join(at_out).reset_index()
    return out[["seq", "pos", "token", "next_token", "first_top1_layer", "top1_at_output"]]
