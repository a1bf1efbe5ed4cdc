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
    ids = [_encode(model, t) for t in texts]
    lengths = sorted({len(i) for i in ids})
    if len(lengths) > 1:
        raise ValueError(f"texts tokenize to different lengths {lengths}; pass them one at a time or pad them yourself")
    return check_tokens(model, torch.tensor(ids, dtype=torch.long, device=device))


def check_tokens(model, idx) -> torch.Tensor:
    """Validate token ids (or tokenize text) for a forward pass; returns ids [batch, pos]."""
    if isinstance(idx, (str, list, tuple)):
        return to_tokens(model, idx)
    if not isinstance(idx, torch.Tensor):
        raise TypeError(f"expected token ids as a torch.Tensor [batch, pos] or text, got {type(idx).__name__}")
    if idx.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8, torch.int8):
        raise TypeError(f"token ids must be an integer tensor, got dtype {idx.dtype}")
    if idx.dim() == 1:
        idx = idx[None]
    if idx.dim() != 2:
        raise ValueError(f"token ids must have shape [batch, pos], got shape {tuple(idx.shape)}")
    T, n_ctx, vocab = idx.size(1), model.cfg.n_ctx, model.cfg.d_vocab
    if T == 0:
        raise ValueError("the sequence is empty (0 tokens)")
    if T > n_ctx:
        raise ValueError(f"sequence of {T} tokens is longer than the model's context of {n_ctx} tokens; "
                         "split it (interp functions take slide=True) instead of truncating silently")
    lo, hi = int(idx.min()), int(idx.max())
    if lo < 0 or hi >= vocab:
        bad = lo if lo < 0 else hi
        raise ValueError(f"token id {bad} is out of range for a vocabulary of {vocab} (valid: 0..{vocab - 1})")
    return idx.long()


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
