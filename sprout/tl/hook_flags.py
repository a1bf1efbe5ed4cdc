"""TransformerLens' hook flags: `set_use_attn_result`, `set_use_split_qkv_input`, `set_use_attn_in`,
`set_use_hook_mlp_in`, and the input hooks they switch on.

With `use_split_qkv_input` each block copies its residual stream once per head and per input
(`blocks.{l}.hook_q_input`, `hook_k_input`, `hook_v_input`, [batch, pos, head, d_model]), and each
copy goes through ln1 on its own before its head's projection, so a patch to one head's query input
reaches that head's query alone: what path patching and `patching.get_act_patch_direct_path` need.
`use_attn_in` makes one such copy per head shared by Q, K and V (`blocks.{l}.hook_attn_in`);
`use_hook_mlp_in` exposes the MLP's input before ln2 (`blocks.{l}.hook_mlp_in`, [batch, pos, d_model]),
a copy, so an edit there reaches the MLP and not the residual stream. All off by default, and a block
with them off runs exactly as before.

The flags live on `model.cfg` (TransformerLens reads and restores them there), and every block holds
that same config object (`block.flags`), so `model.cfg.use_split_qkv_input = True` works too. TransformerLens 4 names
the input hooks under `attn` (`blocks.{l}.attn.hook_q_input`, what its edge attribution patching
reads); those names resolve to the same hook points by name, and while a flag is on they are also
entries of `hook_dict`, so a cache of everything holds the activation under both names (one tensor).

A hook point whose flag is off never fires, so naming it (`add_hook`, `run_with_hooks`, `hooks()`,
`run_with_cache(names_filter=[...])`) is a `HookFlagError` naming the flag; a names *filter* that merely
matches it skips it, as TransformerLens does. `add_hook` also refuses `attn.hook_result` without
`use_attn_result`, as TransformerLens' does (Sprout computes it whenever it is hooked, so the other
entry points accept it).
"""
from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Callable, Optional, Protocol

import torch
import torch.nn as nn
from jaxtyping import Float
from transformer_lens.hook_points import HookPoint

from ..names import block
from .hook_checks import reads_only, through

if TYPE_CHECKING:
    from ..config import SproutTransformerLensConfig

INPUT_HOOKS = ("hook_q_input", "hook_k_input", "hook_v_input", "hook_attn_in")
_FLAG_OF = {"hook_q_input": "use_split_qkv_input", "hook_k_input": "use_split_qkv_input",
            "hook_v_input": "use_split_qkv_input", "hook_attn_in": "use_attn_in", "hook_mlp_in": "use_hook_mlp_in"}


def attn_alias(layer: int, name: str) -> str:
    """TransformerLens 4's name of block `layer`'s input hook `name` under `attn` ("blocks.0.attn.hook_q_input")."""
    return block(layer) + "attn." + name


class HookFlagError(ValueError, AssertionError):
    """A hook named on a hook point whose flag is off (an AssertionError too, as TransformerLens raises)."""


def gated_flag(cfg: SproutTransformerLensConfig, name: str) -> Optional[str]:
    """The flag that is off and without which the hook point `name` never fires, or None."""
    flag = _FLAG_OF.get(name.rsplit(".", 1)[-1])
    return flag if flag is not None and not getattr(cfg, flag, False) else None


def flag_error(name: str, flag: str) -> HookFlagError:
    return HookFlagError(f"{name} fires only with model.cfg.{flag} on: call model.set_{flag}(True) first")


def editable(x: torch.Tensor, point: HookPoint) -> torch.Tensor:
    """x, or a copy of it when a forward hook on `point` could edit it in place while autograd still
    needs x (a softmax or sqrt keeps its output for the backward pass; q, k, v are views of one matmul).
    Free without hooks and without autograd (inference, `torch.no_grad`)."""
    edits = x.requires_grad and ((point._forward_hooks and not reads_only(point)) or watched(point))
    return x.clone() if edits else x


def watched(point: HookPoint) -> bool:
    """Whether a tool has put its own `forward` on this hook point, as nnsight does on every module: it
    reads and writes the point's calls without a torch hook, so what is computed only for hooks (norm
    scales and outputs, attention scores and patterns) must be computed. One dict lookup per point."""
    return "forward" in point.__dict__


def observe(point: HookPoint, x: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """point(x), and whether x's values came through unchanged: `hook_checks.through`, and for a watched
    point (whose edits no torch hook shows) a comparison with a copy taken before the call."""
    if not watched(point):
        return through(point, x)
    before = x.clone()
    out = point(x)
    return out, torch.equal(out, before)


class InputHooks(Protocol):
    """What `per_head_inputs` reads of a block: its input hook points."""

    hook_q_input: HookPoint
    hook_k_input: HookPoint
    hook_v_input: HookPoint
    hook_attn_in: HookPoint


def per_head_inputs(block: InputHooks, x: Float[torch.Tensor, "batch pos d_model"], n_head: int, shared: bool,
                    norm: Callable[[torch.Tensor], torch.Tensor]) -> tuple[Float[torch.Tensor, "batch pos head d_model"], ...]:
    """Each head's own copy of resid_pre x [batch, pos, d_model], through the block's input hooks and
    then the norm copy by copy: the (q, k, v) inputs of its attention, each [batch, pos, head, d_model]."""
    def copies():
        return x.unsqueeze(2).repeat(1, 1, n_head, 1)

    if shared:
        attn_in = norm(block.hook_attn_in(copies()))
        return attn_in, attn_in, attn_in
    return tuple(norm(hook(copies())) for hook in (block.hook_q_input, block.hook_k_input, block.hook_v_input))


class Flagged(Protocol):
    """What `HookFlagRules` reads of its model: the config holding the flags, the blocks, the hook tables."""

    @property
    def cfg(self) -> SproutTransformerLensConfig: ...
    @property
    def blocks(self) -> nn.ModuleList: ...
    @property
    def hook_dict(self) -> dict[str, HookPoint]: ...
    @property
    def mod_dict(self) -> dict[str, nn.Module]: ...


class HookFlagRules:
    """The hook flags of one model whose blocks honour `cfg.use_split_qkv_input`, `use_attn_in` and
    `use_hook_mlp_in`: the `set_use_*` methods, which hook points fire only with a flag on, and
    TransformerLens 4's aliases of the input hooks. `HookedLM` holds one as `model.hook_flags`."""

    def __init__(self, model: Flagged) -> None:
        self.model = model

    def register_aliases(self) -> None:
        """After `setup()`: TransformerLens 4's names of the input hooks resolve to the same hook points."""
        self.alias_input_hooks()
        for l, blk in enumerate(self.model.blocks):
            for name in INPUT_HOOKS:
                if hasattr(blk, name):
                    self.model.mod_dict[attn_alias(l, name)] = getattr(blk, name)

    def alias_input_hooks(self) -> None:
        # TransformerLens 4's names for the input hooks, in hook_dict while their flag is on
        cfg, hook_dict = self.model.cfg, self.model.hook_dict
        for l, blk in enumerate(self.model.blocks):
            for name in INPUT_HOOKS:
                alias = attn_alias(l, name)
                if hasattr(blk, name) and gated_flag(cfg, name) is None:
                    hook_dict[alias] = getattr(blk, name)
                else:
                    hook_dict.pop(alias, None)

    def gated_flag(self, name: str) -> Optional[str]:
        """The flag (off) without which hook point `name` never fires, or None."""
        return gated_flag(self.model.cfg, name)

    def add_hook_flag(self, name: str) -> Optional[str]:
        """The flag add_hook needs for `name` and lacks: the input hooks' and, as TransformerLens, use_attn_result."""
        flag = self.gated_flag(name)
        if flag is None and name.endswith("attn.hook_result") and not self.model.cfg.use_attn_result:
            flag = "use_attn_result"
        return flag

    def refuse_off(self, name: str, needs: Optional[Callable[[str], Optional[str]]] = None) -> None:
        """A HookFlagError when hook point `name` needs a flag that is off (`needs`, default `gated_flag`)."""
        flag = (needs or self.gated_flag)(name)
        if flag is not None:
            raise flag_error(name, flag)

    def set_use_attn_result(self, use_attn_result: bool) -> None:
        """Cache each head's write (`attn.hook_result`) when caching everything (it is computed whenever hooked)."""
        self.model.cfg.use_attn_result = bool(use_attn_result)
        self.alias_input_hooks()

    def set_use_split_qkv_input(self, use_split_qkv_input: bool) -> None:
        """Give each head its own copy of the stream for Q, K and V (`hook_q_input` ...); off: one shared ln1."""
        if use_split_qkv_input and self.model.cfg.use_attn_in:
            raise ValueError("use_split_qkv_input and use_attn_in are mutually exclusive: call set_use_attn_in(False) first")
        self.model.cfg.use_split_qkv_input = bool(use_split_qkv_input)
        self.alias_input_hooks()

    def set_use_attn_in(self, use_attn_in: bool) -> None:
        """Give each head one copy of the stream for Q, K and V together (`hook_attn_in`)."""
        if use_attn_in and self.model.cfg.use_split_qkv_input:
            raise ValueError("use_attn_in and use_split_qkv_input are mutually exclusive: "
                             "call set_use_split_qkv_input(False) first")
        self.model.cfg.use_attn_in = bool(use_attn_in)
        self.alias_input_hooks()

    def set_use_hook_mlp_in(self, use_hook_mlp_in: bool) -> None:
        """Expose the MLP's input before ln2 as `hook_mlp_in`."""
        self.model.cfg.use_hook_mlp_in = bool(use_hook_mlp_in)
        self.alias_input_hooks()

    def points(self, names_filter: Callable, api: str, needs: Optional[Callable] = None) -> list:
        """The hook points a names filter selects, once each (an alias and its point are one), less those
        whose flag is off (`needs(name)`): they would never fire (TransformerLens skips them too, with a warning)."""
        needs = needs or self.gated_flag
        chosen, seen, skipped = [], set(), []
        for point_name, point in list(self.model.hook_dict.items()):
            if not names_filter(point_name) or id(point) in seen:
                continue
            seen.add(id(point))
            if needs(point_name) is not None:
                skipped.append(point_name)
            else:
                chosen.append(point.name or point_name)
        if skipped:
            warnings.warn(f"{api}: skipped {len(skipped)} hook point(s) the names filter matched that fire only "
                          f"with a flag on (e.g. {skipped[0]}); call model.set_use_...(True) to hook them",
                          stacklevel=3)
        return chosen
