"""TransformerLens' ActivationCache, with the final norm's recomputation matched to the folded `W_U`.

`cache.accumulated_resid(apply_ln=True)` (and `apply_ln_to_stack(..., recompute_ln=True)`) renormalise
each stream of the stack through the final norm. A TransformerLens model loaded the default way
(`fold_ln=True`) has a gainless `ln_final` and the gain folded into `W_U`, so `stack @ model.W_U` are
logits. Sprout's `ln_final` and `W_U` are that pair (`sprout.layers.FinalNormHooks`); this cache calls
`ln_final.normalize` (the same numbers, without firing the final norm's hooks), and leaves a model
without one to TransformerLens' own path.
"""
from __future__ import annotations

from typing import Optional, Union

import torch
from jaxtyping import Float
from transformer_lens.ActivationCache import ActivationCache
from transformer_lens.utilities.slice import Slice, SliceInput


class SproutActivationCache(ActivationCache):
    """An ActivationCache whose final-norm recomputation leaves out the gain that `W_U` carries."""

    def __getitem__(self, key):
        if isinstance(key, str) and key not in self.cache_dict and key.endswith("hook_pos_embed"):
            raise KeyError(f"{key!r}: this model has no learned position embedding (RoPE); positions show in "
                           "blocks.{l}.attn.hook_rot_q / hook_rot_k (docs/reference/differences.md)")
        return super().__getitem__(key)

    def apply_ln_to_stack(self, residual_stack: Float[torch.Tensor, "num_components *batch_and_pos_dims d_model"],
                          layer: Optional[int] = None, mlp_input: bool = False, pos_slice: Union[Slice, SliceInput] = None,
                          batch_slice: Union[Slice, SliceInput] = None, has_batch_dim: bool = True,
                          recompute_ln: bool = False) -> Float[torch.Tensor, "num_components *batch_and_pos_dims_out d_model"]:
        n_layers = self.model.cfg.n_layers
        final = layer is None or layer == -1 or layer == n_layers
        normalize = getattr(getattr(self.model, "ln_final", None), "normalize", None)
        if not (recompute_ln and final and normalize is not None):
            return super().apply_ln_to_stack(residual_stack, layer, mlp_input, pos_slice, batch_slice,
                                             has_batch_dim, recompute_ln)
        if has_batch_dim:
            batch_slice = batch_slice if isinstance(batch_slice, Slice) else Slice(batch_slice)
            residual_stack = batch_slice.apply(residual_stack, dim=1)
        return normalize(residual_stack)
