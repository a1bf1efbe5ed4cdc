"""`model.tokenizer` as Hugging Face's `PreTrainedTokenizerFast`, so TransformerLens code runs on it.

TransformerLens reads `bos_token_id`, `pad_token`, `padding_side`, calls the tokenizer on lists of
texts (`tokenize_and_concatenate`) and decodes with `tokenizer.decode`. Sprout's tokenizers are plain
`tokenizers.Tokenizer` objects; this wraps one without changing an id.

Special tokens follow GPT-2's use in TransformerLens: `<|endoftext|>`, when the tokenizer has it, is
the BOS, EOS and pad token: `prepend_bos=True` puts it first (the demos were trained without it, so
`model.cfg.default_prepend_bos` is False). A character tokenizer has no special tokens: its pad token
is id 0's character (padded positions are masked, never read), BOS and EOS are None, and
`prepend_bos=True` is refused.
"""
from __future__ import annotations

from typing import Any, Iterable, Optional, Union, cast

from tokenizers import Encoding, Tokenizer
from tokenizers.models import Model
from transformers import PreTrainedTokenizerFast

from .tokenizer import EOT, decode


class Ids(list[int]):
    """Hugging Face's `encode` result (a list of ids) that also reads as the raw tokenizer's `Encoding`
    (`.ids`, `.offsets`, `.tokens`), so code written against `tokenizers.Tokenizer.encode` keeps working."""

    def __init__(self, ids: Iterable[int], encoding: Encoding) -> None:
        super().__init__(ids)
        self.encoding = encoding

    @property
    def ids(self) -> list[int]:
        return list(self)

    @property
    def offsets(self) -> list[tuple[int, int]]:
        """(start, end) character offsets of each token in the text."""
        return self.encoding.offsets

    @property
    def tokens(self) -> list[str]:
        """Each token's string, as the raw tokenizer writes it (byte-level BPE's "Ġ" for a space)."""
        return self.encoding.tokens


class SproutTokenizer(PreTrainedTokenizerFast):
    """A PreTrainedTokenizerFast over a `tokenizers.Tokenizer`, answering the raw tokenizer's calls too.

    `get_vocab_size`, `token_to_id`, `id_to_token`, `to_str` and `save` reach the raw tokenizer, so code
    written for it keeps working; `encode` is Hugging Face's (a list of ids) and its result also has the
    raw `Encoding`'s `.ids` and `.offsets`. Decoding shows ids the
    tokenizer lacks as `<unk:ID>` (as `sprout.tokenizer.decode`), never dropping them.
    """

    @classmethod
    def wrap(cls, tok: Tokenizer) -> "SproutTokenizer":
        special: dict[str, Optional[str]] = {}
        if tok.token_to_id(EOT) is not None:
            special = dict(bos_token=EOT, eos_token=EOT, pad_token=EOT)
        elif tok.get_vocab_size() > 0:
            special = dict(pad_token=tok.id_to_token(0))
        return cls(tokenizer_object=tok, clean_up_tokenization_spaces=False, padding_side="right", **special)

    def encode(self, text: Union[str, list[str], list[int]], *args: Any, **kwargs: Any) -> list[int]:
        # an `Ids` (also `.ids`, `.offsets`, `.tokens`) when text is a str; the base's list otherwise
        ids = super().encode(text, *args, **kwargs)
        if not isinstance(text, str):
            return ids
        return Ids(ids, self.backend_tokenizer.encode(text, add_special_tokens=kwargs.get("add_special_tokens", True)))

    def get_vocab_size(self, with_added_tokens: bool = True) -> int:
        return self.backend_tokenizer.get_vocab_size(with_added_tokens)

    def token_to_id(self, token: str) -> Optional[int]:
        return self.backend_tokenizer.token_to_id(token)

    def id_to_token(self, i: int) -> Optional[str]:
        return self.backend_tokenizer.id_to_token(i)

    def to_str(self, pretty: bool = False) -> str:
        return self.backend_tokenizer.to_str(pretty)

    def save(self, path: str, pretty: bool = True) -> None:
        self.backend_tokenizer.save(str(path), pretty)

    @property
    def model(self) -> Model:  # type: ignore[override]  # transformers' class attribute `model` (None) is read-only here
        return self.backend_tokenizer.model

    def _decode(self, token_ids, skip_special_tokens: bool = False, clean_up_tokenization_spaces=None, **kwargs) -> str:
        ids = [token_ids] if isinstance(token_ids, int) else token_ids
        return decode(self.backend_tokenizer, ids, skip_special_tokens=skip_special_tokens)


def as_hf(tok: Union[Tokenizer, PreTrainedTokenizerFast, None]) -> Optional[PreTrainedTokenizerFast]:
    """A tokenizer as `model.tokenizer` holds it: a `SproutTokenizer` (Hugging Face's fast tokenizer)
    over a `tokenizers.Tokenizer`. None stays None; a Hugging Face tokenizer is kept as it is."""
    if tok is None or hasattr(tok, "backend_tokenizer"):
        return cast(Optional[PreTrainedTokenizerFast], tok)
    if not isinstance(tok, Tokenizer):
        raise TypeError(f"expected a tokenizers.Tokenizer or a transformers fast tokenizer, got {type(tok).__name__}")
    return SproutTokenizer.wrap(tok)
