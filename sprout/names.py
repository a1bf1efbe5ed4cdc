"""Hook names: every activation's name is written here and nowhere else.

`act_name` follows TransformerLens' `get_act_name` for the hooks a Sprout or walkthrough GPT has
(`act_name("resid_post", 3) == "blocks.3.hook_resid_post"`, `act_name("pattern", 1) ==
"blocks.1.attn.hook_pattern"`, `act_name("normalized", 2, "ln2") == "blocks.2.ln2.hook_normalized"`), but
refuses a name it does not know instead of guessing, so a typo is an error, not a hook that never fires.
"""
from __future__ import annotations

import re
from typing import Optional

# Where each activation lives: the block itself, its attention, its MLP, or a norm (ln1, ln2, ln_final).
BLOCK = ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out", "attn_in", "mlp_in",
         "q_input", "k_input", "v_input")
ATTN = ("q", "k", "v", "z", "result", "pattern", "attn_scores", "rot_q", "rot_k", "q_normed", "k_normed")
MLP = ("pre", "post", "pre_linear")
NORM = ("normalized", "scale")
TOP = ("embed", "pos_embed")
NORMS = ("ln1", "ln2")

_ALIASES = {"attn": "pattern", "attn_logits": "attn_scores", "key": "k", "query": "q", "value": "v",
            "mlp_pre": "pre", "mlp_post": "post"}
_LAYER = re.compile(r"^blocks\.(\d+)\.")


def act_name(name: str, layer: Optional[int] = None, layer_type: Optional[str] = None) -> str:
    """The hook name of activation `name` at block `layer` (`layer_type`: "ln1" / "ln2" for a block's
    norms, "ln_final" for the last one). A full hook name is returned as it is."""
    if ("." in name or name.startswith("hook_")) and layer is None and layer_type is None:
        return name
    name = _ALIASES.get(name, name)
    if name in TOP:
        _no_layer(name, layer)
        return f"hook_{name}"
    if name in NORM and layer_type == "ln_final":
        _no_layer(name, layer)
        return f"ln_final.hook_{name}"
    where = _where(name, layer_type)
    if layer is None or isinstance(layer, bool) or not isinstance(layer, int) or layer < 0:
        raise ValueError(f"hook {name!r} is in every block: give its block as a whole number >= 0, got "
                         f"layer={layer!r}")
    return f"{block(layer)}{where}hook_{name}"


def block(layer: int | str) -> str:
    """The prefix of block `layer`'s hooks and state-dict keys: "blocks.3."."""
    return f"blocks.{layer}."


def head_label(layer: float, head: Optional[int] = None) -> str:
    """A head's label, "L3H1" (parsed back by `interp`'s component specs); with no head, the layer's, "L3"
    (a lens' half layer, the stream after block 2's attention, is "L2.5")."""
    return f"L{layer:g}" if head is None else f"L{int(layer)}H{head}"


def layer_of(hook: str) -> Optional[int]:
    """The block a hook name belongs to ("blocks.3.attn.hook_z" -> 3), None for hooks outside blocks."""
    m = _LAYER.match(hook)
    return int(m.group(1)) if m else None


def _where(name: str, layer_type: Optional[str]) -> str:
    if name in NORM:
        if layer_type not in NORMS:
            raise ValueError(f"hook {name!r} belongs to a norm: layer_type must be one of {NORMS + ('ln_final',)}, "
                             f"got {layer_type!r}")
        return f"{layer_type}."
    if layer_type not in (None, "attn", "mlp", "a", "m"):
        raise ValueError(f"layer_type {layer_type!r} does not apply to hook {name!r}")
    if name in ATTN:
        return "attn."
    if name in MLP:
        return "mlp."
    if name in BLOCK:
        return ""
    known = sorted(BLOCK + ATTN + MLP + NORM + TOP)
    raise ValueError(f"unknown activation {name!r}; known: {', '.join(known)}")


def _no_layer(name: str, layer: Optional[int]) -> None:
    if layer is not None:
        raise ValueError(f"hook {name!r} is outside the blocks: give no layer, got layer={layer!r}")
