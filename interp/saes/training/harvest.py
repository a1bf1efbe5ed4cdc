"""Where training activations come from: a tensor of them, or a model run over text in buffered blocks.

Every step's global batch is a fixed function of (seed, step), whatever the number of processes, so a
run resumes at any step without replaying the ones before, and N processes train on exactly the rows
one process would. Under torchrun each process holds only its share of every batch: rows of a tensor
in turn, or, for a model, the windows of text it runs itself.

From a model, activations are harvested a block at a time: `buffer_tokens` worth of windows (consecutive
slices of a fresh permutation of the windows per epoch) are run, `harvest_batch` windows per forward,
through the layers the hooks need only (`stop_at_layer`), each hook copying into one buffer allocated
once (`run_with_cache_into`); the block's positions are then shuffled and cut into the steps' batches.
"""
from __future__ import annotations

import hashlib
from typing import Optional, cast

import torch
from jaxtyping import Float, Int

from ..._core.distributed import world_and_rank
from ..._core.inputs import TextOrTokens
from ..._core.inputs import stream_windows as windows
from ..._core.model import HookedModel, require_hooks
from ..files import hook_layer
from ..sae import hook_widths

_PERMS: dict = {}


def _perm(n: int, seed: int, salt: int) -> torch.Tensor:
    """A permutation of range(n) fixed by (seed, salt); the last few are kept (every step reads one)."""
    key = (n, seed, salt)
    if key not in _PERMS:
        if len(_PERMS) > 8:
            _PERMS.pop(next(iter(_PERMS)))
        _PERMS[key] = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1_000_003 + salt))
    return _PERMS[key]


def epoch_slice(n: int, size: int, index: int, seed: int, salt: int = 0) -> Int[torch.Tensor, " size"]:
    """Item `index` of the sequence cut into `size`-long slices from one fresh permutation of range(n)
    per epoch (a slice may span two epochs)."""
    start, parts, got = index * size, [], 0
    while got < size:
        epoch, offset = divmod(start + got, n)
        parts.append(_perm(n, seed, salt + 7919 * epoch)[offset:offset + size - got])
        got += len(parts[-1])
    return torch.cat(parts)


def check_activations(x: Float[torch.Tensor, "*n d_in"], what: str) -> None:
    if not x.is_floating_point():
        raise TypeError(f"{what} must be floating point, got dtype {x.dtype} (token ids go with a model: "
                        "train_sae(model, data=ids, hook=...))")
    if torch.isfinite(x.sum()):  # one pass: any NaN or infinity makes the sum so (finite values may overflow it)
        return
    bad = ~torch.isfinite(x)
    if bad.any():
        row = int(bad.reshape(-1, x.shape[-1]).any(-1).nonzero()[0])
        raise ValueError(f"{what}: NaN or infinite values (first in row {row}); an SAE cannot learn from them")


class TensorSource:
    """Activations given as a tensor [n, d_in]; step s's batch is rows epoch_slice(n, batch, s)."""

    def __init__(self, acts: Float[torch.Tensor, "*n d_in"], hook: Optional[str], batch_size: int, seed: int) -> None:
        if not isinstance(acts, torch.Tensor):
            raise TypeError(f"source must be a hooked model or a tensor of activations, got {type(acts).__name__}")
        if acts.dim() < 2 or acts.numel() == 0:
            raise ValueError(f"activations must be a non-empty [n, d_in] tensor, got shape {list(acts.shape)}")
        check_activations(acts, "the activations")
        self.acts = acts.reshape(-1, acts.shape[-1])
        self.hooks = [hook]
        self.batch_size, self.seed = batch_size, seed
        self.widths = {hook: int(self.acts.shape[-1])}
        self.model = None

    def fingerprint(self) -> str:
        h = hashlib.sha256(f"{tuple(self.acts.shape)}|{self.acts.dtype}|".encode())
        h.update(self.acts.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
        return h.hexdigest()[:16]

    def describe(self) -> str:
        return f"a tensor of {self.acts.shape[0]} activations"

    def batch(self, step: int) -> dict:
        """{hook: this process's rows of step's batch [rows, d_in]}."""
        n_proc, rank = world_and_rank()
        idx = epoch_slice(self.acts.shape[0], self.batch_size, step, self.seed)[rank::n_proc]
        return {self.hooks[0]: self.acts.index_select(0, idx).float()}


class ModelSource:
    """Activations at `hooks` of `model` on `data` (text, texts or ids), harvested a block at a time."""

    def __init__(self, model: HookedModel, data: Optional[TextOrTokens], hooks: list[str], batch_size: int, seed: int,
                 seq_len: Optional[int], harvest_batch: int, buffer_tokens: int) -> None:
        if data is None:
            raise ValueError("training from a model needs data=: text, a list of texts or token ids")
        require_hooks(model, [])
        require_hooks(model, hooks)
        self.model, self.hooks, self.batch_size, self.seed = model, list(hooks), batch_size, seed
        self.windows = windows(model, data, seq_len)  # [n_windows, T] ids; small beside the activations
        n_win, self.T = self.windows.shape
        self.per_block = -(-max(buffer_tokens, batch_size) // self.T)  # windows per block
        self.steps_per_block = self.per_block * self.T // batch_size
        self.harvest_batch = harvest_batch
        layers = [hook_layer(h) for h in self.hooks]
        n_layers = int(model.cfg.n_layers)
        self.stop = None if any(v is None for v in layers) else min(max(cast(list[int], layers)) + 1, n_layers)
        self.widths = hook_widths(model, self.hooks)
        self.block: Optional[int] = None
        self.buffers: Optional[dict[str, torch.Tensor]] = None

    def fingerprint(self) -> str:
        return hashlib.sha256(self.windows.numpy().tobytes()).hexdigest()[:16]

    def describe(self) -> str:
        return f"{self.windows.numel()} tokens in {len(self.windows)} windows of {self.T}"

    def _harvest(self, block: int) -> None:
        """Run this process's windows of `block` into the reused buffers [local_windows, T, d] per hook."""
        n_proc, rank = world_and_rank()
        mine = epoch_slice(len(self.windows), self.per_block, block, self.seed, salt=1)[rank::n_proc]
        if self.buffers is None or self.buffers[self.hooks[0]].shape[0] != len(mine):
            self.buffers = {h: torch.empty(len(mine), self.T, self.widths[h]) for h in self.hooks}
        device = self.model.cfg.device
        with torch.inference_mode():
            for i in range(0, len(mine), self.harvest_batch):
                ids = self.windows[mine[i:i + self.harvest_batch]].to(device)
                views = {h: b[i:i + len(ids)] for h, b in self.buffers.items()}
                self.model.run_with_cache_into(ids, views, stop_at_layer=self.stop)
        for h, b in self.buffers.items():
            check_activations(b, f"the activations at {h!r} (block {block} of the data)")
        self.block = block

    def batch(self, step: int) -> dict:
        block, j = divmod(step, self.steps_per_block)
        if self.block != block:
            self._harvest(block)
        n_proc, rank = world_and_rank()
        g = _perm(self.per_block * self.T, self.seed, 2 + 7919 * block)[j * self.batch_size:(j + 1) * self.batch_size]
        slot, t = g // self.T, g % self.T
        keep = slot % n_proc == rank
        local = (slot[keep] // n_proc) * self.T + t[keep]
        assert self.buffers is not None  # filled by the _harvest of this block
        return {h: b.view(-1, b.shape[-1])[local] for h, b in self.buffers.items()}

