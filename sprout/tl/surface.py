"""How a hooked model shows its components' work under TransformerLens' names, one line a name.

`HookedLM` holds its components as typed attributes (`weights`, `hook_flags`, `codec`) and declares each
TransformerLens name on itself: `ReadOnly` for an attribute computed on each read (`W_Q`, `QK`),
`delegate` for a method whose body, signature and docstring are a component's (`to_tokens`,
`set_use_split_qkv_input`). `help(model.to_tokens)` and `inspect.signature` read the component's.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Concatenate, Generic, NoReturn, Optional, ParamSpec, TypeVar, overload

T = TypeVar("T")
C = TypeVar("C")
P = ParamSpec("P")


class ReadOnly(Generic[T]):
    """A read-only attribute computed on each read from the model, as a property without a setter."""

    def __init__(self, get: Callable[[Any], T], doc: str) -> None:
        self.get = get
        self.__doc__ = doc
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, model: None, owner: Optional[type] = None) -> ReadOnly[T]: ...
    @overload
    def __get__(self, model: object, owner: Optional[type] = None) -> T: ...

    def __get__(self, model, owner=None):
        return self if model is None else self.get(model)

    def __set__(self, model: object, value: NoReturn) -> None:
        # A data descriptor (one with __set__) is never shadowed by the instance's __dict__.
        raise AttributeError(f"{type(model).__name__}.{self.name} is read-only: it is computed from the modules' "
                             "parameters on each read (change those, e.g. model.blocks[0].attn.qkv.weight)")


def delegate(component: str, method: Callable[Concatenate[C, P], T]) -> Callable[Concatenate[Any, P], T]:
    """A model method that runs `method` on the model's attribute `component`, under its name and docstring."""
    @functools.wraps(method)
    def call(model: Any, *args: P.args, **kwargs: P.kwargs) -> T:
        return method(getattr(model, component), *args, **kwargs)
    return call
