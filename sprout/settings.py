"""Checked settings: frozen dataclasses whose every field is type- and range-checked when one is made.

`sprout train`'s `Recipe` and interp's trainers (`train_tuned_lens`) share this, so a setting is refused
the same way everywhere, before any work, with the field's name and the value typed: a bool is not a
number, NaN and inf are not finite, 2.0 is not an integer, and each field has its range.

A subclass is a `@dataclass(frozen=True)` with annotated fields ("int", "float", "str", "bool", or
"Optional[...]" of one of them, where None is allowed), a class attribute `RANGES` mapping field names to
a rule, and, optionally, `check_together` for rules that tie fields together and `bad` for its wording.
A rule is a set of allowed values or (low, high, ends): ends "[" (>= low), "(" (> low), or two of "[]()"
for low and high ("[)": low <= value < high).
"""
from __future__ import annotations

import inspect
import io
import math
import tokenize
import typing
from dataclasses import asdict, fields
from typing import TYPE_CHECKING, Any, ClassVar, Optional, TypeVar, Union

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

_TYPES = {
    "int": (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    "float": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v), "a finite number"),
    "str": (lambda v: isinstance(v, str), "a string"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
}


T = TypeVar("T", bound="DataclassInstance")
C = TypeVar("C", bound="Checked")
# a range rule: a set of allowed values, or (low, high or None, ends) (see the module)
Rule = Union[set, frozenset, tuple[Any, Any, str]]


def annotation_name(kind: object) -> str:
    """An annotation as the text `from __future__ import annotations` leaves: int -> "int", Optional[int] -> "Optional[int]"."""
    if isinstance(kind, str):
        return kind
    args = typing.get_args(kind)
    if len(args) == 2 and type(None) in args:
        return f"Optional[{annotation_name(next(a for a in args if a is not type(None)))}]"
    return getattr(kind, "__name__", str(kind))


def field_comments(cls: type) -> dict[str, str]:
    """Each dataclass field's comment in the class's source, as one line (command-line help written once,
    where the field is): the comment after the field, continued by the comment lines below it; comment
    lines above a field that has no comment of its own are its comment instead. Section rules
    (`# --- data`) and fields without a comment are left out.

    >>> from sprout.training.recipes import Recipe
    >>> field_comments(Recipe)["grad_clip"]
    'max global gradient norm; 0 = no clipping (as in nanoGPT)'
    """
    names = {f.name for f in fields(cls)}
    lines: list[tuple[Optional[str], str]] = []  # (field or None for a comment line, its comment)
    for tok in tokenize.generate_tokens(io.StringIO(inspect.getsource(cls)).readline):
        code = tok.line.split("#")[0].strip()
        first = code.split(":")[0].split("=")[0].strip()
        if tok.type == tokenize.COMMENT and not tok.string.lstrip("# ").startswith("---"):
            if not code or first in names:
                lines.append((first or None, tok.string.lstrip("#").strip()))
        elif tok.type == tokenize.NAME and tok.start[1] == 4 and "#" not in tok.line:
            lines.append((tok.string if tok.string in names else "", ""))  # "": not a field, ends the last
    comments: dict[str, list[str]] = {}
    pending: list[str] = []  # comment lines since the last field
    last: Optional[str] = None
    for field, text in lines + [("", "")]:
        if field is None:
            pending.append(text)
            continue
        if text or not field:  # the next line speaks for itself: the lines above continue the last field's
            if last in comments:
                comments[last] += pending
        else:  # a field without a comment: the lines above are its comment
            comments[field] = pending
        pending = []
        if text:
            comments[field] = [text]
        last = field
    return {name: " ".join(parts) for name, parts in comments.items() if parts}


def type_error(kind: object, value: object) -> Optional[str]:
    """What a value of annotation `kind` ("int", "Optional[float]", or the type itself) must be, or None when
    `value` is one."""
    kind = annotation_name(kind)
    optional = kind.startswith("Optional[") and kind.endswith("]")
    base = kind[len("Optional["):-1] if optional else kind
    if optional and value is None:
        return None
    ok, expected = _TYPES[base]
    return None if ok(value) else expected + (" or None" if optional else "")


def range_error(rule: Optional[Rule], value: Any) -> Optional[str]:
    """What a value under `rule` must be, or None when `value` satisfies it (None always does)."""
    if rule is None or value is None:
        return None
    if isinstance(rule, (set, frozenset)):
        return None if value in rule else " or ".join(repr(c) for c in sorted(rule))
    low, high, ends = rule
    above = value >= low if ends[0] == "[" else value > low
    below = high is None or (value <= high if ends[-1] == "]" else value < high)
    if above and below:
        return None
    return f">= {low}" if ends == "[" else f"> {low}" if ends == "(" else f"in {ends[0]}{low}, {high}{ends[-1]}"


def strict_from_dict(cls: type[T], d: dict[str, Any], what: str) -> T:
    """Build dataclass `cls` from a dict; unknown keys are an error (a typo must not become a default)."""
    if not isinstance(d, dict):
        raise ValueError(f"{what} must be a mapping of field names to values, got {type(d).__name__}")
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
        raise ValueError(f"unknown {what} keys {unknown}; expected some of {sorted(known)}")
    return cls(**d)


class Checked:
    """Base of a frozen dataclass of settings: every field checked in `__post_init__` (see the module)."""

    __dataclass_fields__: ClassVar[dict[str, Any]]  # a subclass is a dataclass (what `fields` reads)
    RANGES: dict = {}
    WHAT = "settings"  # how messages and `from_dict` name the whole

    def __post_init__(self) -> None:
        for f in fields(self):
            expected = type_error(f.type, getattr(self, f.name))
            if expected:
                raise self.bad(f.name, expected, getattr(self, f.name))
        for name, value in self.to_dict().items():
            expected = range_error(self.RANGES.get(name), value)
            if expected:
                raise self.bad(name, expected, value)
        self.check_together()

    @classmethod
    def bad(cls, name: str, expected: str, value: object) -> ValueError:
        return ValueError(f"{cls.WHAT} field {name} must be {expected}, got {value!r}")

    def check_together(self) -> None:
        """Rules that tie fields together (none by default)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls: type[C], d: dict[str, Any]) -> C:
        return strict_from_dict(cls, d, cls.WHAT)

    def override(self: C, **changes: Any) -> C:
        return self.from_dict({**self.to_dict(), **changes})

    def differences(self, other: Checked) -> list[str]:
        """"field: was X, now Y" for every field where `other` (the earlier settings) differs from these."""
        return changes(other.to_dict(), self.to_dict())


def changes(saved: dict[str, Any], now: dict[str, Any], was: str = "was") -> list[str]:
    """"field: was X, now Y" for every field whose value differs between two settings dicts, in `now`'s order
    (then fields only `saved` has); `was` names the saved side ("run has", "checkpoint"). What
    `Checked.differences` and the trainers' resume check (`sprout.training.core.resume_changes`) say."""
    keys = list(now) + [k for k in saved if k not in now]
    return [f"{k}: {was} {saved.get(k)!r}, now {now.get(k)!r}" for k in keys if saved.get(k) != now.get(k)]
