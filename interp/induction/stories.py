"""The induction demo: how sure each model is of a name's tokens the first time and when it comes back.

At its first occurrence an invented name ("Zorbin Plax") cannot be predicted past its first letters;
at the second, a model with an induction circuit copies it from earlier in the context. One layer is
not enough for that (the chapter: gpt-1 below 1% on "or" both times, gpt-4 98%).
"""
from __future__ import annotations

import random
import re
from typing import Optional, Union

import pandas as pd
import torch

from sprout.material import generate_story
from sprout.tokenizer import raw

from .._core.model import HookedModel, logits_of, model_name

# a model, a list of models, or {label: model}
Models = Union[HookedModel, list[HookedModel], dict[str, HookedModel]]

_WORD = re.compile(r"\b[A-Z][a-z]+\b")  # a capitalised word


def _starts_sentence(text: str, i: int) -> bool:
    before = text[:i].rstrip(" \t")
    return before == "" or before[-1] in '.!?"\n'


def _named(models) -> dict:
    if isinstance(models, dict):
        return dict(models)
    if isinstance(models, (list, tuple)):
        return {f"{model_name(m)}_{i}": m for i, m in enumerate(models)}
    return {model_name(models): models}


def _token_probs(model: HookedModel, text: str, spans: list[tuple[int, int]]) -> list[list[tuple[int, str, int, float]]]:
    """For each char span: (token_index, token, pos, p(token | what precedes)) of the tokens overlapping it.

    The text is cut at the model's context; a span past the cut gets an empty list.
    """
    tok = getattr(model, "tokenizer", None)
    if tok is None:
        raise ValueError(f"{model_name(model)} has no tokenizer; the induction table reads text")
    enc = raw(tok).encode(text, add_special_tokens=False)  # the raw tokenizer's Encoding, with offsets
    offsets, all_ids = enc.offsets, enc.ids  # each access converts the whole list: read them once
    n = min(len(all_ids), int(model.cfg.n_ctx))
    ids = torch.tensor(all_ids[:n], device=model.cfg.device)[None]
    with torch.inference_mode():
        lp = torch.log_softmax(logits_of(model, ids)[0].float(), dim=-1)  # [pos, vocab]
    p = torch.full((n,), float("nan"))
    p[1:] = lp[:-1].gather(-1, ids[0, 1:, None])[:, 0].exp().cpu()
    out = []
    for start, end in spans:
        toks = [i for i in range(n) if offsets[i][0] < end and offsets[i][1] > start]
        if toks and offsets[toks[-1]][1] >= end:  # the whole span fits in the context
            out.append([(j, tok.decode([all_ids[i]], skip_special_tokens=False), i, float(p[i]))
                        for j, i in enumerate(toks)])
        else:
            out.append([])
    return out


def induction_table(models: Models, data: str, name: Optional[str] = None) -> pd.DataFrame:
    """Probability each model gives each token of every occurrence of a repeated name in a text.

    Args:
        models: a model, a list of models, or a dict {label: model} (each with a tokenizer).
        data: the text (a str: names are found by their characters), e.g. a story where an
            invented name comes back.
        name: the repeated string, e.g. "Zorbin Plax"; it must occur at least twice. By default every
            name `story_names` finds (single capitalised words, so "Zorbin" and "Plax" separately).

    Returns:
        One row per model, name, occurrence and token: `model`, `name`, `occurrence` (1 = first),
        `token_index` (0 = the name's first token), `token`, `pos` (in the text's tokens), `prob` (the
        model's probability of that token given everything before it; NaN at position 0). Occurrences
        past a model's context are left out.

    Example:
        >>> import interp
        >>> from sprout import Sprout, SproutConfig
        >>> from sprout.tokenizer import train_bpe
        >>> text = "Once there was Zorbin Plax. Everyone liked Zorbin Plax."
        >>> model = Sprout(SproutConfig(vocab_size=300, context=64, n_layer=1, n_head=2, d_model=32, d_ff=64),
        ...                tokenizer=train_bpe(text, vocab_size=300))
        >>> df = interp.induction_table({"random": model}, text, "Zorbin Plax")
        >>> sorted(df.occurrence.unique().tolist())
        [1, 2]
    """
    if not isinstance(data, str):
        raise TypeError(f"induction_table finds names by their characters, so it needs the text as a str, "
                        f"got {type(data).__name__}")
    text = data
    if name is None:
        names = story_names(text)
        if not names:
            raise ValueError("found no repeated name in the text (a capitalised word that occurs twice, "
                             "once mid-sentence); pass name=")
    else:
        names = {name: [(m.start(), m.end()) for m in re.finditer(re.escape(name), text)]}
        if len(names[name]) < 2:
            raise ValueError(f"{name!r} occurs {len(names[name])} time(s) in the text; the table needs it at least twice")
    owner = [n for n, spans in names.items() for _ in spans]
    spans = [s for v in names.values() for s in v]
    rows = []
    for label, model in _named(models).items():
        occurrence: dict[str, int] = {}
        for n, toks in zip(owner, _token_probs(model, text, spans)):
            if toks:
                occurrence[n] = occurrence.get(n, 0) + 1
                rows += [dict(model=label, name=n, occurrence=occurrence[n], token_index=j, token=t, pos=pos, prob=p)
                         for j, t, pos, p in toks]
    return pd.DataFrame(rows, columns=["model", "name", "occurrence", "token_index", "token", "pos", "prob"])


def story_names(story: str) -> dict[str, list[tuple[int, int]]]:
    """The invented names of a story and where they occur (char spans).

    A name is a capitalised word that occurs at least twice and at least once not at the start of a
    sentence; that excludes the templates' sentence openers ("Once", "Everyone", "The").
    """
    spans: dict[str, list[tuple[int, int]]] = {}
    mid_sentence: set[str] = set()
    for m in _WORD.finditer(story):
        spans.setdefault(m.group(), []).append(m.span())
        if not _starts_sentence(story, m.start()):
            mid_sentence.add(m.group())
    return {w: s for w, s in spans.items() if len(s) >= 2 and w in mid_sentence}


def induction_stories(models: Models, n_stories: int = 50, seed: int = 0) -> pd.DataFrame:
    """The induction table aggregated over generated stories whose names no model has seen.

    Stories come from `sprout.material.generate_story` (names drawn fresh from random syllables); every
    name (`story_names`) is scored at its first and at its later occurrences, within the models'
    context.

    Returns:
        One row per model, token_index and occurrence: `model`, `token_index` (0 = a name's first
        token), `occurrence` ("first" or "later"), `mean_prob`, `median_prob`, `n` (tokens averaged),
        `n_names` (distinct names behind them).

    Example:
        >>> import interp
        >>> from sprout import Sprout, SproutConfig
        >>> from sprout.material import generate_corpus
        >>> from sprout.tokenizer import train_bpe
        >>> tok = train_bpe(generate_corpus(5_000), vocab_size=300)
        >>> model = Sprout(SproutConfig(vocab_size=300, context=512, n_layer=1, n_head=2, d_model=32, d_ff=64), tok)
        >>> df = interp.induction_stories({"random": model}, n_stories=3)
        >>> sorted(df.occurrence.unique().tolist())
        ['first', 'later']
    """
    models = _named(models)
    rows = []
    for i in range(n_stories):
        story = generate_story(random.Random(f"{seed}-{i}"))
        names = story_names(story)
        owner = [name for name, spans in names.items() for _ in spans]
        for label, model in models.items():  # one forward per story and model
            seen = set()
            for name, toks in zip(owner, _token_probs(model, story, [s for v in names.values() for s in v])):
                if not toks:
                    continue
                occurrence = "later" if name in seen else "first"
                seen.add(name)
                rows += [dict(model=label, name=f"{i}:{name}", token_index=j, occurrence=occurrence, prob=p)
                         for j, _, _, p in toks]
    if not rows:
        raise ValueError("no repeated names found in the generated stories")
    df = pd.DataFrame(rows).dropna(subset=["prob"])
    g = df.groupby(["model", "token_index", "occurrence"], sort=True)
    return pd.DataFrame({"mean_prob": g.prob.mean(), "median_prob": g.prob.median(), "n": g.size(),
                         "n_names": g.name.nunique()}).reset_index()
