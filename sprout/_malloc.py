"""Let the C allocator keep freed memory for the next batch instead of handing it back to the kernel.

Nothing here runs at import: call `sprout.keep_freed_memory()` once, in a process that makes many large
activation caches (the benchmarks do). Why it helps: a cache of every hook is hundreds of MB of fresh
tensors per call. With glibc's defaults, blocks above a (dynamic, at most 32 MiB) threshold are mmap-ed
and unmapped on free, and free memory at the top of the heap is trimmed, so every call page-faults its
cache in again, one zeroed 4 KiB page at a time. The measured effect is in docs/reference/benchmarks.md.
"""
from __future__ import annotations

import ctypes
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
MMAP_THRESHOLD = 64 * 2**20
TRIM_THRESHOLD = 2**30


def keep_freed_memory() -> bool:
    """Serve blocks up to 64 MiB from the heap and keep up to 1 GiB of freed heap for reuse (glibc only).

    The setting is process-wide and lasts until the process ends: the cost is that the process may hold
    up to 1 GiB of freed memory. On anything but Linux with glibc it does nothing.

    Returns:
        True if glibc's mmap and trim thresholds were set, False if this C library has no such setting.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)  # the C library this process already uses
        libc.gnu_get_libc_version  # noqa: B018 -- only glibc has it (musl also has mallopt, as a no-op)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
