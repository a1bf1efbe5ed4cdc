"""The logit lens: read the residual stream after each block as if the model stopped there.

At each layer boundary the stream goes through the model's own final norm and output layer (nostalgebraist
2020). Layer 0 is the stream after the embedding (`blocks.0.hook_resid_pre`), layer l the stream after
block l (`blocks.{l-1}.hook_resid_post`); with `include_mid`, layer l + 0.5 is `blocks.{l}.hook_resid_mid`,
halfway through block l + 1. The last layer is exactly the model's output.

Only one layer's full-vocabulary log-probabilities exist at a time, for one batch; what is kept per
position is the top-k and a few statistics.
"""
from __future__ import annotations

from typing import Iterator, Optional

import pandas as pd
import torch

from ._batching import TextOrTokens, batches, token_rows
from ._model import n_layers, require_hooks, str_tokens, unembed


def lens_sites(model, include_mid: bool = False) -> list[tuple[float, str]]:
    """(layer, hook name) for every layer boundary the lens reads, in depth order."""
    sites = [(0, "blocks.0.hook_resid_pre")]
    for l in range(n_layers(model)):
        if include_mid:
            sites.append((l + 0.5, f"blocks.{l}.hook_resid_mid"))
        sites.append((l + 1, f"blocks.{l}.hook_resid_post"))
    return sites


@torch.inference_mode()
def _lens_batches(model, data, k: int, batch_size: int, include_mid: bool, seq_len: Optional[int]) -> Iterator[dict]:
    """Per batch and layer: top-k and the statistics of the lens' distribution at every position."""
    sites = lens_sites(model, include_mid)
    names = [name for _, name in sites]
    require_hooks(model, names)
    rows = token_rows(model, data, seq_len)
    for row_ids, ids in batches(rows, batch_size, device=model.cfg.device):
        logits, cache = model.run_with_cache(ids, names_filter=names)
        lp_final = torch.log_softmax(logits.float(), dim=-1)  # [batch, pos, vocab]
        p_final = lp_final.exp()
        nxt = ids[:, 1:]
        for layer, name in sites:
            lp = torch.log_softmax(unembed(model, cache[name]).float(), dim=-1)
            top_lp, top_ids = lp.topk(k, dim=-1)
            lp_next = lp[:, :-1].gather(-1, nxt[..., None])  # [batch, pos - 1, 1]
            yield dict(
                rows=row_ids, ids=ids, layer=layer, site=name, top_ids=top_ids, top_probs=top_lp.exp(),
                p_next=lp_next[..., 0].exp(), rank_next=(lp[:, :-1] > lp_next).sum(-1),
                entropy=-(lp.exp() * lp).sum(-1), kl_to_final=(p_final * (lp_final - lp)).sum(-1),
            )
        del cache


def logit_lens(model, text_or_tokens: TextOrTokens, k: int = 5, batch_size: int = 8,
               include_mid: bool = False, seq_len: Optional[int] = None) -> pd.DataFrame:
    """The logit lens at every layer boundary and position.

    Args:
        model: a hooked model (Sprout, the walkthrough GPT).
        text_or_tokens: a text, a list of texts, or ids [pos] / [batch, pos]; rows longer than
            `seq_len` (default the model's context) are cut into windows, each its own `seq`.
        k: how many top tokens to keep per position and layer.
        batch_size: sequences per forward pass.
        include_mid: also read the stream halfway through each block (after attention).

    Returns:
        One row per (seq, layer, pos), with columns
        `seq` (row of the input), `layer` (0 = after the embedding, l = after block l; l + 0.5 = after
        block l + 1's attention, only with include_mid), `site` (the hook read), `pos`, `token` (the
        input token at pos), `next_token` (the actual next token; None at the last position),
        `top_tokens` / `top_ids` / `top_probs` (the lens' k most likely next tokens, most likely first),
        `p_next` and `rank_next` (probability and 0-based rank of the actual next token; NaN / -1 at the
        last position), `is_top1` (rank_next == 0), `entropy` (nats) and `kl_to_final`
        (KL(final output || lens) in nats; 0 at the last layer).

    Example:
        >>> import torch, interp
        >>> from sprout import Sprout, SproutConfig
        >>> model = Sprout(SproutConfig(vocab_size=64, context=16, n_layer=2, n_head=2, d_model=32, d_ff=64))
        >>> df = interp.logit_lens(model, torch.arange(10), k=3)
        >>> sorted(df.layer.unique().tolist()), len(df)
        ([0, 1, 2], 30)
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    k = min(k, int(model.cfg.d_vocab))
    names: dict[int, str] = {}

    def text(i: int) -> str:
        if i not in names:
            names[i] = str_tokens(model, torch.tensor([i]))[0]
        return names[i]

    frames = []
    for b in _lens_batches(model, text_or_tokens, k, batch_size, include_mid, seq_len):
        B, T = b["ids"].shape
        ids = b["ids"].cpu()
        none = torch.full((B, 1), -1)  # the last position has no next token: rank -1, p NaN, token None
        nxt = torch.cat([ids[:, 1:], none], 1).reshape(-1).tolist()
        frames.append(pd.DataFrame({
            "seq": [seq for seq in b["rows"] for _ in range(T)],
            "layer": b["layer"], "site": b["site"], "pos": list(range(T)) * B,
            "token": [text(i) for i in ids.reshape(-1).tolist()],
            "next_token": [text(i) if i >= 0 else None for i in nxt],
            "top_tokens": [[text(i) for i in row] for row in b["top_ids"].reshape(B * T, -1).tolist()],
            "top_ids": b["top_ids"].reshape(B * T, -1).tolist(),
            "top_probs": b["top_probs"].reshape(B * T, -1).tolist(),
            "p_next": torch.cat([b["p_next"].cpu(), none.float().fill_(float("nan"))], 1).reshape(-1).tolist(),
            "rank_next": torch.cat([b["rank_next"].cpu(), none], 1).reshape(-1).tolist(),
            "entropy": b["entropy"].reshape(-1).tolist(), "kl_to_final": b["kl_to_final"].reshape(-1).tolist(),
        }))
    df = pd.concat(frames, ignore_index=True)
    df.insert(df.columns.get_loc("rank_next") + 1, "is_top1", df.rank_next == 0)
    return df.sort_values(["seq", "layer", "pos"], kind="stable").reset_index(drop=True)


def lens_summary(frame: pd.DataFrame) -> pd.DataFrame:
    """Per-layer averages of a `logit_lens` frame.

    Returns:
        One row per layer: `layer`, `site`, `mean_top1_prob` (the lens' confidence: mean probability of
        its top token, over all positions), `frac_next_top1` (how often the actual next token is the
        top token, over positions that have one), `mean_p_next`, `mean_entropy`, `mean_kl_to_final`,
        `n_positions`.

    Example:
        >>> import torch, interp
        >>> from sprout import Sprout, SproutConfig
        >>> model = Sprout(SproutConfig(vocab_size=64, context=16, n_layer=2, n_head=2, d_model=32, d_ff=64))
        >>> summary = interp.lens_summary(interp.logit_lens(model, torch.arange(10)))
        >>> summary.columns[:3].tolist()
        ['layer', 'site', 'mean_top1_prob']
    """
    f = frame.assign(top1_prob=frame.top_probs.str[0], has_next=frame.rank_next >= 0)
    g = f.groupby(["layer", "site"], sort=True)
    with_next = f[f.has_next].groupby(["layer", "site"], sort=True)
    out = pd.DataFrame({
        "mean_top1_prob": g.top1_prob.mean(),
        "frac_next_top1": with_next.is_top1.mean(),
        "mean_p_next": with_next.p_next.mean(),
        "mean_entropy": g.entropy.mean(),
        "mean_kl_to_final": g.kl_to_final.mean(),
        "n_positions": g.size(),
    }).reset_index()
    return out


@torch.inference_mode()
def lens_dataset_summary(model, data: TextOrTokens, batch_size: int = 8, include_mid: bool = False,
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
    for b in _lens_batches(model, data, 1, batch_size, include_mid, seq_len):
        a = acc.setdefault(b["layer"], dict(site=b["site"], top1=0.0, n=0, hit=0.0, p_next=0.0, n_next=0,
                                            entropy=0.0, kl=0.0))
        a["top1"] += b["top_probs"][..., 0].double().sum().item()
        a["entropy"] += b["entropy"].double().sum().item()
        a["kl"] += b["kl_to_final"].double().sum().item()
        a["n"] += b["entropy"].numel()
        a["hit"] += (b["rank_next"] == 0).sum().item()
        a["p_next"] += b["p_next"].double().sum().item()
        a["n_next"] += b["p_next"].numel()
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
    f = frame[frame.rank_next >= 0]
    last = f.layer.max()
    first = f[f.is_top1].groupby(["seq", "pos"]).layer.min().rename("first_top1_layer")
    at_out = f[f.layer == last].set_index(["seq", "pos"]).is_top1.rename("top1_at_output")
    base = f[f.layer == last].set_index(["seq", "pos"])[["token", "next_token"]]
    out = base.join(first).join(at_out).reset_index()
    return out[["seq", "pos", "token", "next_token", "first_top1_layer", "top1_at_output"]]
