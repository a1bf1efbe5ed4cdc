"""What every hooked language model here shares: HookedTransformer's forward contract, TransformerLens'
run_with_* entry points (thread-safe, with checked hooks), and its names for weights, hook flags and text.

A model subclasses `HookedLM` and defines `run_layers(x, attn_mask, positions, start_at_layer,
stop_at_layer, past_kv_cache)`: the layers alone. `forward` reads TransformerLens' arguments (`sprout.tl.forward`).
Three components, plain objects holding the model (not modules: the state dict is the model's own), do
the rest: `weights` (`StackedWeights`), `hook_flags` (`HookFlagRules`) and `codec` (`TextCodec`); each
TransformerLens name on the model is one line handing over to one of them (`sprout.tl.surface`).
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, Iterator, Literal, Optional, Union, cast

import torch
from jaxtyping import Float, Int, Shaped
from transformer_lens.cache.key_value_cache import TransformerLensKeyValueCache
from transformer_lens.hook_points import HookFunction, HookPoint, NamesFilter
from transformer_lens.HookedRootModule import HookedRootModule
from transformer_lens.utilities.slice import Slice, SliceInput

from ..hf_tokenizer import as_hf
from . import kv_cache, text
from .activation_cache import SproutActivationCache
from .caching import not_attn_result, run_with_grads, warn_of_filter
from .forward import ForwardResult, check_loss_tokens, check_resid, check_return_type, finish, layer_range, tl_loss
from .hook_checks import cache_hooks, check_buffers, checked_hook, copy_into_buffer, unknown_hook
from .hook_flags import HookFlagRules, watched
from .recycle import CacheRecycler
from .stacked_weights import StackedWeights, stacked
from .surface import delegate
from .text_io import TextCodec, TextOrTokens

if TYPE_CHECKING:
    import torch.nn as nn

    from ..config import SproutTransformerLensConfig
    from .weights import Embed


def hooked(*points: HookPoint) -> bool:
    """Whether any of these hook points has a forward or backward hook attached right now, or is watched."""
    return any(p._forward_hooks or p._backward_hooks or watched(p) for p in points)


def follow_weights(model: HookedLM) -> HookedLM:
    """Set `model.cfg.device` and `.dtype` to the embedding's: what `_apply` (every `.to()`, `.cuda()`,
    `.half()`) calls after moving or casting the weights, so reading `cfg` never changes anything."""
    model.cfg.device, model.cfg.dtype = str(model.embed.weight.device), model.embed.weight.dtype
    return model


def _show_user_hook(points, checked, hook) -> None:
    """`list_hooks()` reports the user's own function, not the shape-checking wrapper around it."""
    for point in points:
        for handle in point.fwd_hooks + point.bwd_hooks:
            if handle.user_hook is checked:
                handle.user_hook = hook


class HookedLM(HookedRootModule):
    """A HookedRootModule with TransformerLens' forward contract (see `sprout.tl.forward`).

    Subclasses set `self.config`, `self.cfg` (its `transformer_lens_config()`, which their blocks read
    for the hook flags), `self.embed`, `self.unembed`, `self.tokenizer`, build their layers, define
    `run_layers`, then call `self.setup()`.

    Threads: one lock per model. `hooks()`, `run_with_hooks`, `run_with_cache` and a plain call
    `model(...)` hold it, so two threads never see each other's hooks or activations; the second waits.
    """

    if TYPE_CHECKING:  # what the subclasses build (see above)
        config: Any  # SproutConfig or WalkthroughConfig
        cfg: SproutTransformerLensConfig
        embed: Embed
        unembed: Any  # UnembedHooks or walkthrough.Unembed, both answering W_U/b_U
        blocks: nn.ModuleList
        run_layers: Callable[..., torch.Tensor]

    weights: StackedWeights  # TransformerLens' weights, stacked over the blocks (`sprout.tl.stacked_weights`)
    hook_flags: HookFlagRules  # the set_use_* flags and the hook points they gate (`sprout.tl.hook_flags`)
    codec: TextCodec  # the tokenizer and the text methods (`sprout.tl.text_io`)
    cache_recycler: CacheRecycler  # the last cache's memory, reused by the next (`sprout.tl.recycle`)
    hook_lock: threading.RLock  # held by every forward and hooks() block; hold it to change the hook table

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.weights = StackedWeights(self)
        self.hook_flags = HookFlagRules(self)
        self.codec = TextCodec(self)
        self.hook_lock = threading.RLock()
        self.cache_recycler = CacheRecycler()

    def setup(self) -> None:
        super().setup()
        self.hook_flags.register_aliases()

    def __getstate__(self):
        state = self.__dict__.copy()
        state.pop("hook_lock", None)
        state.pop("cache_recycler", None)
        return state

    def __setstate__(self, state):
        super().__setstate__(state)
        self.hook_lock = threading.RLock()
        self.cache_recycler = CacheRecycler()

    def _apply(self, fn, recurse: bool = True):
        if "cache_recycler" in self.__dict__:  # (not yet during nn.Module's own set-up) caches of the old
            self.cache_recycler.release()  # device or dtype would only hold memory the next cache cannot reuse
        return follow_weights(super()._apply(fn, recurse))

    def __call__(self, *args, **kwargs):
        with self.hook_lock:
            return super().__call__(*args, **kwargs)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    # --- forward ----------------------------------------------------------------------------------

    def forward(self, input: TextOrTokens, return_type: Optional[str] = "logits", loss_per_token: bool = False,
                prepend_bos: Optional[bool] = None, padding_side: Optional[str] = None,
                start_at_layer: Optional[int] = None, tokens: Optional[Int[torch.Tensor, "batch pos"]] = None,
                shortformer_pos_embed: Optional[Float[torch.Tensor, "batch pos d_model"]] = None,
                attention_mask: Optional[Int[torch.Tensor, "batch pos"]] = None,
                stop_at_layer: Optional[int] = None, past_kv_cache: Optional[TransformerLensKeyValueCache] = None, *,
                targets: Optional[Int[torch.Tensor, "batch pos"]] = None,
                loss_mask: Optional[Shaped[torch.Tensor, "batch pos"]] = None) -> ForwardResult:
        """Token ids [batch, pos] (or text, or a list of texts) through the model, as HookedTransformer.

        `model(tokens)` is the logits [batch, pos, vocab], a plain Tensor; `return_type` "logits",
        "loss" (position t predicts token t + 1; with `targets=` [batch, pos] model.py's loss of every
        position against its target, `loss_mask=` weighting them), "both" (logits, loss) or None;
        `loss_per_token`; `attention_mask` [batch, pos] (1 token, 0 padding; texts of unequal length
        are padded and masked on their own); `prepend_bos` (text only, as in TransformerLens:
        `<|endoftext|>` first; default `model.cfg.default_prepend_bos`); `padding_side`;
        `past_kv_cache` (a `TransformerLensKeyValueCache`, `sprout.tl.kv_cache`: the input is the
        positions after the cached ones, and is appended to it); `start_at_layer=S` (input is then the
        stream entering block S [batch, pos, d_model], checked; `tokens=` its ids for a loss);
        `stop_at_layer=L` returns the stream leaving block L-1 [batch, pos, d_model], firing no
        `blocks.L.*` hook; negative layers count from the end.
        The course's `logits, loss = model(idx, targets)` is `sprout.model.GPT`'s (`GPT.from_sprout`).
        """
        check_return_type(return_type, targets, loss_mask)
        start_at_layer, stop_at_layer = layer_range(len(self.blocks), start_at_layer, stop_at_layer)
        if start_at_layer is not None:
            x = check_resid(input, self.cfg, start_at_layer)
            idx = None if tokens is None else text.check_tokens(self, tokens)
            if idx is not None:
                check_loss_tokens(idx, x)
        elif isinstance(input, torch.Tensor) and prepend_bos is None:
            idx = x = text.check_tokens(self, input)  # the fast path: ids in
        else:
            if isinstance(input, (str, list, tuple)):
                idx, padded = text.tokens_and_mask(self, input, prepend_bos, padding_side, truncate=True)
            else:
                text.check_prepend_bos(self, prepend_bos)
                idx, padded = text.check_tokens(self, input), None
            attention_mask = padded if attention_mask is None else attention_mask
            x = idx
        if shortformer_pos_embed is not None:
            raise ValueError("shortformer_pos_embed is for shortformer models; this model has no positional stream to add")
        if attention_mask is None and idx is not None and isinstance(input, torch.Tensor) and (
                past_kv_cache is not None or padding_side == "left"):
            # TransformerLens reads the padding off the pad token here (a cache, or left padding asked for)
            attention_mask = text.mask_from_padding(self, idx, padding_side, prepend_bos)
        positions = attn_mask = None
        if past_kv_cache is not None:
            kv_cache.check_cache_layers(past_kv_cache, start_at_layer, stop_at_layer, len(self.blocks))
        elif attention_mask is None and targets is None and idx is not None:
            text.warn_if_left_padded(self, idx)
        if attention_mask is not None and past_kv_cache is None:
            # idx is None only with start_at_layer (the branches above)
            attention_mask = text.check_attention_mask(
                attention_mask, x[..., 0] if start_at_layer is not None else cast(torch.Tensor, idx))
            positions, attn_mask = kv_cache.padding_masks(attention_mask)
        with kv_cache.all_or_nothing(past_kv_cache):  # every block's entry extended, or none
            if past_kv_cache is not None:
                attention_mask, positions, attn_mask = kv_cache.cache_masks(
                    self, past_kv_cache, attention_mask, x[..., 0] if start_at_layer is not None else cast(torch.Tensor, idx))
            out = self.run_layers(x, attn_mask, positions, start_at_layer, stop_at_layer, past_kv_cache)
        if stop_at_layer is not None:
            return out
        return finish(out, idx, targets, loss_mask, attention_mask, return_type, loss_per_token)

    def input_to_embed(self, input: TextOrTokens, prepend_bos: Optional[bool] = None, padding_side: Optional[str] = None,
                       attention_mask: Optional[Int[torch.Tensor, "batch pos"]] = None) -> tuple[
            Float[torch.Tensor, "batch pos d_model"], Int[torch.Tensor, "batch pos"], None, Optional[Int[torch.Tensor, "batch pos"]]]:
        """TransformerLens 4.3's input_to_embed: `(residual, tokens, None, attention_mask)`, the stream
        entering block 0 [batch, pos, d_model] (the embedding; RoPE adds no positional stream, hence the
        None where a shortformer model returns one), the ids [batch, pos] and the padding mask or None.
        `model(residual, start_at_layer=0, attention_mask=attention_mask)` resumes the forward."""
        if isinstance(input, (str, list, tuple)):
            tokens, padded = text.tokens_and_mask(self, input, prepend_bos, padding_side, truncate=True)
            attention_mask = padded if attention_mask is None else attention_mask
        else:
            tokens = text.check_tokens(self, input)  # ids in: prepend_bos does not apply, as in TransformerLens
        residual = self(tokens, stop_at_layer=0, attention_mask=attention_mask, return_type="logits")
        return residual, tokens, None, attention_mask

    def loss_fn(self, logits: Float[torch.Tensor, "batch pos d_vocab"], tokens: Int[torch.Tensor, "batch pos"],
                attention_mask: Optional[Int[torch.Tensor, "batch pos"]] = None, per_token: bool = False
                ) -> Union[Float[torch.Tensor, ""], Float[torch.Tensor, "batch pos_minus_1"]]:
        """TransformerLens' loss: mean cross-entropy of each next token (per_token: [batch, pos - 1])."""
        tokens = text.as_ids(tokens)
        return tl_loss(logits, tokens.long(), attention_mask, per_token)

    # --- hooks ------------------------------------------------------------------------------------

    @contextmanager
    def hooks(self, fwd_hooks: list[tuple[Union[str, Callable], Callable]] = [],
              bwd_hooks: list[tuple[Union[str, Callable], Callable]] = [], reset_hooks_end: bool = True,
              clear_contexts: bool = False) -> Iterator[HookedLM]:
        """TransformerLens' hooks() context, holding this model's lock until it exits.

        Hooks are active for every forward of this model in this thread until the `with` block ends,
        including in a generator suspended inside it; other threads wait for the block to end.
        """
        with self.hook_lock, super().hooks(fwd_hooks, bwd_hooks, reset_hooks_end, clear_contexts) as model:
            yield model

    def _enable_hook(self, name, hook, dir):
        # hooks(), run_with_hooks, run_with_cache: a named hook that would never fire is refused, a names
        # filter skips it (sprout.tl.hook_flags)
        if isinstance(name, str):
            self._known_hook(name)
            self.hook_flags.refuse_off(name)
        for point_name in [name] if isinstance(name, str) else self.hook_flags.points(name, "hooks"):
            checked = checked_hook(hook, dir)
            super()._enable_hook(point_name, checked, dir)
            _show_user_hook([self.mod_dict[point_name]], checked, hook)

    def _known_hook(self, name: str) -> None:
        if name not in self.mod_dict or not isinstance(self.mod_dict[name], HookPoint):
            raise unknown_hook(name, self.hook_dict)

    def add_hook(self, name: Union[str, Callable[[str], bool]], hook: HookFunction, dir: Literal["fwd", "bwd"] = "fwd",
                 is_permanent: bool = False, level: Optional[int] = None, prepend: bool = False) -> None:
        """TransformerLens' add_hook; a names filter skips the hook points whose flag is off (with a warning)."""
        flags = self.hook_flags
        for point_name in [name] if isinstance(name, str) else flags.points(name, "add_hook", flags.add_hook_flag):
            self._known_hook(point_name)
            super().add_hook(point_name, hook, dir=dir, is_permanent=is_permanent, level=level, prepend=prepend)

    def check_hooks_to_add(self, hook_point: HookPoint, hook_point_name: str, hook: HookFunction, dir: Literal["fwd", "bwd"] = "fwd",
                           is_permanent: bool = False, prepend: bool = False) -> None:
        """`model.add_hook` on a hook whose flag is off: a HookFlagError (TransformerLens' AssertionError)."""
        self.hook_flags.refuse_off(hook_point_name, self.hook_flags.add_hook_flag)

    def check_and_add_hook(self, hook_point: HookPoint, hook_point_name: str, hook: HookFunction, dir: Literal["fwd", "bwd"] = "fwd",
                           is_permanent: bool = False, level: Optional[int] = None, prepend: bool = False) -> None:
        checked = checked_hook(hook, dir)
        super().check_and_add_hook(hook_point, hook_point_name, checked, dir, is_permanent, level, prepend)
        _show_user_hook([hook_point], checked, hook)

    def get_caching_hooks(self, names_filter: NamesFilter = None, incl_bwd: bool = False, device: Optional[Union[str, torch.device]] = None,
                          remove_batch_dim: bool = False, cache: Optional[dict] = None,
                          pos_slice: Optional[Union[Slice, SliceInput]] = None) -> tuple[dict, list, list]:
        """TransformerLens' caching hooks, except that `pos_slice` slices every hook on its position axis."""
        self.hook_flags.alias_input_hooks()  # flags set on model.cfg directly: hook_dict's aliases follow them here
        self.is_caching = True
        recycler = self.cache_recycler if self.cache_recycler.active else None
        return cache_hooks(self.hook_dict, names_filter, incl_bwd, device, remove_batch_dim, cache, pos_slice,
                           gated=self.hook_flags.gated_flag, recycler=recycler)

    def run_with_cache(self, *model_args: Any, **kwargs: Any) -> tuple[Any, SproutActivationCache]:
        """Run and cache activations: `logits, cache = model.run_with_cache(tokens_or_text)`.

        Returns forward's output (as `forward` documents: the logits, or what `return_type` asks for)
        and an `ActivationCache`. `names_filter` selects hooks; `pos_slice` keeps those positions of every
        activation; `incl_bwd=True` also caches the loss's gradient at each hook as `<name>_grad` (pass
        `return_type="loss"` or "both"), leaving the parameters' `.grad` as they were.

        As in TransformerLens, caching everything (no `names_filter`) leaves out each head's separate
        write to the stream, `attn.hook_result` [batch, pos, head, d_model], unless
        `model.cfg.use_attn_result` is True: it is n_head times the size of the stream, costs an extra
        pass per layer (measured: 16% of the memory and ~7% of the time of a full Sprout cache), and
        TransformerLens rebuilds it from `hook_z` and `W_O` when asked (`cache.stack_head_results`).
        Name it in `names_filter` to cache it anyway.

        Memory: the model keeps the tensors of its last cache and lets go of them one by one while the
        next is filled, so the next reuses their memory instead of page-faulting it in anew (measured:
        a full cache 1.1-1.2x the plain forward on one thread, 1.6-1.8x without; `sprout.tl.recycle`).
        `model.cache_recycler.release()` frees a dropped cache at once; `.max_bytes = 0` turns it off.
        """
        names_filter = kwargs.get("names_filter")
        if names_filter is None and not getattr(self.cfg, "use_attn_result", False):
            kwargs["names_filter"] = not_attn_result
        warn_of_filter(self, names_filter)
        batched = not kwargs.get("remove_batch_dim", False)
        with self.hook_lock:
            if kwargs.get("incl_bwd"):
                out, cache = run_with_grads(self, model_args, dict(kwargs))
                return out, SproutActivationCache(cache, self, has_batch_dim=batched)
            with self.cache_recycler.cycle() as generation:
                out, cache = super().run_with_cache(*model_args, **kwargs)
            result = SproutActivationCache(cache, self, has_batch_dim=batched)
            generation.hand_to(result)  # the caller owns these tensors until it drops `result`
        return out, result

    def run_with_hooks(self, *model_args: Any, **kwargs: Any) -> Any:
        """Run with temporary hooks (removed afterwards, even if the forward raises); output as forward's."""
        return super().run_with_hooks(*model_args, **kwargs)

    def run_with_cache_into(self, tokens: Int[torch.Tensor, "batch pos"], buffers: dict[str, torch.Tensor], **forward_kwargs: Any) -> Any:
        """Run, copying each named activation into a preallocated buffer instead of a new tensor.

        For streaming analyses over many batches: `buffers` maps hook names to floating-point tensors
        with as many axes as the activations and each at least as long ([batch, pos, ...]); each is
        filled in `[:batch, :pos]`. A buffer too small or of an integer dtype is an error naming the hook.
        Returns forward's output.
        """
        check_buffers(self.hook_dict, buffers)
        hooks = [(name, copy_into_buffer(buffers[name], name)) for name in buffers]
        return self.run_with_hooks(tokens, fwd_hooks=hooks, **forward_kwargs)

    # --- hook flags: `self.hook_flags` (sprout.tl.hook_flags) -------------------------------------

    set_use_attn_result = delegate("hook_flags", HookFlagRules.set_use_attn_result)
    set_use_split_qkv_input = delegate("hook_flags", HookFlagRules.set_use_split_qkv_input)
    set_use_attn_in = delegate("hook_flags", HookFlagRules.set_use_attn_in)
    set_use_hook_mlp_in = delegate("hook_flags", HookFlagRules.set_use_hook_mlp_in)

    # --- TransformerLens' weights: `self.weights` (sprout.tl.stacked_weights), ln gains folded in as its fold_ln

    W_E = stacked(lambda w: w.W_E, "[d_vocab, d_model]: the token embedding.")
    W_pos = stacked(lambda w: w.W_pos, "[n_ctx, d_model]: the learned position embedding (the walkthrough GPT; "
                    "Sprout uses RoPE).")
    W_E_pos = stacked(lambda w: w.W_E_pos, "[d_vocab + n_ctx, d_model]: `W_E` and `W_pos` stacked, the input "
                      "space of full circuits.")
    W_U = stacked(lambda w: w.W_U, "[d_model, d_vocab]: the unembedding with the final norm folded in, so "
                  "`ln_final(x) @ W_U + b_U` are the logits.")
    b_U = stacked(lambda w: w.b_U, "[d_vocab]")
    W_Q = stacked(lambda w: w.stack("attn", "W_Q"), "[n_layers, n_heads, d_model, d_head], ln1's gain folded in: "
                  "`ln1.hook_normalized @ W_Q[l] + b_Q[l]` is `hook_q`.")
    W_K = stacked(lambda w: w.stack("attn", "W_K"), "[n_layers, n_heads, d_model, d_head], ln1's gain folded in.")
    W_V = stacked(lambda w: w.stack("attn", "W_V"), "[n_layers, n_heads, d_model, d_head], ln1's gain folded in.")
    W_O = stacked(lambda w: w.stack("attn", "W_O"), "[n_layers, n_heads, d_head, d_model]: "
                  "`hook_z[:, :, h] @ W_O[l, h]` is head h's write.")
    b_Q = stacked(lambda w: w.stack("attn", "b_Q"), "[n_layers, n_heads, d_head]")
    b_K = stacked(lambda w: w.stack("attn", "b_K"), "[n_layers, n_heads, d_head]")
    b_V = stacked(lambda w: w.stack("attn", "b_V"), "[n_layers, n_heads, d_head]")
    b_O = stacked(lambda w: w.stack("attn", "b_O"), "[n_layers, d_model]")
    W_in = stacked(lambda w: w.stack("mlp", "W_in"), "[n_layers, d_model, d_mlp], ln2's gain folded in (Sprout: "
                   "the linear half of the gate, w3).")
    W_gate = stacked(lambda w: w.W_gate, "[n_layers, d_model, d_mlp], ln2's gain folded in (Sprout: w1, through "
                     "SiLU); None without a gated MLP.")
    W_out = stacked(lambda w: w.stack("mlp", "W_out"), "[n_layers, d_mlp, d_model]")
    b_in = stacked(lambda w: w.stack("mlp", "b_in"), "[n_layers, d_mlp]")
    b_out = stacked(lambda w: w.stack("mlp", "b_out"), "[n_layers, d_model]")
    QK = stacked(
        lambda w: w.QK, "[n_layers, n_heads, d_model, d_model]: `W_Q @ W_K^T`, the bilinear form of the scores "
        "before RoPE and QK-norm (Sprout's real scores are not bilinear in the stream; see docs/reference/differences.md).")
    OV = stacked(lambda w: w.OV, "[n_layers, n_heads, d_model, d_model]: `W_V @ W_O`, what each head writes per "
                 "unit of attention.")
    all_head_labels = stacked(lambda w: w.all_head_labels, '["L0H0", "L0H1", ...], layer-major, as '
                              "TransformerLens labels heads.")
    effective_embedding = delegate("weights", StackedWeights.effective_embedding)
    accumulated_bias = delegate("weights", StackedWeights.accumulated_bias)
    tl_parameters = delegate("weights", StackedWeights.tl_parameters)
    tl_named_parameters = delegate("weights", StackedWeights.tl_named_parameters)

    @property
    def device(self) -> torch.device:
        """The device the weights are on (`cfg.device` as a torch.device), which Hugging Face models have and
        pyvene's positional interventions read."""
        return self.embed.weight.device

    # --- text in and out: `self.codec` (sprout.tl.text_io) ----------------------------------------

    @property
    def tokenizer(self) -> Any:
        """A Hugging Face `PreTrainedTokenizerFast` (see `sprout.hf_tokenizer`), or None. Setting a
        `tokenizers.Tokenizer` wraps it; `sprout.tokenizer.raw(model.tokenizer)` gives it back."""
        return self.codec.tokenizer

    @tokenizer.setter
    def tokenizer(self, tok: Any) -> None:
        self.codec.tokenizer = as_hf(tok)

    to_tokens = delegate("codec", TextCodec.to_tokens)
    to_str_tokens = delegate("codec", TextCodec.to_str_tokens)
    to_string = delegate("codec", TextCodec.to_string)
    to_single_token = delegate("codec", TextCodec.to_single_token)
    to_single_str_token = delegate("codec", TextCodec.to_single_str_token)
    get_token_position = delegate("codec", TextCodec.get_token_position)
    tokens_to_residual_directions = delegate("codec", TextCodec.tokens_to_residual_directions)
    generate = delegate("codec", TextCodec.generate)
