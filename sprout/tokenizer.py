"""Tokenizers: byte-level BPE for Sprout, one id per character for the walkthrough's character GPT.

Both are plain `tokenizers.Tokenizer` objects, so they save to and load from one JSON file
(`sprout.files.save_tokenizer` / `load_tokenizer`); `model.tokenizer` wraps one as Hugging Face's fast
tokenizer (`sprout.hf_tokenizer`). Use the helpers `encode` and `decode` rather than the raw methods:
`encode` names characters a character tokenizer has never seen (the raw tokenizer only complains about
a missing unknown token), and `decode` keeps special tokens, so `decode(tok, encode(tok, s)) == s` for
every text `s` a tokenizer can represent.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Iterator, Union, cast

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

EOT = "<|endoftext|>"
# WordLevel needs the name of an unknown token; it is deliberately not in the vocabulary, so an
# unseen character makes the raw tokenizer raise instead of silently mapping to some id.
_CHAR_UNK = "[UNK]"


def _pieces(text: str, size: int = 1 << 16) -> Iterator[str]:
    # One huge string is pre-tokenised on a single thread; pieces of ~64K characters cut at
    # whitespace let the trainer use every core and change the merges only at the cut points.
    start = 0
    while start < len(text):
        end = min(start + size, len(text))
        if end < len(text):
            cut = text.rfind("\n", start, end)
            if cut <= start:
                cut = text.rfind(" ", start, end)
            end = cut if cut > start else end
        yield text[start:end]
        start = end


def train_bpe(
    text_or_iterator: Union[str, Iterable[str]],
    vocab_size: int = 8192,
    special_tokens: Iterable[str] = (EOT,),
) -> Tokenizer:
    """Trains a byte-level BPE tokenizer (GPT-2 style pre-tokenisation, no prefix space).

    Every byte is in the initial alphabet, so any UTF-8 text encodes and decodes back exactly.
    The special tokens take the first ids (`<|endoftext|>` is id 0 by default), then the 256 bytes,
    then the merges.

    Args:
        text_or_iterator: the training text, or an iterator of texts (e.g. documents).
        vocab_size: the size of the final vocabulary, special tokens and bytes included.
        special_tokens: tokens that are never split or merged.

    Returns:
        A trained `tokenizers.Tokenizer`.
    """
    special_tokens = list(special_tokens)
    if vocab_size < 256 + len(special_tokens):
        raise ValueError(
            f"vocab_size={vocab_size} is too small: the 256 bytes and {len(special_tokens)} special "
            f"token(s) alone need {256 + len(special_tokens)}"
        )
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = _pieces(text_or_iterator) if isinstance(text_or_iterator, str) else text_or_iterator
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def char_tokenizer(text_or_chars: Union[str, Iterable[str]]) -> Tokenizer:
    """A character-level tokenizer: one id per distinct character, in sorted order.

    The ids are exactly the walkthrough's `stoi = {ch: i for i, ch in enumerate(sorted(set(text)))}`,
    e.g. 65 ids for the Shakespeare text with "\\n" = 0 and " " = 1.

    Args:
        text_or_chars: the text whose characters form the vocabulary, or an iterable of characters.

    Returns:
        A `tokenizers.Tokenizer` (WordLevel over single characters, decoding with no separator).
    """
    chars = sorted(set(text_or_chars))
    if not chars:
        raise ValueError("cannot build a character tokenizer from an empty text")
    bad = [c for c in chars if not isinstance(c, str) or len(c) != 1]
    if bad:
        raise ValueError(f"expected single characters, got {bad[:5]!r}")
    vocab = {ch: i for i, ch in enumerate(chars)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=_CHAR_UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), "isolated")  # every character alone
    tok.decoder = decoders.Fuse()  # join the characters back with nothing in between
    return tok


def raw(tok: Union[Tokenizer, PreTrainedTokenizerFast]) -> Tokenizer:
    """The `tokenizers.Tokenizer` behind a tokenizer: itself, or a Hugging Face fast tokenizer's backend
    (`model.tokenizer` is a `transformers.PreTrainedTokenizerFast` over one)."""
    return cast(Tokenizer, getattr(tok, "backend_tokenizer", tok))


def is_char_level(tok: Tokenizer) -> bool:
    """True for a tokenizer made by `char_tokenizer` (a WordLevel model), False for BPE."""
    return isinstance(raw(tok).model, models.WordLevel)


def encode(tok: Tokenizer, text: str) -> list[int]:
    """Text -> token ids (no special tokens are added).

    Raises:
        ValueError: if `text` is not a str, or (character tokenizer) it holds characters outside
            the vocabulary; the message lists them.
    """
    if not isinstance(text, str):
        raise ValueError(f"expected text (str), got {type(text).__name__}")
    tok = raw(tok)
    if is_char_level(tok):
        vocab = tok.get_vocab()
        unseen = sorted(set(text) - vocab.keys())
        if unseen:
            raise ValueError(
                f"{len(unseen)} character(s) not in the tokenizer's vocabulary of {len(vocab)}: "
                f"{''.join(unseen[:20])!r}" + (" ..." if len(unseen) > 20 else "")
            )
    return tok.encode(text, add_special_tokens=False).ids


def decode(tok: Tokenizer, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
    """Token ids (any iterable of ints, e.g. a 1-D tensor or list) -> text, special tokens kept.

    An id the tokenizer lacks (a model may have more ids than its tokenizer) reads `<unk:ID>` in the
    text, so it is never dropped silently; every decode path here (`model.to_string`, `to_str_tokens`,
    `generate`, `model.tokenizer.decode`, interp's token labels, the CLI) goes through this function.
    """
    ids = [_as_int(i) for i in ids]
    tok = raw(tok)
    n = tok.get_vocab_size()
    if all(0 <= i < n for i in ids):
        return tok.decode(ids, skip_special_tokens=skip_special_tokens)
    pieces, run = [], []
    for i in ids + [None]:
        if i is not None and 0 <= i < n:
            run.append(i)
            continue
        if run:
            pieces.append(tok.decode(run, skip_special_tokens=skip_special_tokens))
            run = []
        if i is not None:
            pieces.append(f"<unk:{i}>")
    return "".join(pieces)


def _as_int(i) -> int:
    if isinstance(i, bool) or isinstance(i, float) or getattr(i, "is_floating_point", lambda: False)():
        raise TypeError(f"token ids must be integers, got {i!r}")
    return int(i)
