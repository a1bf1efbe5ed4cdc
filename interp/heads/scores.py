"""Head detectors: how much of each head's attention goes where a kind of head should look.

For every query position a kind names its target keys (a boolean mask built from the tokens alone):

- previous_token: the key just before the query (k = q - 1).
- duplicate_token: every earlier key holding the same token as the query (k < q, t[k] = t[q]).
- prefix_matching: every key right after an earlier occurrence of the query's token
  (1 <= k <= q, t[k - 1] = t[q]); Olsson et al.'s prefix matching, and TransformerLens'
  `induction_head` detection pattern.
- induction: the prefix-matching keys whose match extends one token further back, so that the head
  continues a repeated span (also t[k - 2] = t[q - 1], where k - 2 exists). On repeated random tokens
  with no accidental repeats this is exactly the stripe "each token of the second copy attends to the
  token after its match in the first copy", the same keys as prefix_matching; on ordinary text it
  ignores lone repeated tokens.

A head's score is its attention mass on the target keys, averaged over the query positions that have
at least one target (over all sequences). TransformerLens' `detect_head` ("mul") divides the same mass
by the sequence length instead, counting rows with no target as 0: for one sequence,
`ours = detect_head * seq_len / rows_with_a_target` (tested). By default the scores are measured on
seeded repeated random tokens (Olsson et al. 2022), where an induction head has no other way to do well.
"""
from __future__ import annotations

from typing import Optional

import pandas as pd
import torch
from jaxtyping import Bool, Float, Int

from sprout.names import act_name
from sprout.tl.text import check_integer_ids

from .._core.batching import TextOrTokens, batches, token_rows
from .._core.model import HookedModel, n_heads, n_layers, require_hooks
from ..data import repeated_tokens

SCORE_KINDS = ("previous_token", "duplicate_token", "induction", "prefix_matching")


def target_mask(tokens: Int[torch.Tensor, "batch pos"], kind: str) -> Bool[torch.Tensor, "batch query_pos key_pos"]:
    """The keys a head of this kind attends to: tokens [batch, pos] -> bool [batch, query_pos, key_pos]."""
    if kind not in SCORE_KINDS:
        raise ValueError(f"unknown head kind {kind!r}; choose one of {list(SCORE_KINDS)}")
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2:
        raise ValueError(f"target_mask takes token ids [batch, pos], got {getattr(tokens, 'shape', type(tokens).__name__)}")
    check_integer_ids(tokens)
    B, T = tokens.shape
    q = torch.arange(T, device=tokens.device)[:, None]
    k = torch.arange(T, device=tokens.device)[None, :]
    if kind == "previous_token":
        return (k == q - 1).expand(B, T, T).clone()
    same = tokens[:, :, None] == tokens[:, None, :]  # [batch, q, k]: t[q] == t[k]
    duplicate = same & (k < q)
    if kind == "duplicate_token":
        return duplicate
    prefix = torch.zeros_like(duplicate)
    prefix[:, :, 1:] = duplicate[:, :, :-1]  # key j + 1 for every earlier duplicate j
    if kind == "prefix_matching":
        return prefix
    induction = prefix.clone()
    induction[:, 1:, 2:] &= same[:, :-1, :-2]  # t[q - 1] == t[k - 2]; k = 1 has no k - 2 and stays
    induction[:, 0, :] = False
    return induction


@torch.inference_mode()
def head_score_tensor(model: HookedModel, kind: str, tokens: TextOrTokens,
                      batch_size: int = 8) -> tuple[Float[torch.Tensor, "n_layers n_heads"], int]:
    """Scores [n_layers, n_heads] of every head on these ids [batch, pos], and the number of target rows."""
    names = [act_name("pattern", l) for l in range(n_layers(model))]
    require_hooks(model, names)
    mass = torch.zeros(n_layers(model), n_heads(model), dtype=torch.float64)
    n_rows = 0
    for _, ids in batches(token_rows(model, tokens), batch_size, device=model.cfg.device):
        mask = target_mask(ids, kind)  # [batch, q, k]
        n_rows += int(mask.any(-1).sum())
        _, cache = model.run_with_cache(ids, names_filter=names)
        for l, name in enumerate(names):
            pattern = cache[name]  # [batch, head, q, k]
            mass[l] += (pattern * mask[:, None]).sum((0, 2, 3), dtype=torch.float64).cpu()
        del cache
    if n_rows == 0:
        raise ValueError(f"no query position in these tokens has a {kind} target "
                         "(e.g. no token repeats); use repeated tokens or a longer text")
    return (mass / n_rows).float(), n_rows


def head_scores(model: HookedModel, kind: str, data: Optional[TextOrTokens] = None, *, half_len: int = 32,
                n_seqs: int = 16, token_range: Optional[tuple] = None, seed: int = 0,
                batch_size: int = 8) -> pd.DataFrame:
    """Score every (layer, head) as a kind of head, best first.

    Args:
        model: a hooked model.
        kind: "previous_token", "duplicate_token", "induction" or "prefix_matching" (see the module).
        data: text(s) or ids to measure on; by default `n_seqs` seeded random sequences of
            `half_len` tokens drawn from `token_range`, each followed by itself (`repeated_tokens`).
        half_len: the random half's length, clipped to half the model's context (`n_ctx // 2`), so
            the default works on a short-context model as `sprout heads` does.
        seed: the random sequences' seed.
        batch_size: sequences per forward pass.

    Returns:
        One row per head, sorted by score (descending): `layer`, `head`, `score` (mean attention on the
        target keys, in [0, 1]), `kind`, `n_rows` (query positions that had a target).

    Example:
        >>> import torch, interp
        >>> from sprout import Sprout, SproutConfig
        >>> model = Sprout(SproutConfig(vocab_size=64, context=16, n_layer=2, n_head=2, d_model=32, d_ff=64))
        >>> df = interp.head_scores(model, "induction", half_len=8, n_seqs=4)
        >>> df.columns.tolist(), len(df)
        (['layer', 'head', 'score', 'kind', 'n_rows'], 4)
    """
    if kind not in SCORE_KINDS:
        raise ValueError(f"unknown head kind {kind!r}; choose one of {list(SCORE_KINDS)}")
    half_len = min(half_len, int(model.cfg.n_ctx) // 2)
    tokens = repeated_tokens(model, half_len, n_seqs, token_range, seed) if data is None else data
    scores, n_rows = head_score_tensor(model, kind, tokens, batch_size)
    L, H = scores.shape
    df = pd.DataFrame({
        "layer": torch.arange(L).repeat_interleave(H).tolist(), "head": torch.arange(H).repeat(L).tolist(),
        "score": scores.reshape(-1).tolist(), "kind": kind, "n_rows": n_rows,
    })
    return df.sort_values(["score", "layer", "head"], ascending=[False, True, True], kind="stable").reset_index(drop=True)
