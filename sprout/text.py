"""Text in, text out, for any hooked model here that carries a tokenizer (Sprout, the walkthrough GPT).

These read only `model.cfg.d_vocab`, `model.cfg.n_ctx` and `model.tokenizer`, so every model family
shares them. Every check names what is wrong: no silent truncation, no silent id wrap-around.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from .tokenizer import decode, encode


def _tokenizer(model):
    tok = getattr(model, "tokenizer", None)
    if tok is None:
        raise ValueError(
            "this model has no tokenizer, so it cannot read text: pass token ids, or give it one "
            "(model.tokenizer = sprout.tokenizer.load_tokenizer('tokenizer.json'))"
        )
    return tok


def _encode(model, text: str) -> list[int]:
    if not isinstance(text, str):
        raise TypeError(f"expected text (str), got {type(text).__name__}")
    if text == "":
        raise ValueError("the text is empty: there is nothing to run the model on")
    return encode(_tokenizer(model), text)


def check_prepend_bos(model, prepend_bos) -> None:
    """Sprout and the walkthrough GPT were trained without a BOS token: asking for one is an error."""
    if prepend_bos is None:
        prepend_bos = getattr(model.cfg, "default_prepend_bos", False)
    if prepend_bos:
        raise ValueError(
            f"{type(model).__name__} was trained without a BOS token, so prepend_bos=True would feed it a "
            "token it never saw first; use prepend_bos=False (the default, model.cfg.default_prepend_bos). "
            "TransformerLens helpers that take prepend_bos (test_prompt, induction_loss) work with the default")


def tokens_and_mask(model, text, prepend_bos=None, padding_side=None):
    """Text or a list of texts -> (ids [batch, pos], attention_mask [batch, pos] or None).

    Texts of unequal token length are padded with the tokenizer's pad token on `padding_side` (default
    the tokenizer's, "right"); the mask is 1 at real tokens and 0 at padding, and None when nothing
    was padded.
    """
    check_prepend_bos(model, prepend_bos)
    texts = [text] if isinstance(text, str) else list(text)
    if not texts:
        raise ValueError("no texts given")
    if not all(isinstance(t, str) for t in texts):
        kinds = sorted({type(t).__name__ for t in texts if not isinstance(t, str)})
        raise TypeError(f"expected text (str) or a list of texts, got a list holding {', '.join(kinds)}; "
                        "pass token ids as a torch.Tensor [batch, pos]")
    ids = [_encode(model, t) for t in texts]
    longest = max(len(i) for i in ids)
    if all(len(i) == longest for i in ids):
        return check_tokens(model, torch.tensor(ids, dtype=torch.long, device=model.cfg.device)), None
    tok = _tokenizer(model)
    side = padding_side or getattr(tok, "padding_side", "right")
    if side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right', got {side!r}")
    pad = getattr(tok, "pad_token_id", None) or 0
    rows, mask = [], []
    for i in ids:
        fill = [pad] * (longest - len(i))
        rows.append(fill + i if side == "left" else i + fill)
        ones, zeros = [1] * len(i), [0] * len(fill)
        mask.append(zeros + ones if side == "left" else ones + zeros)
    device = model.cfg.device
    return (check_tokens(model, torch.tensor(rows, dtype=torch.long, device=device)),
            torch.tensor(mask, dtype=torch.long, device=device))


def to_tokens(model, text, prepend_bos=None, padding_side=None) -> torch.Tensor:
    """Text, a list of texts (padded to the longest), or ids -> ids [batch, pos] on the model's device."""
    if isinstance(text, torch.Tensor):
        return check_tokens(model, text)
    return tokens_and_mask(model, text, prepend_bos, padding_side)[0]


def check_attention_mask(mask, ids: torch.Tensor) -> torch.Tensor:
    """An attention mask [batch, pos] of 0/1 (or bool) with one entry per token and a real token in every row."""
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"attention_mask must be a torch.Tensor [batch, pos] of 0 and 1, got {type(mask).__name__}")
    if mask.shape != ids.shape:
        raise ValueError(f"attention_mask has shape {tuple(mask.shape)} but the tokens have shape {tuple(ids.shape)}")
    if mask.is_floating_point() or mask.is_complex() or not ((mask == 0) | (mask == 1)).all():
        raise ValueError("attention_mask must hold only 0 (padding) and 1 (real token), as integers or bools")
    if not mask.bool().any(dim=1).all():
        raise ValueError("attention_mask has a row with no real token (all zeros)")
    return mask.to(ids.device)


def as_ids(tokens) -> torch.Tensor:
    """An int, a NumPy array, a list or a tensor of token ids -> an integer tensor; floats and bools are a TypeError."""
    if isinstance(tokens, bool):
        raise TypeError("token ids must be integers, got a bool")
    if not isinstance(tokens, torch.Tensor):
        try:
            tokens = torch.as_tensor(tokens)
        except (TypeError, ValueError, RuntimeError) as e:
            raise TypeError(f"expected token ids (ints, a list, a NumPy array or a tensor), got {type(tokens).__name__}") from e
    if tokens.dtype == torch.bool or tokens.is_floating_point() or tokens.is_complex():
        raise TypeError(f"token ids must be an integer tensor, got dtype {tokens.dtype} (ids are never rounded)")
    return tokens


def check_integer_ids(idx: torch.Tensor) -> None:
    """Token ids are integers: a float or bool tensor is a TypeError (1.7 must not quietly become token 1)."""
    if idx.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8, torch.int8):
        raise TypeError(f"token ids must be an integer tensor, got dtype {idx.dtype} (ids are never rounded)")


def check_tokens(model, idx) -> torch.Tensor:
    """Validate token ids (or tokenize text) for a forward pass; returns ids [batch, pos]."""
    if isinstance(idx, (str, list, tuple)):
        return to_tokens(model, idx)
    if not isinstance(idx, torch.Tensor):
        raise TypeError(f"expected token ids as a torch.Tensor [batch, pos] or text, got {type(idx).__name__}")
    check_integer_ids(idx)
    if idx.dim() == 1:
        idx = idx[None]
    if idx.dim() != 2:
        raise ValueError(f"token ids must have shape [batch, pos], got shape {tuple(idx.shape)}")
    T, n_ctx, vocab = idx.size(1), model.cfg.n_ctx, model.cfg.d_vocab
    if T == 0:
        raise ValueError("the sequence is empty (0 tokens)")
    if idx.size(0) == 0:
        raise ValueError(f"the batch is empty: shape {tuple(idx.shape)}")
    if T > n_ctx:
        raise ValueError(f"sequence of {T} tokens is longer than the model's context of {n_ctx} tokens; "
                         f"nothing is truncated silently: cut it into windows yourself, e.g. "
                         f"sprout.text.windows(ids, {n_ctx})")
    lo, hi = int(idx.min()), int(idx.max())
    if lo < 0 or hi >= vocab:
        bad = lo if lo < 0 else hi
        raise ValueError(f"token id {bad} is out of range for a vocabulary of {vocab} (valid: 0..{vocab - 1})")
    return idx.long()


def windows(ids, size: int, stride: Optional[int] = None) -> torch.Tensor:
    """Cut one long sequence into windows of `size` tokens, the explicit alternative to truncation.

    Windows start every `stride` tokens (default `size`: no overlap); the last one is moved back to end
    at the last token, so every token is in some window and all windows have the same length (the last
    may overlap the one before it). A sequence that fits is one window.

    Args:
        ids: token ids [pos] or [1, pos] (a tensor or a list); for a long text,
            `sprout.tokenizer.encode(model.tokenizer, text)`.
        size: the window length, e.g. `model.cfg.n_ctx`.
        stride: tokens between window starts, 1..size.

    Returns:
        ids [n_windows, min(size, pos)]; windows(ids, size)[i] == ids[starts[i]:starts[i] + size].
    """
    stride = size if stride is None else stride
    if not 1 <= stride <= size:
        raise ValueError(f"need 1 <= stride <= size, got stride={stride}, size={size}")
    ids = torch.as_tensor(ids)
    if ids.dim() == 2 and ids.size(0) == 1:
        ids = ids[0]
    if ids.dim() != 1 or ids.numel() == 0:
        raise ValueError(f"windows cuts one non-empty sequence [pos] or [1, pos], got shape {tuple(ids.shape)}")
    pos = ids.numel()
    if pos <= size:
        return ids[None]
    starts = list(range(0, pos - size, stride)) + [pos - size]
    return torch.stack([ids[s:s + size] for s in starts])


def to_str_tokens(model, text, prepend_bos=None, padding_side=None) -> list:
    """Each token as the text it decodes to: a list for one sequence, a list of lists for a batch.

    Takes text, a list of texts, or ids (tensor, NumPy array, list of ints). Ids the tokenizer lacks
    read `<unk:ID>`, as in every decode path here.
    """
    if isinstance(text, str) or (isinstance(text, (list, tuple)) and text and all(isinstance(t, str) for t in text)):
        ids = to_tokens(model, text, prepend_bos, padding_side)
        if isinstance(text, str):
            ids = ids[0]
    else:
        ids = as_ids(text)
    if ids.dim() == 2 and ids.size(0) == 1 and not isinstance(text, (list, tuple)):
        ids = ids[0]
    if ids.dim() == 2:
        return [to_str_tokens(model, row) for row in ids]
    if ids.dim() > 2:
        raise ValueError(f"expected token ids [pos] or [batch, pos], got shape {tuple(ids.shape)}")
    tok = _tokenizer(model)
    return [decode(tok, [i]) for i in ids.reshape(-1).tolist()]


def to_string(model, tokens):
    """Token ids -> text: an int, a 0-d or 1-D tensor (or list, or NumPy array) gives a str, [batch, pos] a
    list of str. Ids the tokenizer lacks read `<unk:ID>`."""
    tokens = as_ids(tokens)
    if tokens.dim() == 2:
        return [to_string(model, row) for row in tokens]
    if tokens.dim() > 2:
        raise ValueError(f"expected token ids [pos] or [batch, pos], got shape {tuple(tokens.shape)}")
    return decode(_tokenizer(model), tokens.reshape(-1).tolist())


def _next_token(logits: torch.Tensor, do_sample: bool, temperature: float, top_k, top_p) -> torch.Tensor:
    """One id per row from the last position's logits [batch, vocab]: argmax, or temperature, top-k, top-p."""
    if not do_sample or temperature == 0:
        return logits.argmax(-1, keepdim=True)
    logits = logits / temperature
    if top_k:
        kth = torch.topk(logits, min(int(top_k), logits.size(-1))).values[:, -1, None]
        logits = logits.masked_fill(logits < kth, -float("inf"))
    probs = F.softmax(logits, dim=-1)
    if top_p is not None and top_p < 1.0:
        sorted_p, order = probs.sort(descending=True)
        sorted_p[sorted_p.cumsum(-1) - sorted_p > top_p] = 0  # keep the smallest set reaching top_p
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        probs /= probs.sum(-1, keepdim=True)
    return torch.multinomial(probs, 1)


def _check_sampling(max_new_tokens, temperature, top_k, top_p):
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    if not (isinstance(temperature, (int, float)) and temperature >= 0):
        raise ValueError(f"temperature must be a number >= 0, got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be None or an integer >= 1, got {top_k!r}")
    if top_p is not None and not (isinstance(top_p, (int, float)) and 0 < top_p <= 1):
        raise ValueError(f"top_p must be None or a number in (0, 1], got {top_p!r}")


@torch.no_grad()
def generate(model, input, max_new_tokens: int = 10, stop_at_eos: bool = True, eos_token_id=None,
             do_sample: bool = True, top_k: Optional[int] = None, top_p: Optional[float] = None,
             temperature: float = 1.0, freq_penalty: float = 0.0, stop=None, prepend_bos=None,
             padding_side=None, return_type: str = "input", verbose: bool = False):
    """Sample `max_new_tokens` tokens after `input` (TransformerLens' generate; model.py's sampler).

    Text in gives text out (`return_type="input"`; "str" or "tokens" to choose). A list of texts of
    unequal length is padded on the left and masked. A row stops at `eos_token_id` (default the
    tokenizer's EOS) or at an id in `stop` (model.py's argument); finished rows are filled with that id
    until every row has stopped. There is no KV cache: each step reruns the last `n_ctx` tokens, which
    gives the same tokens as a cache would.
    """
    _check_sampling(max_new_tokens, temperature, top_k, top_p)
    if return_type not in ("input", "str", "tokens"):
        raise ValueError(f"return_type must be 'input', 'str' or 'tokens', got {return_type!r}")
    as_text = isinstance(input, str) or (isinstance(input, (list, tuple)) and bool(input) and isinstance(input[0], str))
    if as_text:
        idx, mask = tokens_and_mask(model, input, prepend_bos, padding_side or "left")
    else:
        idx, mask = check_tokens(model, input), None
    stops = set(int(i) for i in stop) if stop is not None else set()
    eos = eos_token_id if eos_token_id is not None else getattr(getattr(model, "tokenizer", None), "eos_token_id", None)
    if stop_at_eos and eos is not None:
        stops |= {int(eos)} if isinstance(eos, int) else set(int(i) for i in eos)
    finished = torch.zeros(idx.size(0), dtype=torch.bool, device=idx.device)
    n_ctx = model.cfg.n_ctx
    steps = range(max_new_tokens)
    if verbose:
        from tqdm.auto import tqdm

        steps = tqdm(steps)
    for _ in steps:
        window_mask = None if mask is None else mask[:, -n_ctx:]
        logits = model(idx[:, -n_ctx:], attention_mask=window_mask, return_type="logits")[:, -1, :].float()
        if freq_penalty:
            logits = logits - freq_penalty * torch.zeros_like(logits).scatter_add_(
                -1, idx, torch.ones_like(idx, dtype=logits.dtype))
        nxt = _next_token(logits, do_sample, temperature, top_k, top_p)
        if stops:
            fill = next(iter(sorted(stops)))
            nxt = torch.where(finished[:, None], torch.full_like(nxt, fill), nxt)
            finished |= torch.isin(nxt[:, 0], torch.tensor(sorted(stops), device=nxt.device))
        idx = torch.cat((idx, nxt), dim=1)
        if mask is not None:
            mask = torch.cat((mask, torch.ones_like(nxt)), dim=1)
        if stops and bool(finished.all()):
            break
    if return_type == "tokens" or (return_type == "input" and not as_text):
        return idx
    texts = to_string(model, idx) if mask is None else [to_string(model, row[m.bool()]) for row, m in zip(idx, mask)]
    return texts[0] if isinstance(input, str) else texts


def sample(model, idx, max_new: int, temperature: float = 0.8, top_k: Optional[int] = None,
           top_p: Optional[float] = 0.95, stop=None):
    """model.py's sampler with model.py's defaults (temperature 0.8, top-p 0.95); text in gives text out."""
    return generate(model, idx, max_new, stop_at_eos=False, temperature=temperature, top_k=top_k, top_p=top_p,
                    stop=stop)
