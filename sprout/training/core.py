"""The trainers' shared core: one gradient reduction, one clipping, one resume check, one settings-to-flags
rule, and the learning-rate setter every optimizer here answers to.

Three trainers use it: the model's (`sprout.training.loop`, torch's AdamW), the tuned lens'
(`interp.lens.train`, torch's SGD with Nesterov momentum, the tuned-lens recipe) and the dictionaries'
(`interp.saes.training`, `Adam` below). A step in each is

    loss.backward(); reduce_grads(params, world); clip_grads(params, max_norm); set_lr(opt, lr); opt.step()

`sprout.training` imports nothing of `interp`; `interp`'s trainers import this module.
"""
from __future__ import annotations

import argparse
import math
from dataclasses import fields
from typing import Any, Callable, Iterable, Mapping, Optional, Union, cast

import torch
import torch.distributed as dist

from ..settings import Checked, Rule, annotation_name, changes, field_comments, range_error, type_error

__all__ = ["Adam", "add_settings_flags", "clip_grads", "flag", "reduce_grads", "resume_changes", "set_lr", "settings_from_flags"]


def reduce_grads(params: Iterable[torch.Tensor], world: int, mean: bool = True) -> None:
    """Data parallelism's one all-reduce: every process ends with the mean (or, `mean=False`, the sum) of
    the processes' gradients, in one flat message. Nothing happens on one process.

    A parameter without a gradient counts as a zero gradient (every process must send the same sizes).
    Sum is for a loss already divided by the global batch (the dictionaries'), mean for a per-process mean.
    """
    if world == 1:
        return
    params = list(params)
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    grads = [cast(torch.Tensor, p.grad) for p in params]  # all set just above
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    if mean:
        flat /= world
    for g, chunk in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(chunk.view_as(g))


def clip_grads(params: Iterable[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Scale the gradients down to global norm `max_norm` (torch's `clip_grad_norm_`); returns the norm
    before clipping. `max_norm` 0 means no clipping (as in nanoGPT): the norm is still measured."""
    # clip_grad_norm_ with inf multiplies by min(inf / norm, 1) = 1: the gradients are left as they are
    return torch.nn.utils.clip_grad_norm_(params, max_norm or math.inf)


def set_lr(optimizer: Union[torch.optim.Optimizer, Adam], lr: float) -> None:
    """The learning rate of every parameter group (a schedule sets it before each step)."""
    for group in optimizer.param_groups:
        group["lr"] = lr


Settings = Union[Checked, Mapping[str, Any]]


def resume_changes(saved: Settings, now: Settings, was: str = "was") -> list[str]:
    """What differs between the settings a run was saved with and this call's: "field: was X, now Y" per
    field, in `now`'s order (then fields only `saved` has). Either side is a `Checked` or its dict; `was`
    names the saved side ("run has", "checkpoint").

    >>> resume_changes({"lr": 0.1, "steps": 5}, {"lr": 0.2, "steps": 5})
    ['lr: was 0.1, now 0.2']
    """
    old = saved.to_dict() if isinstance(saved, Checked) else dict(saved)
    return changes(old, now.to_dict() if isinstance(now, Checked) else dict(now), was)  # Checked.differences' words


class Adam:
    """Adam (Kingma & Ba 2015) over a few tensors, written out, for the dictionaries' trainer.

    Why not `torch.optim.Adam`: its first step imports torch._dynamo (0.9 s measured on a 2-core CPU,
    a sizeable share of a short dictionary run), and the trainer's checkpoint stores the moments as named
    tensors (`m`, `v`, `t`), which this keeps plain. Its arithmetic (m * b1 + (1 - b1) g, then
    m / (sqrt(v / c2) + eps)) is kept as it was, so runs stay bit-identical to earlier ones. It answers
    to the core as torch's optimizers do: `param_groups`, `step()`, `zero_grad()`.
    """

    def __init__(self, params: Iterable[torch.Tensor], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8) -> None:
        self.params, self.betas, self.eps = list(params), betas, eps
        self.param_groups: list[dict[str, Any]] = [{"params": self.params, "lr": lr}]
        self.t = 0
        self.m = [torch.zeros_like(p) for p in self.params]
        self.v = [torch.zeros_like(p) for p in self.params]

    @torch.no_grad()
    def step(self) -> None:
        """One Adam step at `param_groups[0]["lr"]` (every trained parameter has a gradient)."""
        lr = self.param_groups[0]["lr"]
        self.t += 1
        b1, b2 = self.betas
        c1, c2 = 1 - b1 ** self.t, 1 - b2 ** self.t
        for p, m, v in zip(self.params, self.m, self.v):
            grad = cast(torch.Tensor, p.grad)
            m.mul_(b1).add_(grad, alpha=1 - b1)
            v.mul_(b2).addcmul_(grad, grad, value=1 - b2)
            p.addcdiv_(m, (v / c2).sqrt_().add_(self.eps), value=-lr / c1)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()


# ----------------------------------------------------------------------------- command lines

_KINDS = {"int": int, "float": float, "str": str}


def _base(kind: str) -> str:
    return kind[len("Optional["):-1] if kind.startswith("Optional[") else kind


def flag(name: str) -> str:
    """The command-line flag of a settings field: grad_clip -> --grad-clip."""
    return "--" + name.replace("_", "-")


def _checked(kind: str, rule: Optional[Rule]) -> Callable[[str], Any]:
    """An argparse type for a field of `kind` under a range `rule`: a bad value is a usage error naming the
    flag ("argument --steps: expected a whole number >= 1, got -1"), before any work."""
    words = {"int": "a whole number", "float": "a finite number", "str": "a string"}[kind]

    def parse(text: str) -> Any:
        try:
            value = _KINDS[kind](text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {words}, got {text!r}") from None
        bad = type_error(kind, value) or range_error(rule, value)
        if bad:
            expected = bad if kind == "str" else f"{words} {bad}"  # a str's rule is its choices
            raise argparse.ArgumentTypeError(f"expected {expected}, got {value!r}")
        return value
    parse.__name__ = kind
    return parse


def add_settings_flags(parser: argparse.ArgumentParser, cls: type, title: str, skip: Iterable[str] = (),
                       ranges: bool = False) -> None:
    """One flag per field of the settings dataclass `cls` (`--grad-clip` for `grad_clip`), its help the field's
    comment (`sprout.settings.field_comments`), its default None (= the settings' own default). Fields of a
    type a flag cannot hold (lists) and those in `skip` are left out. With `ranges`, each value is checked
    against the field's type and range (`cls.RANGES`) as it is parsed, a usage error naming the flag."""
    group = parser.add_argument_group(title)
    helps = field_comments(cls)
    for f in fields(cls):
        kind = _base(annotation_name(f.type))
        if f.name in skip or kind not in {*_KINDS, "bool"}:
            continue
        help_ = helps.get(f.name, "").replace("%", "%%")
        if kind == "bool":
            group.add_argument(flag(f.name), dest=f.name, default=None, action=argparse.BooleanOptionalAction, help=help_)
            continue
        type_ = _checked(kind, getattr(cls, "RANGES", {}).get(f.name)) if ranges else _KINDS[kind]
        group.add_argument(flag(f.name), dest=f.name, type=type_, default=None, metavar=kind.upper(), help=help_)


def settings_from_flags(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    """The fields given on the command line (those `add_settings_flags` added and the user set)."""
    return {f.name: getattr(args, f.name) for f in fields(cls) if getattr(args, f.name, None) is not None}
