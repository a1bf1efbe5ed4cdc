"""Heads and components, named one way everywhere: `Head(3, 1)` is "L3H1"; a component is a head, "MLP2" or "embed".

Every analysis that takes heads (`ablate_heads`, `path_patch`, `phase_measures`, `induction_circuit`)
parses them here and every frame labels them here, so "L3H1", (3, 1) and `Head(3, 1)` mean the same
head in all of them, and a float, a bool or an out-of-range number is refused naming the spec.
"""
from __future__ import annotations

import re
from typing import Iterable, NamedTuple, Optional, Union

from sprout.names import head_label

from .model import HookedModel, as_index, model_name, n_heads, n_layers

_HEAD = re.compile(r"^L(\d+)H(\d+)$")
_MLP = re.compile(r"^MLP(\d+)$")
COMPONENT_KINDS = ("embed", "head", "mlp")
VIA = ("q", "k", "v")  # a receiving head's inputs (query, key, value) a path or a composition goes through


def patch_label(layer: int, head: Optional[int] = None, pos: Optional[int] = None) -> str:
    """A patch's label: "L3" (a whole layer), "L3H1" (a head), with "@5" for one position."""
    name = head_label(layer, head)
    return name if pos is None else f"{name}@{pos}"


class Head(NamedTuple):
    """An attention head: `layer`, `head` (0-based); prints as "L{layer}H{head}"."""

    layer: int
    head: int

    @property
    def label(self) -> str:
        return head_label(self.layer, self.head)

    def __str__(self) -> str:
        return self.label


class Component(NamedTuple):
    """A write to the residual stream: kind "head" (layer, head), "mlp" (layer, head -1) or "embed" (-1, -1)."""

    kind: str
    layer: int = -1
    head: int = -1

    @property
    def label(self) -> str:
        if self.kind == "head":
            return head_label(self.layer, self.head)
        return f"MLP{self.layer}" if self.kind == "mlp" else "embed"

    def __str__(self) -> str:
        return self.label


# What names a head: "L3H1", a (layer, head) pair of integers, a Head, or a head Component; a component is
# also "MLP{layer}" or "embed". One spec, or an iterable of them, where a function takes several.
HeadSpec = Union[str, tuple[int, int], "Head", "Component"]
ComponentSpec = HeadSpec
HeadSpecs = Union[HeadSpec, Iterable[HeadSpec]]
ComponentSpecs = HeadSpecs


def _in_range(model: HookedModel, value: int, n: int, what: str, spec) -> int:
    if not 0 <= value < n:
        raise ValueError(f"{what} {value} is out of range in {spec!r}: {model_name(model)} has {n} {what}s (0..{n - 1})")
    return value


def _index(value, what: str, spec) -> int:
    try:
        return as_index(value, what)
    except TypeError as e:
        raise TypeError(f"{e} in the head {spec!r}") from None


def _is_pair(spec) -> bool:
    return not isinstance(spec, (str, bytes)) and hasattr(spec, "__len__") and hasattr(spec, "__getitem__")


def as_head(model: HookedModel, spec: HeadSpec) -> Head:
    """"L3H1", (3, 1) of integers, or a Head -> Head(3, 1), checked against the model.

    Raises:
        TypeError: not a head spec, or a layer or head that is a float or a bool.
        ValueError: a layer or head the model does not have.
    """
    if isinstance(spec, Component):
        if spec.kind != "head":
            raise ValueError(f"{spec.label!r} is not an attention head: only heads ('L{{layer}}H{{head}}') are read here")
        spec = Head(spec.layer, spec.head)
    if isinstance(spec, str):
        m = _HEAD.match(spec.strip())
        if m is None and (_MLP.match(spec.strip()) or spec.strip() == "embed"):
            raise ValueError(f"{spec!r} is not an attention head: only heads ('L{{layer}}H{{head}}') are read here")
        if m is None:
            raise ValueError(f"cannot read the head {spec!r}: write 'L{{layer}}H{{head}}' (e.g. 'L1H0') or (layer, head)")
        layer, head = int(m.group(1)), int(m.group(2))
    elif _is_pair(spec) and len(spec) == 2:
        layer, head = _index(spec[0], "layer", spec), _index(spec[1], "head", spec)
    else:
        raise TypeError(f"each head is a (layer, head) pair of integers or 'L{{layer}}H{{head}}', got {spec!r}")
    return Head(_in_range(model, layer, n_layers(model), "layer", spec), _in_range(model, head, n_heads(model), "head", spec))


def as_component(model: HookedModel, spec: ComponentSpec) -> Component:
    """A head ("L1H2", (1, 2), Head), "MLP{layer}" or "embed" -> a Component, checked against the model."""
    if isinstance(spec, Component):
        if spec.kind not in COMPONENT_KINDS:
            raise ValueError(f"unknown component kind {spec.kind!r}; choose one of {list(COMPONENT_KINDS)}")
        if spec.kind == "embed":
            return Component("embed")
        if spec.kind == "mlp":
            return Component("mlp", _in_range(model, _index(spec.layer, "layer", spec), n_layers(model), "layer", spec))
    if isinstance(spec, str):
        text = spec.strip()
        if text == "embed":
            return Component("embed")
        if m := _MLP.match(text):
            return Component("mlp", _in_range(model, int(m.group(1)), n_layers(model), "layer", spec))
        if not _HEAD.match(text):
            raise ValueError(f"cannot read the component {spec!r}: write 'L{{layer}}H{{head}}' (or (layer, head)), "
                             "'MLP{layer}' or 'embed'")
    head = as_head(model, spec)
    return Component("head", head.layer, head.head)


def _many(specs, what: str) -> list:
    if isinstance(specs, (str, Head, Component)) or (isinstance(specs, tuple) and len(specs) == 2 and not any(
            isinstance(s, (str, bytes)) or _is_pair(s) for s in specs)):
        return [specs]  # one spec: "L1H0", Head(1, 0), (1, 0); ("L1H0", "L2H1") is two
    if not hasattr(specs, "__iter__"):
        raise TypeError(f"{what} must be one spec or a list of them, got {specs!r}")
    specs = list(specs)
    if not specs:
        raise ValueError(f"no {what} given")
    return specs


def as_heads(model: HookedModel, specs: HeadSpecs, what: str = "heads") -> list[Head]:
    """One head spec or a list of them -> [Head], in order (duplicates kept)."""
    return [as_head(model, s) for s in _many(specs, what)]


def as_components(model: HookedModel, specs: ComponentSpecs, what: str = "components") -> list[Component]:
    """One component spec or a list of them -> [Component], in order (duplicates kept)."""
    return [as_component(model, s) for s in _many(specs, what)]


def all_heads(model: HookedModel, below: Optional[int] = None) -> list[Head]:
    """Every head, layer-major (only those in layers below `below`, when given)."""
    top = n_layers(model) if below is None else below
    return [Head(l, h) for l in range(top) for h in range(n_heads(model))]
