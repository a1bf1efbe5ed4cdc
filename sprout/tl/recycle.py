"""Let the last activation cache's memory go just in time for the next cache to reuse it.

A cache of every hook is hundreds of MB of fresh tensors per call. With glibc's malloc defaults, once the
caller drops a cache its blocks merge into the free top of the heap, which is handed back to the kernel,
so the next cache page-faults all of it in again, one zeroed 4 KiB page at a time (measured: a full
cache at 1.6-1.8x the plain forward on one thread, against 1.1-1.2x without the faults). Process-wide
allocator settings avoid that (`sprout.keep_freed_memory`), but a library must not make them.

So the model keeps the tensors of its last caches (up to `max_bytes` each) and, during the next call,
lets go of the last cache's (i+1)-th activation, if the caller dropped it, as soon as the new i-th is
stored: each block is freed just before the forward asks for a block of the same size, which malloc then
hands out again, still mapped, before it could reach the top of the heap.

Ownership is explicit: each call's tensors form a `Generation`, which `run_with_cache` hands to the
ActivationCache it returns (`Generation.hand_to`), keeping only a weak reference to it. The generation
counts as dropped once that cache object is gone (or if the call raised and no cache was handed out).
Tensors the caller took out of a dropped cache stay the caller's: the recycler only lets go of its own
references, so their memory is not freed and only its reuse is missed. (An earlier version asked
CPython's reference counts whether anyone held the tensors; the weak reference says the same for the
usual `_, cache = model.run_with_cache(...)` at no cost, and a reader can follow it. Recycling stays
on by default because the default allocator is what users have: docs/reference/benchmarks.md.)

The cache a loop's `cache` variable still holds during the next call (`_, cache =
model.run_with_cache(batch)`) is kept; dropped after that call, it has a newer cache above it in the
heap, so the call after frees it at once and reuses its blocks. A smaller cache in between (fewer hooks)
keeps what it did not reuse for the next large one.

Only references are dropped, never memory written: a tensor the caller still holds is untouched. Blocks
above malloc's mmap threshold (at most 32 MiB) are mapped anew whatever we do. Between calls the model
holds at most `max_bytes` the caller dropped: `model.cache_recycler.release()` lets go of it, and
`max_bytes = 0` turns recycling off.
"""
from __future__ import annotations

import weakref
from contextlib import contextmanager
from typing import Any, Iterator, Optional

import torch

RETAIN_BYTES = 2**30  # at most this much of a dropped cache is held between calls


class Generation:
    """One cached call's stored tensors, and the cache object they were handed to (weakly: the caller owns it)."""

    def __init__(self, tensors: list[torch.Tensor]) -> None:
        self.tensors = tensors
        self._owner: Optional[weakref.ref] = None  # None until handed out: a call that raised left no cache

    def hand_to(self, cache: Any) -> None:
        """The caller now holds these tensors through `cache`; they are ours to recycle once it is gone."""
        self._owner = weakref.ref(cache)

    @property
    def dropped(self) -> bool:
        return self._owner is None or self._owner() is None


class CacheRecycler:
    """The last caches' tensors, released one by one as the next cache is filled (see the module docstring)."""

    def __init__(self, max_bytes: int = RETAIN_BYTES) -> None:
        self.max_bytes = max_bytes
        self._generations: list[Generation] = []  # the last calls' tensors, oldest first
        self._recycling: list[Optional[torch.Tensor]] = []  # a dropped cache, let go of during a call
        self._kept: Optional[list[torch.Tensor]] = None  # the running call's tensors; None between calls
        self._kept_bytes = 0
        self._stored = 0

    @property
    def active(self) -> bool:
        """Whether a cached forward is running (its caching hooks report to `stored`)."""
        return self._kept is not None

    @property
    def held_bytes(self) -> int:
        """Bytes of storage the recycler refers to, counted per tensor (views of one storage count once
        each; some of it may be the caller's own caches too)."""
        return sum(t.untyped_storage().nbytes() for g in self._generations for t in g.tensors)

    @contextmanager
    def cycle(self) -> Iterator[Generation]:
        """One cached forward: a dropped cache's tensors are let go of as this one's are stored. Yields
        this call's `Generation`, for the caller to hand to the cache it returns. A cached forward inside
        one (a hook calling run_with_cache) recycles nothing of its own: its generation is empty and not kept."""
        if self._kept is not None:
            yield Generation([])
            return
        dropped = [g.dropped for g in self._generations]
        # Only the newest cache lies at the top of the heap, where freeing it at once would trim it away;
        # an older one the caller dropped has a live cache above it, so its blocks are freed now, for reuse.
        self._recycling = list(self._generations[-1].tensors) if dropped and dropped[-1] else []
        self._generations = [g for g, gone in zip(self._generations, dropped) if not gone]
        self._kept, self._kept_bytes, self._stored = [], 0, 0
        self._drop(0)
        generation = Generation(self._kept)
        try:
            yield generation
        finally:
            generation.tensors = self._kept + self._leftover()
            self._generations = (self._generations + [generation])[-2:]
            self._recycling, self._kept = [], None

    def stored(self, x: torch.Tensor) -> None:
        """Called by a caching hook once it has stored activation x."""
        if self._kept is None:
            return
        self._stored += 1
        self._drop(self._stored)
        if x.device.type != "cpu":  # CUDA's caching allocator already reuses its blocks
            return
        n = x.untyped_storage().nbytes()
        if self._kept_bytes + n <= self.max_bytes:
            self._kept.append(x)
            self._kept_bytes += n

    def _leftover(self) -> list[torch.Tensor]:
        """The dropped cache's tensors this call did not reach (a smaller cache: fewer hooks, a shorter
        input), kept with it under the same cap: freed now, their blocks would be trimmed off the heap and
        the next large cache would page-fault them in again."""
        out = []
        for t in self._recycling:
            if t is not None and self._kept_bytes + t.untyped_storage().nbytes() <= self.max_bytes:
                out.append(t)
                self._kept_bytes += t.untyped_storage().nbytes()
        return out

    def release(self) -> None:
        """Let go of every held tensor now (its memory is freed unless the caller still holds it)."""
        self._generations = []

    def _drop(self, i: int) -> None:
        if i < len(self._recycling):
            self._recycling[i] = None

