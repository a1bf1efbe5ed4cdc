"""Generation and the key-value cache: TransformerLens' `generate` and `past_kv_cache` on our models.

The cache is TransformerLens' own `TransformerLensKeyValueCache` (TL 2's
`HookedTransformerKeyValueCache`; `sprout.tl.kv_cache.new_cache` makes one): per layer the keys and values of every
position seen so far, [batch, pos_so_far, head, d_head], and the attention mask over them. Sprout's
keys are cached after QK-norm and RoPE (the values `hook_rot_k` sees), so a new token's query is
rotated to its own position and meets every cached key where it was rotated; the walkthrough GPT caches
`hook_k` and offsets its learned positions. `model(new_tokens, past_kv_cache=cache)` appends the new
positions (unless the cache is frozen) and returns their logits; the hooks fire on the new positions
only (`hook_pattern` is [batch, head, new_pos, pos_so_far + new_pos]).

`generate` samples as TransformerLens does (its `sample_logits`); prompts of unequal length are padded
on the left and masked, so each gets the continuation it gets alone.
"""
from __future__ import annotations

import math
import warnings
from typing import Any, Optional, Protocol, Sequence, Union, cast

import torch
from jaxtyping import Float, Int
from tqdm.auto import tqdm
from transformer_lens.utilities import get_attention_mask, sample_logits
from transformers import StoppingCriteria, StoppingCriteriaList, StopStringCriteria

from .kv_cache import cache_length, new_cache
from .text import _tokenizer, bos_token_id, check_attention_mask, check_tokens, to_string, tokens_and_mask


class LanguageModel(Protocol):
    """What generation reads of a model (`sprout.tl.text_io.Readable` has it; named here, since text_io and
    hooked import this module): the config and tokenizer, the forward, and the train / eval mode."""

    training: bool

    @property
    def cfg(self) -> Any: ...
    @property
    def tokenizer(self) -> Any: ...
    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...
    def eval(self) -> Any: ...
    def train(self, mode: bool = True) -> Any: ...


class Generating(Protocol):
    """A model with TransformerLens' `generate` (a `sprout.tl.hooked.HookedLM`), what `sample` calls."""

    def generate(self, *args: Any, **kwargs: Any) -> Any: ...


# a text, a list of texts, or token ids [batch, pos] / [pos]
Prompt = Union[str, list, Int[torch.Tensor, "*batch pos"]]

RETURN_TYPES = ("input", "str", "tokens", "embeds")


# --- checks --------------------------------------------------------------------------------------

def _number(name, value, low, high=math.inf, low_open=False, high_open=False):
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
    if not ok:
        span = f"{'(' if low_open else '['}{low}, {high}{')' if high_open or high == math.inf else ']'}"
        raise ValueError(f"{name} must be a finite number in {span}, got {value!r}")


def _flag(name, value):
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")


def _ids(name, value, vocab: int) -> list[int]:
    """One id or an iterable of ids, each in 0..vocab-1."""
    items = [value] if isinstance(value, int) or (isinstance(value, torch.Tensor) and value.dim() == 0) else value
    if isinstance(items, (str, bytes)) or not hasattr(items, "__iter__"):
        raise TypeError(f"{name} must be a token id or a list of token ids, got {value!r}"
                        + ("; to stop at a text use stop_strings=" if isinstance(value, str) else ""))
    out = []
    for i in items:
        if isinstance(i, torch.Tensor) and i.dim() == 0 and not i.is_floating_point():
            i = int(i)
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < vocab:
            raise ValueError(f"{name} must hold token ids in 0..{vocab - 1}, got {i!r}")
        out.append(i)
    return out


def check_options(model: LanguageModel, o: dict) -> None:
    """Every generate option, by name: a wrong type or value is an error naming it."""
    n = o["max_new_tokens"]
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {n!r}")
    for name in ("stop_at_eos", "do_sample", "use_past_kv_cache", "verbose", "output_logits", "return_cache",
                 "return_input_tokens"):
        _flag(name, o[name])
    _number("temperature", o["temperature"], 0)
    _number("freq_penalty", o["freq_penalty"], 0)
    _number("repetition_penalty", o["repetition_penalty"], 0, low_open=True)
    k = o["top_k"]
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
        raise ValueError(f"top_k must be None or an integer >= 1, got {k!r}")
    if o["top_p"] is not None:
        _number("top_p", o["top_p"], 0, 1, low_open=True)
    if o["return_type"] not in RETURN_TYPES:
        raise ValueError(f"return_type must be one of {RETURN_TYPES}, got {o['return_type']!r}")
    if o["padding_side"] not in (None, "left", "right"):
        raise ValueError(f"padding_side must be None, 'left' or 'right', got {o['padding_side']!r}")
    if o["prepend_bos"] is not None and not isinstance(o["prepend_bos"], bool):
        raise TypeError(f"prepend_bos must be True, False or None, got {o['prepend_bos']!r}")
    vocab = model.cfg.d_vocab
    for name in ("eos_token_id", "stop"):
        if o[name] is not None:
            _ids(name, o[name], vocab)
    s = o["stop_strings"]
    if s is not None and not (isinstance(s, str) or (isinstance(s, (list, tuple)) and all(isinstance(t, str) for t in s))):
        raise TypeError(f"stop_strings must be a str or a list of str, got {s!r}")


def stopping_criteria_list(model: LanguageModel, stop_strings: Optional[Union[str, Sequence[str]]],
                           stopping_criteria: Optional[Union[StoppingCriteria, Sequence[StoppingCriteria]]]
                           ) -> Optional[StoppingCriteriaList]:
    """stop_strings and stopping_criteria as one transformers StoppingCriteriaList (None when neither), as TL."""
    if stop_strings is None and stopping_criteria is None:
        return None
    criteria = StoppingCriteriaList()
    strings = [s for s in ([stop_strings] if isinstance(stop_strings, str) else list(stop_strings or [])) if s]
    if strings:
        criteria.append(StopStringCriteria(tokenizer=_tokenizer(model), stop_strings=strings))
    if isinstance(stopping_criteria, (list, tuple, StoppingCriteriaList)):
        items = list(stopping_criteria)
    else:
        items = [] if stopping_criteria is None else [stopping_criteria]
    bad = [type(c).__name__ for c in items if not isinstance(c, StoppingCriteria)]
    if bad:
        raise TypeError(f"stopping_criteria must be a transformers.StoppingCriteria, a list of them or a "
                        f"StoppingCriteriaList, got {', '.join(bad)}")
    criteria.extend(items)
    return criteria if len(criteria) else None


# --- the prompt ----------------------------------------------------------------------------------

def _is_text(input) -> bool:
    return isinstance(input, str) or (isinstance(input, (list, tuple)) and bool(input) and all(isinstance(t, str) for t in input))


def _prompt(model, input, prepend_bos, padding_side, attention_mask):
    """-> (kind "str" | "tokens" | "embeds", ids [batch, pos] or None, embeds [batch, pos, d_model] or None,
    mask [batch, pos] or None)."""
    if _is_text(input):
        if attention_mask is not None:
            raise ValueError("attention_mask goes with token ids; texts are padded and masked by generate itself")
        if input == "" and prepend_bos is None and getattr(_tokenizer(model), "bos_token_id", None) is not None:
            prepend_bos = True  # an empty prompt starts a document from <|endoftext|>, as TransformerLens' generate()
        if input == "" and bos_token_id(model, prepend_bos) is None:
            raise ValueError("the prompt is empty and there is no BOS to start from (prepend_bos=False, or a tokenizer "
                             "without <|endoftext|>): give a prompt")
        ids, mask = tokens_and_mask(model, input, prepend_bos, "left")  # left, so every row ends at its last token
        return "str", ids, None, mask
    if isinstance(input, torch.Tensor) and input.is_floating_point() and input.dim() == 3:
        return "embeds", None, _check_embeds(model, input), _mask(attention_mask, input[..., 0])
    ids = check_tokens(model, input)
    if attention_mask is None and padding_side is not None:
        prepend = model.cfg.default_prepend_bos if prepend_bos is None else prepend_bos
        attention_mask = get_attention_mask(_tokenizer(model), ids, prepend, padding_side)  # padding read off the pad token
    return "tokens", ids, None, _mask(attention_mask, ids)


def _mask(attention_mask, like: torch.Tensor):
    if attention_mask is None:
        return None
    mask = check_attention_mask(attention_mask, like).long()
    return None if bool(mask.all()) else mask


def _check_embeds(model, embeds: torch.Tensor) -> torch.Tensor:
    if model.cfg.positional_embedding_type != "rotary":
        raise ValueError(f"generate from embeddings needs a model without learned positions; {type(model).__name__} adds "
                         "them to the token embeddings: pass token ids")
    if embeds.size(-1) != model.cfg.d_model or not 1 <= embeds.size(1) <= model.cfg.n_ctx:
        raise ValueError(f"embeddings must have shape [batch, pos <= {model.cfg.n_ctx}, {model.cfg.d_model}], "
                         f"got {tuple(embeds.shape)}")
    return embeds.to(model.embed.weight.dtype)


def left_align(ids: Optional[Int[torch.Tensor, "batch pos"]], embeds: Optional[Float[torch.Tensor, "batch pos d_model"]],
               mask: Optional[Int[torch.Tensor, "batch pos"]]) -> tuple[Optional[Int[torch.Tensor, "batch pos"]],
                                                                  Optional[Float[torch.Tensor, "batch pos d_model"]],
                                                                  Optional[Int[torch.Tensor, "batch pos"]]]:
    """Move each row's padding to its left (a stable sort of the mask), so every row ends at its last token:
    right-padded prompts then continue from their own last token, not from their padding."""
    if mask is None:
        return ids, embeds, mask
    order = mask.argsort(dim=1, stable=True)
    ids = None if ids is None else ids.gather(1, order)
    embeds = None if embeds is None else embeds.gather(1, order[..., None].expand_as(embeds))
    return ids, embeds, mask.gather(1, order)


def _stops(model, o) -> tuple[set, int]:
    """The ids that end a row, and the id that fills a row after it ended (TransformerLens' choice)."""
    tok = getattr(model, "tokenizer", None)
    tok_eos = getattr(tok, "eos_token_id", None)
    stops = set(_ids("stop", o["stop"], model.cfg.d_vocab)) if o["stop"] is not None else set()
    eos = o["eos_token_id"] if o["eos_token_id"] is not None else tok_eos
    fill = None
    if o["stop_at_eos"] and eos is not None:
        eos = _ids("eos_token_id", eos, model.cfg.d_vocab)
        stops |= set(eos)
        fill = eos[0] if len(eos) == 1 or tok_eos is None else tok_eos
    if fill is None:
        fill = min(stops) if stops else (getattr(tok, "pad_token_id", None) or tok_eos or 0)
    return stops, int(fill)


# --- the loop ------------------------------------------------------------------------------------

def _last_logits(model, ids, embeds, mask, cache, first: bool) -> torch.Tensor:
    """The logits at the last position [batch, vocab]: with the cache, of the new positions only; without it,
    of the last n_ctx positions."""
    seq = embeds if embeds is not None else ids
    new = seq.size(1) if first or cache is None else 1
    new = min(new, model.cfg.n_ctx)
    part = seq[:, -new:]
    kwargs = dict(attention_mask=None if mask is None else mask[:, -new:], return_type="logits")
    if cache is not None:
        kwargs["past_kv_cache"] = cache
        if mask is None:  # say so: with a cache the forward would read trailing pad tokens (EOS) as padding
            kwargs["attention_mask"] = torch.ones(part.shape[:2], dtype=torch.long, device=part.device)
    if embeds is not None:
        kwargs["start_at_layer"] = 0
    return model(part, **kwargs)[:, -1]


def _draw(model, logits, ids, mask, drawn, o) -> torch.Tensor:
    """TransformerLens' sample_logits, with the penalties counted over real tokens only (not padding)."""
    rep, fp, greedy = o["repetition_penalty"], o["freq_penalty"], not o["do_sample"] or o["temperature"] == 0
    if rep != 1 or (fp > 0 and not greedy):
        seen = ids if ids is not None else torch.stack(drawn, 1) if drawn else torch.zeros(logits.size(0), 0, dtype=torch.long)
        weight = torch.ones_like(seen, dtype=logits.dtype) if mask is None or ids is None else mask.to(logits.dtype)
        counts = torch.zeros_like(logits).scatter_add_(1, seen.to(logits.device), weight.to(logits.device))
        if rep != 1:
            logits = torch.where(counts > 0, torch.where(logits > 0, logits / rep, logits * rep), logits)
        if fp > 0 and not greedy:
            logits = logits - fp * o["temperature"] * counts  # sample_logits divides by the temperature
    if greedy:
        return logits.argmax(-1)
    return sample_logits(logits, top_k=o["top_k"], top_p=o["top_p"], temperature=o["temperature"]).to(logits.device)


def _loop(model, ids, embeds, mask, o, criteria):
    B = (ids if ids is not None else embeds).size(0)
    stops, fill = _stops(model, o)
    stop_ids = torch.tensor(sorted(stops), device=model.cfg.device) if stops else None
    cache = new_cache(model, B) if o["use_past_kv_cache"] else None
    finished = torch.zeros(B, dtype=torch.bool, device=model.cfg.device)
    drawn: list[torch.Tensor] = []
    seen_logits: list[torch.Tensor] = []
    steps = range(_room(model, (ids if ids is not None else embeds).size(1), o))
    if o["verbose"] and len(steps) > 50:
        steps = tqdm(steps)
    for step in steps:
        if cache is not None and step > 0 and cache_length(cache) >= model.cfg.n_ctx:
            cache = None  # the context is full: slide a window of n_ctx tokens from here on, as without a cache
        logits = _last_logits(model, ids, embeds, mask, cache, first=step == 0)
        if o["output_logits"]:
            seen_logits.append(logits.clone())
        nxt = _draw(model, logits.float(), ids, mask, drawn, o)
        if stops or criteria is not None:
            nxt = torch.where(finished, torch.full_like(nxt, fill), nxt)
        if stop_ids is not None:
            finished |= torch.isin(nxt, stop_ids)
        drawn.append(nxt)
        if ids is not None:
            ids = torch.cat((ids, nxt[:, None]), dim=1)
        if embeds is not None:
            embeds = torch.cat((embeds, model.embed(nxt[:, None]).to(embeds.dtype)), dim=1)
        if mask is not None:
            mask = torch.cat((mask, torch.ones_like(nxt[:, None])), dim=1)
        if criteria is not None:
            finished |= criteria(ids if ids is not None else torch.stack(drawn, 1), logits).to(finished.device).bool()
        if (stops or criteria is not None) and bool(finished.all()):
            break
    return ids, embeds, mask, drawn, seen_logits


def _room(model, prompt_len: int, o: dict) -> int:
    """How many tokens to make: max_new_tokens, or with return_cache=True (a cache of the whole sequence, which
    must fit the context) as many as fit, with a warning that names the cut: the tokens made are kept, not lost
    to an error raised after making them."""
    n, n_ctx = o["max_new_tokens"], int(model.cfg.n_ctx)
    if not o["return_cache"] or prompt_len + n <= n_ctx:
        return n
    warnings.warn(f"generate(return_cache=True): the prompt's {prompt_len} tokens and max_new_tokens={n} would make "
                  f"{prompt_len + n}, more than the context of {n_ctx} the returned cache can cover; stopping after "
                  f"{n_ctx - prompt_len} new tokens", stacklevel=5)
    return n_ctx - prompt_len


def _check_room(kind: str, o: dict) -> None:
    """return_cache=True refused before anything is made (never after, losing what was made)."""
    if o["return_cache"] and kind == "embeds":
        raise ValueError("generate(return_cache=True) needs token input, not embeddings (as in TransformerLens)")


# --- the result ----------------------------------------------------------------------------------

def _text(model, row: torch.Tensor, mask_row) -> str:
    """A row as text without its padding, BOS and EOS (TransformerLens decodes with skip_special_tokens; a
    character tokenizer's pad is a real character and stays)."""
    tok = _tokenizer(model)
    special = {i for i in (getattr(tok, "bos_token_id", None), getattr(tok, "eos_token_id", None)) if i is not None}
    ids = row if mask_row is None else row[mask_row.bool()]
    return cast(str, to_string(model, torch.tensor([i for i in ids.tolist() if i not in special], dtype=torch.long)))  # one row: a str


def _result(model, kind, ids, embeds, mask, drawn, seen_logits, o):
    tokens = ids if ids is not None else torch.stack(drawn, 1) if drawn else torch.zeros(embeds.size(0), 0, dtype=torch.long)
    if o["output_logits"]:
        # imported here: transformers.generation.utils takes ~1 s to import (measured), and only this needs it
        from transformers.generation.utils import GenerateDecoderOnlyOutput

        return GenerateDecoderOnlyOutput(sequences=cast(torch.LongTensor, tokens), logits=tuple(seen_logits))
    rt = o["return_type"]
    if rt == "input":
        rt = {"str": "str", "tokens": "tokens", "embeds": "embeds"}[kind]
    if rt == "str":
        texts = [_text(model, row, None if mask is None or ids is None else mask[i]) for i, row in enumerate(tokens)]
        return texts[0] if len(texts) == 1 else texts
    if rt == "tokens":
        return tokens
    return embeds if embeds is not None else model.embed(ids)


def _with_extras(model, result, kind, ids, mask, prompt, o):
    """TransformerLens' return_cache / return_input_tokens: (result, cache), (result, input_tokens) or both."""
    extras = []
    if o["return_cache"]:
        _, cache = model.run_with_cache(ids, names_filter=o["names_filter"], device=o["device"], attention_mask=mask)
        extras.append(cache)
    if o["return_input_tokens"]:
        extras.append(prompt)
    return (result, *extras) if extras else result


@torch.no_grad()
def generate(model: LanguageModel, input: Union[Prompt, Float[torch.Tensor, "batch pos d_model"]], o: dict) -> Any:
    """The loop behind `HookedLM.generate` (whose docstring says what each option does); `o` holds every option."""
    check_options(model, o)
    criteria = stopping_criteria_list(model, o["stop_strings"], o["stopping_criteria"])
    kind, ids, embeds, mask = _prompt(model, input, o["prepend_bos"], o["padding_side"], o["attention_mask"])
    ids, embeds, mask = left_align(ids, embeds, mask)
    prompt = cast(torch.Tensor, ids if ids is not None else embeds)  # the prompt is one of the two
    _check_room(kind, o)  # before making anything
    if mask is None and prompt.size(0) > 1:
        mask = torch.ones(prompt.shape[:2], dtype=torch.long, device=prompt.device)  # rows are what they are: no guessing
    was_training = model.training
    model.eval()  # no dropout while sampling
    try:
        ids, embeds, mask, drawn, seen_logits = _loop(model, ids, embeds, mask, o, criteria)
    finally:
        model.train(was_training)
    result = _result(model, kind, ids, embeds, mask, drawn, seen_logits, o)
    return _with_extras(model, result, kind, ids, mask, prompt, o)


def sample(model: Generating, idx: Prompt, max_new: int, temperature: float = 0.8, top_k: Optional[int] = None,
           top_p: Optional[float] = 0.95, stop: Optional[Union[int, Sequence[int]]] = None) -> Any:
    """model.py's sampler with model.py's defaults (temperature 0.8, top-p 0.95); text in gives text out."""
    return model.generate(idx, max_new, stop_at_eos=False, temperature=temperature, top_k=top_k, top_p=top_p, stop=stop,
                          verbose=False)
