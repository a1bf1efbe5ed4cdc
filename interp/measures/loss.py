"""Next-token loss: on any text, and on repeated random tokens beside the uniform baseline; per source
beside the uniform and unigram baselines (`loss_table`).

On seeded random tokens followed by the same tokens again (`repeated_tokens`), the first copy cannot be
predicted better than uniformly: the loss of guessing uniformly among the ids drawn from is
ln(number of ids), the baseline reported beside it. The second copy can be copied from the first, which
is what an induction circuit does. A model whose training masked the first copies of its repeat rows
(Sprout's induction curriculum) was never trained to predict them, so its first-copy loss can lie far
above the uniform baseline: it confidently predicts story text instead.
"""
from __future__ import annotations

import math
from typing import Mapping, Optional

import pandas as pd
import torch
import torch.nn.functional as F
from jaxtyping import Float

from .._core.batching import TextOrTokens, batches, token_rows
from .._core.model import HookedModel
from ..data import repeated_tokens
from .ngram import KneserNey


@torch.inference_mode()
def _nll_sums(model: HookedModel, rows: list[torch.Tensor], batch_size: int, spans: dict) -> dict:
    """Summed loss and count of the predictions made at positions [a, b) of each row, per named span."""
    total = {k: [0.0, 0] for k in spans}
    for _, ids in batches(rows, batch_size, device=model.cfg.device):
        logits = model.run_with_hooks(ids)  # [batch, pos, d_vocab]
        nll = F.cross_entropy(logits[:, :-1].float().transpose(1, 2), ids[:, 1:], reduction="none")  # [batch, pos-1]
        for k, (a, b) in spans.items():
            part = nll[:, a:b]
            total[k][0] += part.double().sum().item()
            total[k][1] += part.numel()
    return total


def mean_loss(model: HookedModel, data: TextOrTokens, batch_size: int = 8, seq_len: Optional[int] = None) -> float:
    """Mean next-token loss (nats per token) over a text, cut into windows of the model's context.

    Each window predicts its own tokens 2..T from what precedes them in the window.

    Example:
        >>> import torch, interp
        >>> from sprout import Sprout, SproutConfig
        >>> model = Sprout(SproutConfig(vocab_size=64, context=16, n_layer=1, n_head=2, d_model=32, d_ff=64))
        >>> 3.0 < interp.mean_loss(model, torch.randint(0, 64, (2, 16))) < 6.0
        True
    """
    rows = [r for r in token_rows(model, data, seq_len) if len(r) > 1]
    if not rows:
        raise ValueError("no window has two tokens: nothing to predict")
    (total, n), = _nll_sums(model, rows, batch_size, {"all": (0, None)}).values()
    return total / n


def repeat_loss(model: HookedModel, *, half_len: int = 32, n_seqs: int = 16, token_range: Optional[tuple] = None,
                seed: int = 0, batch_size: int = 8) -> pd.DataFrame:
    """Loss on each copy of seeded repeated random tokens (`repeated_tokens`), beside the uniform baseline.

    Returns:
        Two rows, `copy` "first" (predictions of tokens 2..half_len of the first copy) and "second"
        (tokens 2..half_len of the second copy, all copyable: the same positions `ablate_heads` scores),
        with `loss` (mean nats per token), `uniform` (ln of the number of ids drawn from: the loss of a
        uniform guess), `ratio` (loss / the first copy's loss) and `n` (predictions averaged).

    Example:
        >>> import torch, interp
        >>> from sprout import Sprout, SproutConfig
        >>> model = Sprout(SproutConfig(vocab_size=64, context=16, n_layer=1, n_head=2, d_model=32, d_ff=64))
        >>> interp.repeat_loss(model, half_len=8, n_seqs=4)["copy"].tolist()
        ['first', 'second']
    """
    tokens = repeated_tokens(model, half_len, n_seqs, token_range, seed)
    low, high = (1, int(model.cfg.d_vocab)) if token_range is None else token_range
    spans = {"first": (0, half_len - 1), "second": (half_len, 2 * half_len - 1)}
    sums = _nll_sums(model, list(tokens), batch_size, spans)
    first = sums["first"][0] / sums["first"][1]
    return pd.DataFrame([dict(copy=k, loss=t / n, uniform=math.log(high - low), ratio=(t / n) / first, n=n)
                         for k, (t, n) in sums.items()])


def unigram_log_probs(model: HookedModel, train: TextOrTokens, smoothing: float = 1.0, *, next_only: bool = False,
                      seq_len: Optional[int] = None) -> Float[torch.Tensor, " d_vocab"]:
    """log p(token), [d_vocab], of the unigram model fitted on `train` (tokenised by the model's tokenizer): each id's
    count plus `smoothing`, normalised. The one unigram baseline of interp: `loss_table` counts every token with
    add-one smoothing (so an id `train` lacks keeps a finite cost); `lens_comparison` counts only the tokens a
    window predicts (`next_only`: each window's tokens after its first, windows of `seq_len`) with add-1/2."""
    if not smoothing > 0:
        raise ValueError(f"smoothing must be > 0 (an unseen token would cost infinitely much), got {smoothing}")
    rows = token_rows(model, train, seq_len)  # every window checked by the token contract (ids in range)
    ids = torch.cat([r[1:] for r in rows] if next_only else rows).long().cpu()
    counts = torch.bincount(ids, minlength=int(model.cfg.d_vocab)).double() + smoothing
    return (counts / counts.sum()).log()


def loss_table(model: HookedModel, texts: Mapping[str, TextOrTokens], train: TextOrTokens, *, smoothing: float = 1.0,
               batch_size: int = 8) -> pd.DataFrame:
    """The model's loss on each text beside baselines that know no or little context.

    Args:
        model: a hooked model with a tokenizer (or give ids).
        texts: source name -> text (or ids); each is cut into windows of the model's context, and each
            window predicts its tokens 2..T, as in `mean_loss`.
        train: text (or ids) from the model's training distribution, on which the unigram baseline's
            token frequencies and the n-gram baselines are fitted (e.g. its training corpus, regenerated
            from its recipe).
        smoothing: added to every id's count (`unigram_log_probs`).

    Returns:
        One row per source: `source`, `loss` (the model's nats per token), `uniform` (ln d_vocab, a uniform
        guess), `unigram` (the nats per token of predicting every target from the training frequencies
        alone, on the same targets), `bigram` and `trigram` (the nats per token of interpolated Kneser-Ney
        bigram and trigram models fitted on `train`, `interp.measures.KneserNey`, predicting each target from
        the one or two tokens before it in its window; a window's first target has one: the trigram's
        bigram) and `n` (targets). A model that has learned anything of a text's language costs less than
        `unigram` on it; one that uses more than the last token or two, less than `bigram` and `trigram`.

    Example:
        >>> import torch, interp
        >>> from sprout import Sprout, SproutConfig
        >>> model = Sprout(SproutConfig(vocab_size=64, context=16, n_layer=1, n_head=2, d_model=32, d_ff=64))
        >>> t = interp.loss_table(model, {"a": torch.randint(0, 64, (2, 16))}, torch.arange(64))
        >>> round(float(t.loc[0, "unigram"]), 4) == round(math.log(64), 4)  # every id once: the uniform guess
        True
    """
    ids = torch.cat(token_rows(model, train))
    log_p = unigram_log_probs(model, ids, smoothing)
    ngram = KneserNey(ids, int(model.cfg.d_vocab), order=3)
    out = []
    for source, text in texts.items():
        rows = [r for r in token_rows(model, text) if len(r) > 1]
        if not rows:
            raise ValueError(f"texts[{source!r}]: no window has two tokens: nothing to predict")
        (total, n), = _nll_sums(model, rows, batch_size, {"all": (0, None)}).values()
        targets = torch.cat([r[1:] for r in rows])
        ngrams = {f"{name}gram": -torch.cat([ngram.log_probs(r, order) for r in rows]).mean().item()
                  for name, order in (("bi", 2), ("tri", 3))}
        out.append(dict(source=source, loss=total / n, uniform=math.log(int(model.cfg.d_vocab)),
                        unigram=-log_p[targets].mean().item(), **ngrams, n=n))
    return pd.DataFrame(out, columns=["source", "loss", "uniform", "unigram", "bigram", "trigram", "n"])
