"""A latent's description, chosen on one text and scored on another it never saw (issue 38).

`describe_latent(model, sae, latent, train, test)` finds where the latent fires (activation > 0) on the
`train` text and chooses the description that best predicts it there (highest F1), among:

- `tokens`: a set of current tokens (" the", "ing", ...), grown greedily by precision, at most `max_units`;
- `bigrams`: a set of (previous token, current token) pairs, the same way;
- `after`: a set of previous tokens (the latent fires on whatever follows them);
- `rule`: one token-class rule of `RULES` (word starts, capitalised words, the later pieces of a repeated
  capitalised word, punctuation, digits, whitespace, newlines, word continuations).

Nothing but token statistics is used (no language model). The description is then scored on `test` as a
detector of where the latent fires: `precision` (of the tokens it matches, the share where the latent
fires), `recall` (of the tokens where it fires, the share matched), `auroc` (the description's score: the
train firing rate of the unit matched, 0 when none; a rule scores 1 / 0), and `fuzz`: the top-activating
tokens of `test` and as many random non-firing tokens near them are "highlighted"; the share of these
highlights the description classifies right (a real highlight matched, a fuzzed one not; 0.5 is chance).

`interpretability_score` describes `n` random live latents of a dictionary, `n` PCA directions and `n`
random unit directions of its input space under the same procedure (a direction "fires" where its
centred projection exceeds the train quantile that gives it the latents' median density) and reports
each one's scores; `interpretability_summary` the share with held-out `auroc >= 0.8` per source.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

import numpy as np
import pandas as pd
import torch

from .._core.batching import TextOrTokens, batches, token_rows
from .._core.model import HookedModel, str_tokens
from .settings import COUNT, check_args

if TYPE_CHECKING:
    from .sae import SAE

GOOD_AUROC = 0.8  # a latent "has a held-out description" at this detection AUROC or above (issue 38, item 6)
SET_KINDS = ("tokens", "bigrams", "after")


@dataclass
class Tokens:
    """Every token of some text, flattened: `ids`, `prev` (the previous id, -1 at a row's start), `row`,
    `pos` [N]; `strs` the tokens as text; `classes` {rule: bool [N]}."""

    ids: np.ndarray
    prev: np.ndarray
    row: np.ndarray
    pos: np.ndarray
    strs: list
    classes: dict


def _alpha_end(s: str) -> bool:
    return bool(s) and s[-1].isalpha()


def _words(strs: list[str]) -> list[int]:
    """For each token of one row, the index of the token its word starts at (a word is a run of letters)."""
    start, out = 0, []
    for i, s in enumerate(strs):
        joins = i > 0 and s[:1].isalpha() and _alpha_end(strs[i - 1])
        start = start if joins else i
        out.append(start)
    return out


def _later_repeated_piece(strs: list[str]) -> list[bool]:
    """True on the 2nd and later tokens of a capitalised word that already occurred earlier in the row."""
    starts = _words(strs)
    ends = {}
    for i, s in enumerate(starts):
        ends[s] = i
    seen, out = set(), [False] * len(strs)
    for s in sorted(ends):
        word = "".join(strs[s:ends[s] + 1]).strip()
        if word[:1].isupper() and word in seen:
            for i in range(s + 1, ends[s] + 1):
                out[i] = True
        seen.add(word)
    return out


RULES: dict[str, Callable[[str, str], bool]] = {
    "word starts (a space, then a letter)": lambda s, p: s[:1] == " " and s[1:2].isalpha(),
    "capitalised word starts": lambda s, p: s.strip()[:1].isupper() and not (s[:1].isalpha() and _alpha_end(p)),
    "word continuations (letters right after letters)": lambda s, p: s[:1].isalpha() and _alpha_end(p),
    "punctuation": lambda s, p: bool(s.strip()) and not any(c.isalnum() for c in s),
    "digits": lambda s, p: any(c.isdigit() for c in s),
    "whitespace": lambda s, p: not s.strip(),
    "newlines": lambda s, p: "\n" in s,
}
REPEATED = "later pieces of a repeated capitalised word"


def token_classes(rows_strs: list[list[str]]) -> dict[str, np.ndarray]:
    """{rule: bool [N]} over the rows' tokens, flattened in order."""
    out: dict[str, list] = {name: [] for name in [*RULES, REPEATED]}
    for strs in rows_strs:
        for i, s in enumerate(strs):
            p = strs[i - 1] if i else ""
            for name, rule in RULES.items():
                out[name].append(rule(s, p))
        out[REPEATED] += _later_repeated_piece(strs)
    return {k: np.array(v, dtype=bool) for k, v in out.items()}


def tokens_of(model: HookedModel, data: TextOrTokens, seq_len: Optional[int] = None) -> tuple[Tokens, list[torch.Tensor]]:
    """The flattened `Tokens` of `data` and its rows (windows of `seq_len`, default the model's context)."""
    rows = token_rows(model, data, seq_len)
    strs = [str_tokens(model, r) for r in rows]
    ids = torch.cat(rows).numpy()
    prev = np.concatenate([np.concatenate([[-1], r[:-1].numpy()]) for r in rows])
    row = np.concatenate([np.full(len(r), i) for i, r in enumerate(rows)])
    pos = np.concatenate([np.arange(len(r)) for r in rows])
    return Tokens(ids, prev, row, pos, [s for ss in strs for s in ss], token_classes(strs)), rows


@torch.inference_mode()
def hook_acts(model: HookedModel, hook: str, rows: list[torch.Tensor], batch_size: int = 16) -> torch.Tensor:
    """The activation at `hook` of every token of `rows`, flattened in order: [N, d]."""
    out: list = [None] * len(rows)
    for idx, ids in batches(rows, batch_size, device=model.cfg.device):
        _, cache = model.run_with_cache(ids, names_filter=[hook])
        for b, i in enumerate(idx):
            out[i] = cache[hook][b].float().cpu()
    return torch.cat(out)


PAIR = 1 << 32  # a pair's key: (previous id + 1) * PAIR + id, the same on every text (ids are < 2^32)


def _units(tok: Tokens, kind: str) -> np.ndarray:
    prev, ids = tok.prev.astype(np.int64), tok.ids.astype(np.int64)
    return {"tokens": ids, "after": prev, "bigrams": (prev + 1) * PAIR + ids}[kind]


def _greedy(units: np.ndarray, fire: np.ndarray, max_units: int, min_count: int) -> tuple[dict, float]:
    """{unit: train firing rate} of the unit set with the best F1 (units by precision, then firings), and the F1."""
    uniq, inv = np.unique(units, return_inverse=True)
    n_all, n_fire = np.bincount(inv), np.bincount(inv, weights=fire.astype(float))
    ok = (n_all >= min_count) & (n_fire > 0)
    if not ok.any() or fire.sum() == 0:
        return {}, 0.0
    cand = np.nonzero(ok)[0]
    cand = cand[np.lexsort((-n_fire[cand], -(n_fire[cand] / n_all[cand])))][:max_units]
    tp, pred = np.cumsum(n_fire[cand]), np.cumsum(n_all[cand])
    f1 = 2 * tp / (pred + fire.sum())
    best = int(np.argmax(f1))
    return {int(uniq[c]): float(n_fire[c] / n_all[c]) for c in cand[:best + 1]}, float(f1[best])


@dataclass
class Description:
    """A chosen description: its `kind` (tokens, bigrams, after, rule), `units` {unit: train rate} (a set
    kind's) or `rule` (a rule's name), its train F1 and, in words, `text`."""

    kind: str
    units: dict
    rule: str
    train_f1: float
    text: str

    def score(self, tok: Tokens) -> np.ndarray:
        """The detector's score on each token [N] (0 where the description does not match)."""
        if self.kind == "rule":
            return tok.classes[self.rule].astype(float)
        units = _units(tok, self.kind)
        keys = np.array(list(self.units), dtype=np.int64)
        rates = np.array(list(self.units.values()))
        order = np.argsort(keys)
        at = np.searchsorted(keys[order], units).clip(0, len(keys) - 1)
        return np.where(keys[order][at] == units, rates[order][at], 0.0)


def _words_of(model: HookedModel, kind: str, units: dict, tok: Tokens) -> str:
    ids = [u for u in units]
    if kind == "bigrams":
        pairs = [(u // PAIR - 1, u % PAIR) for u in ids]
        return "the pairs " + ", ".join(f"{_show(model, a)}→{_show(model, b)}" for a, b in pairs[:6])
    shown = ", ".join(_show(model, u) for u in ids[:6])
    return ("the tokens " if kind == "tokens" else "the token after ") + shown + (" ..." if len(ids) > 6 else "")


def _show(model: HookedModel, i: int) -> str:
    return "<start>" if i < 0 else repr(str_tokens(model, torch.tensor([i]))[0])


def choose(model: HookedModel, tok: Tokens, fire: np.ndarray, max_units: int = 8, min_count: int = 2) -> Description:
    """The description (of `SET_KINDS` and the rules) with the best F1 for `fire` [N] on `tok`."""
    best = Description("rule", {}, "whitespace", -1.0, "")
    for kind in SET_KINDS:
        units, f1 = _greedy(_units(tok, kind), fire, max_units, min_count)
        if units and f1 > best.train_f1:
            best = Description(kind, units, "", f1, _words_of(model, kind, units, tok))
    for name, match in tok.classes.items():
        tp = float((match & fire).sum())
        f1 = 2 * tp / (match.sum() + fire.sum()) if fire.any() else 0.0
        if f1 > best.train_f1:
            best = Description("rule", {}, name, f1, name)
    return best


def auroc(score: np.ndarray, positive: np.ndarray) -> float:
    """The area under the ROC curve of `score` as a detector of `positive` (ties count a half; NaN if one
    class is empty): the Mann-Whitney U over the two classes' sizes."""
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    ranks = pd.Series(score).rank(method="average").to_numpy()
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def fuzz_score(tok: Tokens, act: np.ndarray, match: np.ndarray, n: int = 10, window: int = 8, seed: int = 0) -> float:
    """The share of highlights classified right: the n top-activating tokens (highlighted for real: right
    when matched) and, for each, a random non-firing token within `window` of it in its row (a fuzzed
    highlight: right when not matched). NaN when the latent never fires."""
    rng = np.random.default_rng(seed)
    top = [i for i in np.argsort(-act, kind="stable")[:n] if act[i] > 0]
    right, total = 0, 0
    for i in top:
        near = np.nonzero((tok.row == tok.row[i]) & (np.abs(tok.pos - tok.pos[i]) <= window) & (act <= 0))[0]
        right, total = right + int(match[i]), total + 1
        if len(near):
            right, total = right + int(not match[rng.choice(near)]), total + 1
    return right / total if total else float("nan")


def score_description(desc: Description, tok: Tokens, act: np.ndarray, n_contexts: int = 10, seed: int = 0) -> dict:
    """The held-out scores of `desc` for activations `act` [N] on `tok`."""
    fire, score = act > 0, desc.score(tok)
    match = score > 0
    return dict(kind=desc.kind, description=desc.text, train_f1=desc.train_f1,
                precision=float((match & fire).sum() / match.sum()) if match.any() else float("nan"),
                recall=float((match & fire).sum() / fire.sum()) if fire.any() else float("nan"),
                auroc=auroc(score, fire), fuzz=fuzz_score(tok, act, match, n_contexts, seed=seed),
                density=float(fire.mean()), n_fire=int(fire.sum()))


def describe_latent(model: HookedModel, sae: SAE, latent: int, train: TextOrTokens, test: TextOrTokens,
                    max_units: int = 8, min_count: int = 2, n_contexts: int = 10, seed: int = 0,
                    seq_len: Optional[int] = None) -> pd.DataFrame:
    """A latent's description chosen on `train` and scored on `test` (one row).

    Args:
        model, sae: a hooked model and an `interp.SAE` / `interp.Transcoder` trained on it.
        latent: the latent described.
        train, test: texts, texts or ids: the description is chosen on the first, scored on the second
            (use material the dictionary never saw, e.g. `sprout.material.unseen_texts`).
        max_units: tokens / pairs a set description may hold; min_count: occurrences a unit needs on train.
        n_contexts: top-activating test tokens the fuzzing score highlights.

    Returns:
        One row: `latent`, `kind`, `description`, `train_f1`, `precision`, `recall`, `auroc`, `fuzz`,
        `density` (test tokens it fires on), `n_fire` (the module docstring defines each).
    """
    check_args("describe_latent", latent=(latent, "int", None), max_units=(max_units, *COUNT), min_count=(min_count, *COUNT),
               n_contexts=(n_contexts, *COUNT), seed=(seed, "int", (0, None, "[")), seq_len=(seq_len, "Optional[int]", COUNT[1]))
    if not 0 <= int(latent) < int(sae.W_dec.shape[0]):
        raise ValueError(f"latent {latent} is out of range: the dictionary has {sae.W_dec.shape[0]} latents")
    if sae.hook_name is None:
        raise ValueError("describe_latent: the dictionary has no hook_name (the hook it reads)")
    acts = []
    for data in (train, test):
        tok, rows = tokens_of(model, data, seq_len)
        with torch.inference_mode():
            acts.append((tok, sae.encode(hook_acts(model, sae.hook_name, rows))[:, int(latent)].numpy()))
    (tok_tr, a_tr), (tok_te, a_te) = acts
    desc = choose(model, tok_tr, a_tr > 0, max_units, min_count)
    return pd.DataFrame([dict(latent=int(latent), **score_description(desc, tok_te, a_te, n_contexts, seed))])
