"""TransformerLens' text methods of a hooked model: `to_tokens`, `to_str_tokens`, `to_string`,
`to_single_token`, `to_single_str_token`, `get_token_position`, `tokens_to_residual_directions` and
`generate`, each a thin call of `sprout.tl.text` or `sprout.tl.generation` with the model's tokenizer.
A model holds a `TextCodec` as `model.codec`, and `HookedLM` delegates each method to it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Protocol, Sequence, Union

import torch
from jaxtyping import Float, Int

from . import generation, text

if TYPE_CHECKING:
    from transformer_lens.hook_points import NamesFilter
    from transformers import StoppingCriteria

    from ..config import SproutTransformerLensConfig

TextOrTokens = Union[str, list, torch.Tensor]


class Readable(Protocol):
    """What `TextCodec` reads of its model: the config, the unembedding, the tokenizer and the forward (and, for
    `generate`, its train / eval mode)."""

    training: bool

    @property
    def cfg(self) -> SproutTransformerLensConfig: ...
    @property
    def W_U(self) -> Float[torch.Tensor, "d_model d_vocab"]: ...
    @property
    def tokenizer(self) -> Any: ...
    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...
    def eval(self) -> Any: ...
    def train(self, mode: bool = True) -> Any: ...


class TextCodec:
    """The tokenizer of one model (a Hugging Face `PreTrainedTokenizerFast`, or None; `model.tokenizer`
    sets it) and TransformerLens' methods that read or write text through it."""

    def __init__(self, model: Readable) -> None:
        self.model = model
        self.tokenizer: Any = None

    def to_tokens(self, input: TextOrTokens, prepend_bos: Optional[bool] = None, padding_side: Optional[str] = None,
                  move_to_device: bool = True, truncate: bool = True) -> Int[torch.Tensor, "batch pos"]:
        """Text (or a list of texts, padded to the longest on `padding_side`) -> token ids [batch, pos].

        As TransformerLens: `prepend_bos` (default `model.cfg.default_prepend_bos`) puts `<|endoftext|>`
        first; `truncate=True` keeps the first `n_ctx` tokens, `truncate=False` returns them all (the forward
        refuses more than `n_ctx`: cut them with `sprout.tl.text.windows`); `to_tokens("")` is [[BOS]] with prepend_bos, else shape [1, 0].
        """
        return text.to_tokens(self.model, input, prepend_bos, padding_side, move_to_device, truncate)

    def to_str_tokens(self, input: object, prepend_bos: Optional[bool] = None, padding_side: Optional[str] = None) -> list:
        """Each token as the piece of text it decodes to; a list of texts gives one unpadded list per text
        (TransformerLens' convention), ids [batch, pos] a list per row."""
        return text.to_str_tokens(self.model, input, prepend_bos, padding_side)

    def to_string(self, tokens: object) -> Union[str, list]:
        """Token ids (int, 0-d/1-D tensor, list, NumPy array) -> text; [batch, pos] -> a list of texts."""
        return text.to_string(self.model, tokens)

    def to_single_token(self, string: str) -> int:
        """The id of a text that is exactly one token."""
        ids = self.to_tokens(string, prepend_bos=False)[0]
        if ids.numel() != 1:
            raise ValueError(f"{string!r} is {ids.numel()} tokens, not one")
        return int(ids[0])

    def get_token_position(self, single_token: Union[str, int, Int[torch.Tensor, ""]], input: object, mode: str = "first",
                           prepend_bos: Optional[bool] = None, padding_side: Optional[str] = None) -> int:
        """The position of `single_token` (a one-token string or an id) in `input` (text or ids [pos] / [1, pos])."""
        tokens = self.to_tokens(input, prepend_bos, padding_side) if isinstance(input, str) else text.as_ids(input)
        if tokens.dim() == 2:
            if tokens.size(0) != 1:
                raise ValueError(f"get_token_position searches one sequence; got a batch of shape {tuple(tokens.shape)}")
            tokens = tokens[0]
        token = self.to_single_token(single_token) if isinstance(single_token, str) else int(text.as_ids(single_token))
        where = (tokens == token).nonzero().flatten()
        if where.numel() == 0:
            raise ValueError(f"token {token} ({self.to_string(token)!r}) does not occur in the input")
        if mode not in ("first", "last"):
            raise ValueError(f"mode must be 'first' or 'last', got {mode!r}")
        return int(where[0] if mode == "first" else where[-1])

    def generate(self, input: TextOrTokens = "", max_new_tokens: int = 10, stop_at_eos: bool = True,
                 eos_token_id: Optional[Union[int, Sequence[int]]] = None, do_sample: bool = True, top_k: Optional[int] = None,
                 top_p: Optional[float] = None, temperature: float = 1.0, freq_penalty: float = 0.0,
                 repetition_penalty: float = 1.0, use_past_kv_cache: bool = True, prepend_bos: Optional[bool] = None,
                 padding_side: Optional[str] = None, return_type: str = "input", verbose: bool = True,
                 output_logits: bool = False, return_cache: bool = False, return_input_tokens: bool = False,
                 names_filter: NamesFilter = None, device: Optional[Union[str, torch.device]] = None, pixel_values: object = None,
                 stop_strings: Optional[Union[str, Sequence[str]]] = None,
                 stopping_criteria: Optional[Union[StoppingCriteria, Sequence[StoppingCriteria]]] = None,
                 attention_mask: Optional[Int[torch.Tensor, "batch pos"]] = None, forced_bos_token_id: object = None,
                 stop: Optional[Union[int, Sequence[int]]] = None, **generation_kwargs: Any) -> Any:
        """TransformerLens 4.3's generate (its arguments, defaults and results), on this model.

        `input`: a text, a list of texts (padded on the left and masked, so each prompt gets the
        continuation it gets alone), token ids [batch, pos] (with their `attention_mask`, or
        `padding_side` to read the padding off the pad token; right padding is moved to the left), or
        token embeddings [batch, pos, d_model] (Sprout). An empty text starts from `<|endoftext|>`.
        Sampling is TransformerLens' `sample_logits` (`temperature`, `top_k`, else `top_p`,
        `freq_penalty`, `repetition_penalty`; `do_sample=False` or temperature 0 is greedy); penalties
        count real tokens, not padding. A row stops at `eos_token_id` (default the tokenizer's EOS;
        none for a character tokenizer), at an id in `stop` (model.py's argument), at `stop_strings`
        or `stopping_criteria` (transformers'); finished rows are filled with the EOS until all stop.
        `use_past_kv_cache` (default) runs each new token alone against a key-value cache
        (`sprout.tl.generation`): the same tokens as without it, and faster for long outputs. Past the
        context, generation slides a window of `n_ctx` tokens (the cache is dropped from there).

        Returns (`return_type`): "str" the text(s) without padding, BOS and EOS (one str for a batch
        of one, as TransformerLens), "tokens" ids [batch, pos + new], "embeds" the token embeddings
        [batch, pos + new, d_model], "input" the input's kind. `output_logits=True` returns
        transformers' `GenerateDecoderOnlyOutput` (`sequences`, `logits`: one [batch, vocab] per
        step); `return_cache=True` adds `run_with_cache` of the output (`names_filter`, `device`);
        `return_input_tokens=True` adds the prompt's ids as the model read them.

        The course's `generate(idx, max_new)` is `sprout.model.GPT`'s; here it is `max_new_tokens`, as in
        TransformerLens. model.py sampled at temperature 0.8 with top-p 0.95:
        pass them (or use `sprout.tl.generation.sample`) for its samples. `pixel_values` and
        `forced_bos_token_id` (vision and encoder-decoder models) are refused.
        """
        for name, value in (("pixel_values", pixel_values), ("forced_bos_token_id", forced_bos_token_id)):
            if value is not None:
                raise ValueError(f"{name} is for vision or encoder-decoder models; {type(self.model).__name__} reads text only")
        unknown = sorted(set(generation_kwargs) - {"output_logits", "return_dict_in_generate"})
        if unknown:
            raise TypeError(f"generate got unexpected keyword argument(s) {unknown}")
        options = dict(max_new_tokens=max_new_tokens, stop_at_eos=stop_at_eos,
                       eos_token_id=eos_token_id, do_sample=do_sample, top_k=top_k, top_p=top_p,
                       temperature=temperature, freq_penalty=freq_penalty, repetition_penalty=repetition_penalty,
                       use_past_kv_cache=use_past_kv_cache, prepend_bos=prepend_bos, padding_side=padding_side,
                       return_type=return_type, verbose=verbose,
                       output_logits=generation_kwargs.get("output_logits", output_logits),
                       return_cache=return_cache, return_input_tokens=return_input_tokens,
                       names_filter=names_filter, device=device, stop_strings=stop_strings,
                       stopping_criteria=stopping_criteria, attention_mask=attention_mask, stop=stop)
        return generation.generate(self.model, input, options)

    def tokens_to_residual_directions(self, tokens: Union[str, int, Int[torch.Tensor, "..."]]) -> Float[torch.Tensor, "... d_model"]:
        """The residual direction whose dot product with the normalised stream is each token's logit, in
        TransformerLens' shapes: one token (a string, an int, a tensor of one element) -> [d_model];
        ids of shape [...] -> [..., d_model].

        Reads `model.W_U` [d_model, vocab] (the unembedding with the final norm's gain folded in, so it
        pairs with `ln_final.hook_normalized` and `cache.apply_ln_to_stack`), which a model defines
        where that folding is exact (Sprout; not the walkthrough GPT's biased LayerNorm).
        """
        if isinstance(tokens, str):
            tokens = self.to_single_token(tokens)
        ids = text.as_ids(tokens)
        if ids.numel() == 1:
            return self.model.W_U[:, int(ids.reshape(()))]
        return self.model.W_U[:, ids].movedim(0, -1)

    def to_single_str_token(self, int_token: int) -> str:
        """The text of one token id (TransformerLens' to_single_str_token)."""
        if isinstance(int_token, bool) or not isinstance(int_token, int):
            raise TypeError(f"to_single_str_token takes one token id (an int), got {type(int_token).__name__}")
        vocab = self.model.cfg.d_vocab
        if not 0 <= int_token < vocab:
            raise ValueError(f"token id {int_token} is out of range for a vocabulary of {vocab} (valid: 0..{vocab - 1})")
        return self.to_str_tokens(torch.tensor([int_token]))[0]

