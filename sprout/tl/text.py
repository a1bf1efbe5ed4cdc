"""Text in, text out, for any hooked model here that carries a tokenizer (Sprout, the walkthrough GPT).

These read only `model.cfg.d_vocab`, `model.cfg.n_ctx`, `model.cfg.default_prepend_bos` and
`model.tokenizer`, so every model family shares them. Every check names what is wrong: no silent id
wrap-around, and no truncation except TransformerLens' own: `to_tokens`' (`truncate=True`, its default)
and the forward's and `run_with_cache`'s of text (with a warning naming the cut); `generate` and the
analyses refuse a text longer than the context.

BOS: with `prepend_bos=True` (or `model.cfg.default_prepend_bos = True`) a text starts with
`<|endoftext|>`, GPT-2's BOS. The demos were trained without it (their documents are separated by
blank lines), so the default is False; docs/guide/transformerlens.md (BOS) measures what it does.
"""
from __future__ import annotations

import warnings
from typing import Any, Optional, Protocol, Sequence, Union

import torch
from jaxtyping import Int
from transformer_lens.utilities import get_attention_mask

from ..tokenizer import EOT, decode, encode


class TextModel(Protocol):
    """What these functions read of a model: its TransformerLens config (`d_vocab`, `n_ctx`, `device`,
    `default_prepend_bos`) and its tokenizer (a Hugging Face tokenizer, or None)."""

    @property
    def cfg(self) -> Any: ...
    @property
    def tokenizer(self) -> Any: ...


# one text or a list of texts
Texts = Union[str, Sequence[str]]
Device = Union[str, torch.device]


def _tokenizer(model):
    tok = getattr(model, "tokenizer", None)
    if tok is None:
        raise ValueError(
            "this model has no tokenizer, so it cannot read text: pass token ids, or give it one "
            "(model.tokenizer = sprout.tokenizer.load_tokenizer('tokenizer.json'))"
        )
    return tok


def _encode(model, text: str, bos: Optional[int] = None, allow_empty: bool = False) -> list[int]:
    if not isinstance(text, str):
        raise TypeError(f"expected text (str), got {type(text).__name__}")
    ids = ([] if bos is None else [bos]) + (encode(_tokenizer(model), text) if text else [])
    if not ids and not allow_empty:
        raise ValueError("the text is empty: there is nothing to run the model on")
    return ids


def bos_token_id(model: TextModel, prepend_bos: Optional[bool]) -> Optional[int]:
    """The BOS id to put before each text, or None: `prepend_bos` (None = `model.cfg.default_prepend_bos`).

    The BOS is `<|endoftext|>`, as GPT-2's. A tokenizer without it (the character tokenizers) has
    no BOS, and asking for one is an error.
    """
    if prepend_bos is None:
        prepend_bos = getattr(model.cfg, "default_prepend_bos", False)
    if not isinstance(prepend_bos, bool):
        raise TypeError(f"prepend_bos must be True, False or None (model.cfg.default_prepend_bos), got {prepend_bos!r}")
    if not prepend_bos:
        return None
    bos = getattr(_tokenizer(model), "bos_token_id", None)
    if bos is None:
        raise ValueError(
            f"prepend_bos=True needs a BOS token, and this {type(model).__name__}'s tokenizer has none (a character "
            f"tokenizer has no {EOT}); use prepend_bos=False (model.cfg.default_prepend_bos is "
            f"{getattr(model.cfg, 'default_prepend_bos', False)})")
    return int(bos)


def check_prepend_bos(model: TextModel, prepend_bos: object) -> None:
    """prepend_bos with token ids in is ignored, as in TransformerLens (it applies to text); it must still be a bool or None."""
    if prepend_bos is not None and not isinstance(prepend_bos, bool):
        raise TypeError(f"prepend_bos must be True, False or None, got {prepend_bos!r}")


def _check_texts(text) -> list[str]:
    texts = [text] if isinstance(text, str) else list(text)
    if not texts:
        raise ValueError("no texts given")
    if not all(isinstance(t, str) for t in texts):
        kinds = sorted({type(t).__name__ for t in texts if not isinstance(t, str)})
        raise TypeError(f"expected text (str) or a list of texts, got a list holding {', '.join(kinds)}; "
                        "pass token ids as a torch.Tensor [batch, pos]")
    return texts


def pad_rows(model: TextModel, ids: list[list[int]], padding_side: Optional[str] = None, device: Optional[Device] = None
             ) -> tuple[Int[torch.Tensor, "batch pos"], Optional[Int[torch.Tensor, "batch pos"]]]:
    """Rows of ids -> (ids [batch, longest], attention_mask [batch, longest] or None when nothing was padded).

    Shorter rows are padded with the tokenizer's pad token on `padding_side` (default the tokenizer's,
    "right"); the mask is 1 at real tokens and 0 at padding.
    """
    device = model.cfg.device if device is None else device
    longest = max(len(i) for i in ids)
    if all(len(i) == longest for i in ids):
        return torch.tensor(ids, dtype=torch.long, device=device).view(len(ids), longest), None
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
    return (torch.tensor(rows, dtype=torch.long, device=device),
            torch.tensor(mask, dtype=torch.long, device=device))


def tokens_and_mask(model: TextModel, text: Texts, prepend_bos: Optional[bool] = None, padding_side: Optional[str] = None,
                    truncate: bool = False) -> tuple[Int[torch.Tensor, "batch pos"], Optional[Int[torch.Tensor, "batch pos"]]]:
    """Text or a list of texts -> (ids [batch, pos], attention_mask [batch, pos] or None), for a forward.

    With `prepend_bos` (None = `model.cfg.default_prepend_bos`) each text starts with `<|endoftext|>`.
    Texts of unequal token length are padded with the tokenizer's pad token on `padding_side` (default
    the tokenizer's, "right"); the mask is 1 at real tokens and 0 at padding, and None when nothing
    was padded. A text longer than the context is an error, or with `truncate=True` (what the forward
    and `run_with_cache` pass, as TransformerLens' forward truncates text) cut to its first n_ctx
    tokens with a warning that names the cut.
    """
    if not isinstance(truncate, bool):
        raise TypeError(f"truncate must be True or False, got {truncate!r}")
    bos = bos_token_id(model, prepend_bos)
    rows = [_encode(model, t, bos) for t in _check_texts(text)]
    if truncate:
        rows = _truncated(rows, int(model.cfg.n_ctx))
    idx, mask = pad_rows(model, rows, padding_side)
    return check_tokens(model, idx), mask


def _truncated(rows: list[list[int]], n_ctx: int) -> list[list[int]]:
    """Each row's first n_ctx ids, warning of every row cut (which, how long, how much was dropped)."""
    cut = [(i, len(r)) for i, r in enumerate(rows) if len(r) > n_ctx]
    if cut:
        which = ", ".join(f"text {i} ({n} tokens, the last {n - n_ctx} dropped)" for i, n in cut[:4])
        more = f" and {len(cut) - 4} more" if len(cut) > 4 else ""
        warnings.warn(f"truncated to the model's context of {n_ctx} tokens, as TransformerLens does: {which}{more}. "
                      f"To run all of a long text, cut it into windows: sprout.tl.text.windows(ids, {n_ctx})",
                      stacklevel=5)
    return [r[:n_ctx] for r in rows]


def to_tokens(model: TextModel, text: Union[Texts, Int[torch.Tensor, "*batch pos"]], prepend_bos: Optional[bool] = None,
              padding_side: Optional[str] = None, move_to_device: bool = True, truncate: bool = True) -> Int[torch.Tensor, "batch pos"]:
    """Text, a list of texts (padded to the longest), or ids -> ids [batch, pos] on the model's device.

    As TransformerLens: `truncate=True` keeps each text's first `n_ctx` tokens (its BOS included);
    `truncate=False` returns every token, however long (the forward refuses more than `n_ctx`; cut such
    ids with `sprout.tl.text.windows`). `to_tokens("")` is the BOS alone with prepend_bos, else an empty
    [1, 0] tensor.
    """
    if not isinstance(truncate, bool):
        raise TypeError(f"truncate must be True or False, got {truncate!r}")
    if isinstance(text, torch.Tensor):
        return check_tokens(model, text)
    bos = bos_token_id(model, prepend_bos)
    ids = [_encode(model, t, bos, allow_empty=True) for t in _check_texts(text)]
    n_ctx = model.cfg.n_ctx
    if truncate:
        ids = [i[:n_ctx] for i in ids]
    device = model.cfg.device if move_to_device else "cpu"
    idx, _ = pad_rows(model, ids, padding_side, device)
    if idx.size(1) > 0:
        check_vocab(model, idx)
    return idx


def check_attention_mask(mask: object, ids: Int[torch.Tensor, "batch pos"]) -> Int[torch.Tensor, "batch pos"]:
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


def as_ids(tokens: object) -> Int[torch.Tensor, "..."]:
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


def check_integer_ids(idx: Int[torch.Tensor, "..."]) -> None:
    """Token ids are integers: a float or bool tensor is a TypeError (1.7 must not quietly become token 1)."""
    if idx.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8, torch.int8):
        raise TypeError(f"token ids must be an integer tensor, got dtype {idx.dtype} (ids are never rounded)")


def check_tokens(model: TextModel, idx: object) -> Int[torch.Tensor, "batch pos"]:
    """Validate token ids (or tokenize text) for a forward pass; returns ids [batch, pos]."""
    if isinstance(idx, (str, list, tuple)):
        return tokens_and_mask(model, idx)[0]
    if not isinstance(idx, torch.Tensor):
        raise TypeError(f"expected token ids as a torch.Tensor [batch, pos] or text, got {type(idx).__name__}")
    check_integer_ids(idx)
    if idx.dim() == 1:
        idx = idx[None]
    if idx.dim() != 2:
        raise ValueError(f"token ids must have shape [batch, pos], got shape {tuple(idx.shape)}")
    T, n_ctx = idx.size(1), model.cfg.n_ctx
    if T == 0:
        raise ValueError("the sequence is empty (0 tokens)")
    if idx.size(0) == 0:
        raise ValueError(f"the batch is empty: shape {tuple(idx.shape)}")
    if T > n_ctx:
        raise ValueError(f"sequence of {T} tokens is longer than the model's context of {n_ctx} tokens; "
                         f"nothing is truncated silently: cut it into windows yourself, e.g. "
                         f"sprout.tl.text.windows(ids, {n_ctx})")
    check_vocab(model, idx)
    return idx.long()


def check_vocab(model: TextModel, idx: Int[torch.Tensor, "batch pos"]) -> None:
    """Every id in idx (non-empty) lies in the model's vocabulary."""
    lo, hi, vocab = int(idx.min()), int(idx.max()), model.cfg.d_vocab
    if lo < 0 or hi >= vocab:
        bad = lo if lo < 0 else hi
        raise ValueError(f"token id {bad} is out of range for a vocabulary of {vocab} (valid: 0..{vocab - 1})")


def windows(ids: Union[Int[torch.Tensor, "*one pos"], Sequence[int]], size: int, stride: Optional[int] = None
            ) -> Int[torch.Tensor, "n_windows window"]:
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


def to_str_tokens(model: TextModel, text: object, prepend_bos: Optional[bool] = None, padding_side: Optional[str] = None) -> list:
    """Each token as the text it decodes to.

    A text gives one list (its first `n_ctx` tokens, as TransformerLens); a list of texts one unpadded
    list per text (TransformerLens' convention); ids [pos] (tensor, NumPy array, list of ints) one list,
    [batch, pos] a list per row. Ids the tokenizer lacks read `<unk:ID>`, as in every decode path here.
    """
    if isinstance(text, str):
        ids = to_tokens(model, text, prepend_bos, padding_side)[0]
    elif isinstance(text, (list, tuple)) and text and all(isinstance(t, (str, torch.Tensor)) for t in text):
        return [to_str_tokens(model, t, prepend_bos, padding_side) for t in text]
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


def to_string(model: TextModel, tokens: object) -> Union[str, list]:
    """Token ids -> text: an int, a 0-d or 1-D tensor (or list, or NumPy array) gives a str, [batch, pos] a
    list of str. Ids the tokenizer lacks read `<unk:ID>`."""
    tokens = as_ids(tokens)
    if tokens.dim() == 2:
        return [to_string(model, row) for row in tokens]
    if tokens.dim() > 2:
        raise ValueError(f"expected token ids [pos] or [batch, pos], got shape {tuple(tokens.shape)}")
    return decode(_tokenizer(model), tokens.reshape(-1).tolist())


def leading_pads(model: TextModel, idx: Int[torch.Tensor, "batch pos"]) -> Optional[Int[torch.Tensor, " batch"]]:
    """How many of the tokenizer's pad token begin each row [batch], or None when the pad is not also the
    BOS or EOS (`<|endoftext|>` is all three).

    A character tokenizer pads with a real character (id 0), which text may begin with, so its padding
    cannot be told from text and this is None.
    """
    tok = getattr(model, "tokenizer", None)
    pad = getattr(tok, "pad_token_id", None)
    if pad is None or pad not in (getattr(tok, "bos_token_id", None), getattr(tok, "eos_token_id", None)):
        return None
    return (idx == pad).long().cumprod(1).sum(1)


def warn_if_left_padded(model: TextModel, idx: Int[torch.Tensor, "batch pos"]) -> None:
    """Warn when rows of ids [batch, pos] look left-padded and came without their attention_mask.

    The sign: rows begin with different numbers of the pad token (`<|endoftext|>`, which is also the
    BOS). Left padding without its mask is read as real tokens and shifts every position; the same ids
    with `attention_mask` (as `sprout.tl.text.tokens_and_mask` returns it) are read correctly. The course's
    training call (`targets` given) is not checked.
    """
    if idx.size(0) < 2:
        return
    lead = leading_pads(model, idx)
    if lead is None or int(lead.max()) == int(lead.min()):
        return
    rows = (lead > lead.min()).nonzero().flatten().tolist()
    warnings.warn(
        f"rows {rows[:8]} of these token ids begin with more pad tokens (id {model.tokenizer.pad_token_id}) than "
        "others, as left padding does, and no attention_mask came with them, so the padding is read as real "
        "tokens; pass attention_mask=... (1 = token, 0 = padding), or the texts themselves. If the leading "
        "tokens are real, pass attention_mask=torch.ones_like(tokens) to say so", stacklevel=2)


def mask_from_padding(model: TextModel, idx: Int[torch.Tensor, "batch pos"], padding_side: Optional[str],
                      prepend_bos: Optional[bool] = None) -> Optional[Int[torch.Tensor, "batch pos"]]:
    """TransformerLens' reading of the padding off the pad token (`utilities.get_attention_mask`): the
    leading (left) or trailing (right) run of pad tokens of each row is masked, a BOS that is also the
    pad kept. None when nothing is padded, or when the pad is a real character (`leading_pads`)."""
    if leading_pads(model, idx) is None:
        return None
    side = padding_side or getattr(model.tokenizer, "padding_side", "right")
    bos = getattr(model.cfg, "default_prepend_bos", False) if prepend_bos is None else prepend_bos
    mask = get_attention_mask(model.tokenizer, idx, bos, side)
    return None if bool(mask.all()) else mask
