"""Keywords renamed so that one idea has one name across interp (docs/guide/analyses.md, "Renamed keywords"): the old
keyword still works for one release, with a DeprecationWarning naming the new one.

An error about the value names the keyword as the caller wrote it (`patches_per_forward must be ...`
for a call that still says `patches_per_forward=`), so a message never points at a word not in the call.
"""
from __future__ import annotations

import functools
import warnings
from typing import Callable


def renamed(**old_to_new: str) -> Callable:
    """A decorator: `@renamed(text_or_tokens="data")` lets callers still pass `text_or_tokens=`."""
    def wrap(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def inner(*args, **kwargs):
            used = {}
            for old, new in old_to_new.items():
                if old not in kwargs:
                    continue
                if new in kwargs:
                    raise TypeError(f"{fn.__name__}() got both {new}= and its deprecated old name {old}=: pass {new}= only")
                warnings.warn(f"{fn.__name__}({old}=...) is deprecated and will be removed in the next release: "
                              f"use {new}=", DeprecationWarning, stacklevel=2)
                kwargs[new], used[new] = kwargs.pop(old), old
            try:
                return fn(*args, **kwargs)
            except (TypeError, ValueError) as e:
                hit = next((n for n in used if str(e).startswith(f"{n} ")), None)
                if hit is None:
                    raise
                raise type(e)(used[hit] + str(e)[len(hit):]) from None
        inner.renamed = dict(old_to_new)  # type: ignore[attr-defined]  # a function attribute, which mypy does not model
        return inner
    return wrap
