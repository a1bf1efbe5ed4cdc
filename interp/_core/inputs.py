"""The one input contract of every analysis: text or token ids in, checked ids [batch, pos] and a mask out.

Every public function of interp that reads text or token ids goes through here, so they all take the
same things and refuse the same things with the forward's own words (`sprout.tl.text`): float or bool ids
(1.7 never becomes token 1), ids outside the vocabulary, sequences longer than the context, empty input.

- `token_batch` gives one batch [batch, pos] for analyses that compare positions across rows
  (patching, attribution). A list of texts of unequal token length is padded (the tokenizer's pad id,
  on `padding_side`) and comes with its attention mask, which the analysis must honour (pass it to every
  forward, score real tokens only) or refuse with `TokenBatch.unpadded`.
- `token_rows` gives unpadded 1-D rows for analyses that stream over data (lens, losses, head scores):
  a text or row longer than the window is cut into consecutive windows; rows of unequal length are
  batched apart (`interp._core.batching.batches`), never padded.
- `windows` is the one place a sequence is cut into windows (the rows above, the tuned lens' training
  windows, the experiments' held-out windows).
"""
from __future__ import annotations

from typing import NamedTuple, Optional, Sequence, TypeGuard, Union

import torch
from jaxtyping import Int

from sprout.tl.text import check_attention_mask, check_integer_ids, check_tokens, tokens_and_mask
from sprout.tokenizer import encode

from .model import HookedModel

# text, a list of texts or of 1-D id rows, or ids [pos] / [batch, pos]
TextOrTokens = Union[str, list, Int[torch.Tensor, "*batch pos"]]


class TokenBatch(NamedTuple):
    """Checked token ids [batch, pos] (int64, on the model's device) and their attention mask [batch, pos]
    (1 = token, 0 = padding; None when nothing is padded)."""

    ids: Int[torch.Tensor, "batch pos"]
    mask: Optional[Int[torch.Tensor, "batch pos"]]

    def unpadded(self, what: str) -> Int[torch.Tensor, "batch pos"]:
        """The ids, or a ValueError for `what` (an analysis that cannot honour padding) if any row is padded."""
        if self.mask is None:
            return self.ids
        lengths = self.mask.sum(1).tolist()
        raise ValueError(f"{what} cannot honour padding: the rows have {lengths} real tokens, so the shorter ones "
                         f"would be padded to {self.ids.shape[1]}; pass texts of equal token length (or ids [batch, pos])")


def _is_texts(data: object) -> TypeGuard[Sequence[str]]:
    return isinstance(data, (list, tuple)) and len(data) > 0 and all(isinstance(t, str) for t in data)


def _is_id_rows(data) -> bool:
    return isinstance(data, (list, tuple)) and len(data) > 0 and all(isinstance(t, torch.Tensor) for t in data)


def _refuse_mixed(data) -> None:
    if isinstance(data, (list, tuple)) and any(isinstance(t, str) for t in data) and any(isinstance(t, torch.Tensor) for t in data):
        raise TypeError("a list of inputs must hold only texts or only 1-D token id tensors, not both")


def _pad_id(model: HookedModel) -> int:
    return getattr(getattr(model, "tokenizer", None), "pad_token_id", None) or 0


def _padding_side(model: HookedModel) -> str:
    return getattr(getattr(model, "tokenizer", None), "padding_side", None) or "right"


def _pad_rows(model: HookedModel, rows: list[torch.Tensor], padding_side: Optional[str]) -> TokenBatch:
    """1-D id rows of any lengths -> ids [batch, longest] and a mask (None when all are equal)."""
    longest = max(len(r) for r in rows)
    if all(len(r) == longest for r in rows):
        return TokenBatch(check_tokens(model, torch.stack(rows)), None)
    side = padding_side or _padding_side(model)
    if side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right', got {side!r}")
    ids = torch.full((len(rows), longest), _pad_id(model), dtype=torch.long)
    mask = torch.zeros(len(rows), longest, dtype=torch.long)
    for i, r in enumerate(rows):
        where = slice(longest - len(r), None) if side == "left" else slice(0, len(r))
        ids[i, where], mask[i, where] = r, 1
    ids = check_tokens(model, ids.to(model.cfg.device))
    return TokenBatch(ids, mask.to(ids.device))


def _row(t: torch.Tensor) -> torch.Tensor:
    check_integer_ids(t)
    if t.dim() == 2 and t.shape[0] == 1:
        t = t[0]
    if t.dim() != 1 or t.numel() == 0:
        raise ValueError(f"each row of token ids must be a non-empty [pos] tensor, got shape {tuple(t.shape)}")
    return t.long().cpu()


def masked(mask: Optional[Int[torch.Tensor, "batch pos"]], n: int = 1) -> dict:
    """The forward's keyword for `n` stacked copies of a batch with attention mask [batch, pos] (or None)."""
    return {} if mask is None else {"attention_mask": mask.repeat(n, 1)}


def token_batch(model: HookedModel, data: TextOrTokens, *, attention_mask: Optional[Int[torch.Tensor, "batch pos"]] = None,
                padding_side: Optional[str] = None) -> TokenBatch:
    """Text, a list of texts, ids [pos] / [batch, pos], or a list of 1-D id tensors -> (ids, mask).

    Args:
        model: the hooked model the ids are for (its tokenizer, vocabulary and context are checked).
        data: what the analysis reads. A list of texts (or of id rows) of unequal length is padded.
        attention_mask: the caller's mask [batch, pos] for ids (1 token, 0 padding); it replaces the
            one padding would make, as in the forward.
        padding_side: "left" or "right" (default the tokenizer's, "right").

    Returns:
        TokenBatch(ids [batch, pos] int64, mask [batch, pos] int64 or None when no position is padding).

    Raises:
        TypeError: float, bool or complex ids; a type that is neither text nor ids.
        ValueError: empty input, ids outside the vocabulary, more tokens than the context, a bad mask.
    """
    if isinstance(data, str) or _is_texts(data):
        ids, mask = tokens_and_mask(model, list(data) if isinstance(data, tuple) else data, padding_side=padding_side)
        batch = TokenBatch(ids, mask)
    elif _is_id_rows(data):
        batch = _pad_rows(model, [_row(t) for t in data], padding_side)
    else:
        _refuse_mixed(data)
        # the forward's checks and words, for every other type; ids go where the model is
        batch = TokenBatch(check_tokens(model, data).to(model.cfg.device), None)
    if attention_mask is not None:
        batch = TokenBatch(batch.ids, check_attention_mask(attention_mask, batch.ids).long())
    if batch.mask is not None and bool(batch.mask.bool().all()):
        batch = TokenBatch(batch.ids, None)
    return batch


def token_rows(model: HookedModel, data: TextOrTokens, seq_len: Optional[int] = None) -> list[Int[torch.Tensor, " pos"]]:
    """Text, a list of texts, ids [pos] / [batch, pos] or a list of 1-D id tensors -> checked 1-D id rows
    of at most `seq_len` tokens (default the model's context).

    A text or row longer than `seq_len` is cut into consecutive windows, the last one shorter; nothing
    is dropped or padded. Every window passes the forward's checks (integer ids inside the vocabulary).
    """
    n_ctx = int(model.cfg.n_ctx)
    if seq_len is None:
        seq_len = n_ctx
    if isinstance(seq_len, bool) or not hasattr(type(seq_len), "__index__") or not 1 <= int(seq_len) <= n_ctx:
        raise ValueError(f"seq_len must be an integer in 1..{n_ctx} (the model's context), got {seq_len!r}")
    seq_len = int(seq_len)
    rows: list[torch.Tensor] = []
    for row in sequences(model, data):
        rows.extend(check_tokens(model, w[None])[0] for w in slices(row, seq_len))
    return rows


def slices(ids: Union[Sequence, Int[torch.Tensor, " pos"]], length: int, stride: Optional[int] = None, drop_last: bool = False) -> list:
    """A sequence of ids (a 1-D tensor or a list) cut into slices of `length` ids, one starting every
    `stride` (default `length`: consecutive, no overlap), in order. Unlike `sprout.tl.text.windows`, which
    moves its last window back so that all have one length, the last slice here may be shorter.

    The last window ends at the sequence's end and may be shorter; with `drop_last`, only whole windows
    of `length` are kept (none when the sequence is shorter than one). Nothing is padded or copied.

    Example:
        >>> slices(list(range(7)), 3)
        [[0, 1, 2], [3, 4, 5], [6]]
        >>> slices(list(range(7)), 3, stride=2, drop_last=True)
        [[0, 1, 2], [2, 3, 4], [4, 5, 6]]
    """
    for name, value in (("length", length), ("stride", length if stride is None else stride)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"slices: {name} must be an integer >= 1, got {value!r}")
    stride, n, out = length if stride is None else stride, len(ids), []
    for start in range(0, n, stride):
        if drop_last and start + length > n:
            break
        out.append(ids[start:start + length])
        if start + length >= n:
            break
    return out


def stream_windows(model: HookedModel, data: TextOrTokens, seq_len: Optional[int] = None) -> Int[torch.Tensor, "n_windows pos"]:
    """The data's tokens as one stream cut into [n_windows, seq_len] rows (a shorter tail is dropped)."""
    stream = torch.cat(token_rows(model, data, seq_len))  # seq_len checked there
    seq_len = int(model.cfg.n_ctx) if seq_len is None else int(seq_len)
    rows = slices(stream, seq_len, drop_last=True)
    if not rows:
        raise ValueError(f"the data has {stream.numel()} tokens, fewer than one window of seq_len={seq_len}: "
                         "pass more text or a smaller seq_len")
    return torch.stack(rows)


def sequences(model: HookedModel, data: TextOrTokens) -> list[Int[torch.Tensor, " pos"]]:
    """The data as whole 1-D id sequences, integer-checked; a text may be longer than the context here (the
    caller cuts it and passes each piece through `check_tokens`)."""
    if isinstance(data, torch.Tensor):
        check_integer_ids(data)
        if data.dim() not in (1, 2) or data.numel() == 0:
            raise ValueError(f"token ids must be a non-empty [pos] or [batch, pos] tensor, got shape {tuple(data.shape)}")
        return list(data.reshape(-1, data.shape[-1]).long())
    if isinstance(data, str) or _is_texts(data) or _is_id_rows(data):
        return [_encode(model, t) if isinstance(t, str) else _row(t) for t in ([data] if isinstance(data, str) else data)]
    if isinstance(data, (list, tuple)) and len(data) == 0:
        raise ValueError("no texts given")
    _refuse_mixed(data)
    check_tokens(model, data)  # anything else: the forward's refusal (a list of ints, a NumPy array, mixed lists)
    raise TypeError(f"expected text, a list of texts or token ids, got {type(data).__name__}")


def _encode(model: HookedModel, text: str) -> torch.Tensor:
    if getattr(model, "tokenizer", None) is None:
        raise ValueError(f"{type(model).__name__} has no tokenizer, so it cannot read text: pass token ids")
    if text == "":
        raise ValueError("the text is empty: there is nothing to run the model on")
    return torch.tensor(encode(model.tokenizer, text), dtype=torch.long)
