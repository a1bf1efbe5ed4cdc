"""What every hooked language model here shares: TransformerLens' run_with_* entry points, text in and
out, the course's loss. Sprout and the walkthrough GPT differ only in their layers."""
from __future__ import annotations

import warnings
from typing import Optional, Union

import torch
import torch.nn.functional as F
from transformer_lens.ActivationCache import ActivationCache
from transformer_lens.hook_points import HookPoint
from transformer_lens.HookedRootModule import HookedRootModule

from . import text

TextOrTokens = Union[str, list, torch.Tensor]


def hooked(*points: HookPoint) -> bool:
    """Whether any of these hook points has a forward or backward hook attached right now."""
    return any(p._forward_hooks or p._backward_hooks for p in points)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor, loss_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """model.py's loss: mean next-token cross-entropy, over the positions where loss_mask is nonzero."""
    loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1), reduction="none")
    if loss_mask is None:
        return loss.mean()
    mask = loss_mask.reshape(-1).float()
    return (loss * mask).sum() / mask.sum().clamp(min=1)


def _not_attn_result(name: str) -> bool:
    return not name.endswith("attn.hook_result")


def _selects(names_filter, name: str) -> bool:
    """Whether TransformerLens' names_filter (a name, a list of names or a predicate) selects `name`."""
    if isinstance(names_filter, str):
        return name == names_filter
    if isinstance(names_filter, list):
        return name in names_filter
    return bool(names_filter(name))


def check_stop_at_layer(model, stop_at_layer: int):
    if not 0 <= stop_at_layer <= len(model.blocks):
        raise ValueError(f"stop_at_layer must be in 0..{len(model.blocks)}, got {stop_at_layer}")


def _logits_unless_loss(out):
    logits, loss = out
    return logits if loss is None else out


class HookedLM(HookedRootModule):
    """A HookedRootModule whose forward is `(idx, targets=None, loss_mask=None) -> (logits, loss)`.

    Subclasses set `self.config` (with `transformer_lens_config()`), `self.embed`, `self.tokenizer`, build their
    layers, then call `self.setup()`.
    """

    @property
    def cfg(self):
        """TransformerLens' view of the config (`n_layers`, `d_head`, ...); the course's names work too."""
        lens = self.__dict__.get("_lens_cfg")
        if lens is None:
            lens = self.__dict__["_lens_cfg"] = self.config.transformer_lens_config()
        lens.device = str(self.embed.weight.device)
        lens.dtype = self.embed.weight.dtype
        return lens

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def to_tokens(self, text_: TextOrTokens, prepend_bos: bool = False, **_ignored) -> torch.Tensor:
        """Text (or a list of texts of equal token length) -> token ids [batch, pos]."""
        return text.to_tokens(self, text_, prepend_bos=prepend_bos)

    def to_str_tokens(self, text_: TextOrTokens, **_ignored) -> list:
        """Each token as the piece of text it decodes to (a list per sequence for a batch)."""
        return text.to_str_tokens(self, text_)

    def to_string(self, tokens) -> Union[str, list]:
        """Token ids -> text (a list of texts for a batch)."""
        return text.to_string(self, tokens)

    @torch.no_grad()
    def generate(self, idx: TextOrTokens, max_new: int, temperature: float = 0.8, top_k: Optional[int] = None,
                 top_p: Optional[float] = 0.95, stop=None):
        """Sample max_new tokens after idx (as model.py does); text in gives text out."""
        return text.sample(self, idx, max_new, temperature, top_k, top_p, stop)

    def run_with_cache(self, *model_args, **kwargs):
        """Run and cache activations: `logits, cache = model.run_with_cache(tokens_or_text)`.

        Returns an `ActivationCache`. Without `targets` the output is the logits alone (as in
        TransformerLens); with `targets` it is forward's `(logits, loss)`. `names_filter` selects hooks;
        `incl_bwd=True` (with targets) also caches the loss's gradient at each hook as `<name>_grad`.

        As in TransformerLens, caching everything (no `names_filter`) leaves out each head's separate
        write to the stream, `attn.hook_result` [batch, pos, head, d_model], unless
        `model.cfg.use_attn_result` is True: it is n_head times the size of the stream, costs an extra
        pass per layer (measured: 16% of the memory and ~7% of the time of a full Sprout cache), and
        TransformerLens rebuilds it from `hook_z` and `W_O` when asked (`cache.stack_head_results`).
        Name it in `names_filter` to cache it anyway.
        """
        names_filter = kwargs.get("names_filter")
        if names_filter is None and not getattr(self.cfg, "use_attn_result", False):
            kwargs["names_filter"] = _not_attn_result
        if names_filter is not None and not any(_selects(names_filter, name) for name in self.hook_dict):
            shown = "" if callable(names_filter) else f" {names_filter!r}"
            warnings.warn(f"names_filter{shown} matched none of the model's {len(self.hook_dict)} hook points, "
                          "so the cache will be empty (names look like 'blocks.0.hook_resid_post'; "
                          "model.hook_dict lists them all)", stacklevel=2)
        batched = not kwargs.get("remove_batch_dim", False)
        if kwargs.get("incl_bwd"):
            out, cache = self._run_with_cache_and_grads(model_args, dict(kwargs))
        else:
            out, cache = super().run_with_cache(*model_args, **kwargs)
        return _logits_unless_loss(out), ActivationCache(cache, self, has_batch_dim=batched)

    def _run_with_cache_and_grads(self, model_args, kwargs):
        # TransformerLens calls `.backward()` on the forward's output, which here is (logits, loss):
        # run its caching hooks ourselves and differentiate the loss.
        options = {k: kwargs.pop(k) for k in ("names_filter", "device", "remove_batch_dim", "pos_slice") if k in kwargs}
        reset, clear = kwargs.pop("reset_hooks_end", True), kwargs.pop("clear_contexts", False)
        kwargs.pop("incl_bwd")
        cache, fwd, bwd = self.get_caching_hooks(incl_bwd=True, **options)
        with self.hooks(fwd_hooks=fwd, bwd_hooks=bwd, reset_hooks_end=reset, clear_contexts=clear):
            logits, loss = self(*model_args, **kwargs)
            if loss is None:
                raise ValueError("run_with_cache(incl_bwd=True) caches gradients of the loss: pass targets too")
            loss.backward()
        return (logits, loss), cache

    def to_single_token(self, string: str) -> int:
        """The id of a text that is exactly one token."""
        ids = self.to_tokens(string)[0]
        if ids.numel() != 1:
            raise ValueError(f"{string!r} is {ids.numel()} tokens, not one")
        return int(ids[0])

    def tokens_to_residual_directions(self, tokens) -> torch.Tensor:
        """The residual direction [..., d_model] whose dot product with ln_final(x) is each token's logit.

        Reads `self.W_U` [d_model, vocab] (the unembedding with the final norm's gain folded in), which
        a model defines where that folding is exact (Sprout; not the walkthrough GPT's biased LayerNorm).
        """
        if isinstance(tokens, str):
            tokens = self.to_single_token(tokens)
        if isinstance(tokens, int) or (isinstance(tokens, torch.Tensor) and tokens.dim() == 0):
            return self.W_U[:, int(tokens)]
        return self.W_U[:, tokens].movedim(0, -1)

    def run_with_hooks(self, *model_args, **kwargs):
        """Run with temporary hooks (removed afterwards, even if the forward raises); output as above."""
        return _logits_unless_loss(super().run_with_hooks(*model_args, **kwargs))

    def run_with_cache_into(self, tokens: torch.Tensor, buffers: dict, **forward_kwargs):
        """Run, copying each named activation into a preallocated buffer instead of a new tensor.

        For streaming analyses over many batches: `buffers` maps hook names to tensors at least as
        large as the activations ([batch, pos, ...]); each is filled in `[:batch, :pos]`. Returns
        forward's output (logits alone without targets).
        """
        def copy_into(x, hook):
            buffers[hook.name][tuple(slice(0, n) for n in x.shape)].copy_(x)

        unknown = sorted(set(buffers) - set(self.hook_dict))
        if unknown:
            raise ValueError(f"no hook points named {unknown}")
        return self.run_with_hooks(tokens, fwd_hooks=[(name, copy_into) for name in buffers], **forward_kwargs)
