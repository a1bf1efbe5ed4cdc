"""Text in, text out, for any hooked model here that carries a tokenizer (Sprout, the walkthrough GPT).

These read only `model.cfg.d_vocab`, `model.cfg.n_ctx` and `model.tokenizer`, so every model family
shares them. Every check names what is wrong: no silent truncation, no silent id wrap-around.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F


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
    tok = _tokenizer(model)
    from .tokenizer import encode

    return encode(tok, text)


def to_tokens(model, text, prepend_bos: bool = False) -> torch.Tensor:
    """Text, a list of texts of equal token length, or ids -> ids [batch, pos] on the model's device."""
    device = model.cfg.device
    if isinstance(text, torch.Tensor):
        return check_tokens(model, text)
    if prepend_bos:
        raise ValueError("Sprout models are trained without a BOS token; call to_tokens with prepend_bos=False")
    texts = [text] if isinstance(text, str) else list(text)
    if not texts:
        raise ValueError("no texts given")
    if not all(isinstance(t, str) for t in texts):
        kinds = sorted({type(t).__name__ for t in texts if not isinstance(t, str)})
        raise TypeError(f"expected text (str) or a list of texts, got a list holding {', '.join(kinds)}; "
                        "pass token ids as a torch.Tensor [batch, pos]")
    ids = [_encode(model, t) for t in texts]
    lengths = sorted({len(i) for i in ids})
    if len(lengths) > 1:
        raise ValueError(f"texts tokenize to different lengths {lengths}; pass them one at a time or pad them yourself")
    return check_tokens(model, torch.tensor(ids, dtype=torch.long, device=device))


def check_integer_ids(idx: torch.Tensor) -> None:
    """Token ids are integers: a float or bool tensor is a TypeError (1.7 must not quietly become token 1)."""
    if idx.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8, torch.int8):
        raise TypeError(f"token ids must be an integer tensor, got dtype {idx.dtype}")


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


def to_str_tokens(model, text) -> list:
    ids = to_tokens(model, text) if not isinstance(text, torch.Tensor) else text
    if ids.dim() == 2 and ids.size(0) > 1:
        return [to_str_tokens(model, row) for row in ids]
    tok = _tokenizer(model)
    return [tok.decode([int(i)], skip_special_tokens=False) for i in ids.reshape(-1)]


def to_string(model, tokens):
    tokens = torch.as_tensor(tokens)
    if tokens.dim() == 2:
        return [to_string(model, row) for row in tokens]
    return _tokenizer(model).decode(tokens.tolist(), skip_special_tokens=False)


@torch.no_grad()
def sample(model, idx, max_new: int, temperature: float = 0.8, top_k: Optional[int] = None,
           top_p: Optional[float] = 0.95, stop=None):
    """model.py's sampler: temperature, then top-k, then nucleus (top-p); stops at a token in `stop`."""
    as_text = isinstance(idx, str)
    idx = check_tokens(model, idx)
    n_ctx = model.cfg.n_ctx
    for _ in range(max_new):
        logits, _ = model(idx[:, -n_ctx:])
        logits = logits[:, -1, :].float() / max(temperature, 1e-5)
        if top_k:
            kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1, None]
            logits[logits < kth] = -float("inf")
        probs = F.softmax(logits, dim=-1)
        if top_p and top_p < 1.0:
            sorted_p, order = probs.sort(descending=True)
            drop = sorted_p.cumsum(-1) - sorted_p > top_p
            sorted_p[drop] = 0
            probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
            probs /= probs.sum(-1, keepdim=True)
        nxt = torch.multinomial(probs, 1)
        idx = torch.cat((idx, nxt), dim=1)
        if stop is not None and idx.size(0) == 1 and nxt.item() in stop:
            break
    return to_string(model, idx[0]) if as_text else idx
