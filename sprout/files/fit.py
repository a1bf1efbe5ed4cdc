"""Do these weights fit this model? Every key and shape a config implies, compared before any module is built.

Building the model is the costly part of refusing a bad checkpoint: a config.json asking for 20,000
layers over a few kilobytes of weights spends a minute making Python modules (even on the meta
device) before one shape is compared, and d_model 10^7 exhausts memory. So the config's sizes are
first read against the embedding's shape and the number of blocks in the weights, then one block
is built on the meta device (no memory) and its keys are repeated for every layer. The real model
is built only once everything fits.

One implementation serves every family: `sprout.files.checkpoint` checks Sprout and WalkthroughGPT
weights under our own keys, `sprout.walkthrough` checks the walkthrough script's weights through
`rename` (our key -> the walkthrough's name).
"""
from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING, Callable, Union

import torch
import torch.nn as nn

from ..names import block as block_prefix

if TYPE_CHECKING:
    from ..config import SproutConfig, WalkthroughConfig

Shapes = dict[str, tuple[int, ...]]
BLOCK = re.compile(r"^blocks\.0\.(.*)$")
SHOWN = 60  # problems listed in one error; the rest are counted
GROSS = 4  # a config size this many times the weights' is refused before even one block is built


def _same(key: str) -> str:
    return key


def fit(model_class: type[nn.Module], config: Union[SproutConfig, WalkthroughConfig], state_dict: dict,
        rename: Callable[[str], str] = _same, ignore: frozenset = frozenset()) -> tuple[dict, list[str]]:
    """Match `state_dict` to the keys and shapes of `model_class(config)` without building it.

    Args:
        model_class: Sprout or WalkthroughGPT (anything built from a dataclass config with `n_layer`
            whose blocks live in `blocks.{l}.` and whose embedding is `embed.weight` [vocab_size, d_model]).
        config: the config the weights claim.
        state_dict: the weights, under the names `rename` gives.
        rename: our state-dict key -> its name in `state_dict`.
        ignore: names in `state_dict` that are neither used nor unexpected (e.g. the walkthrough's masks).

    Returns:
        (the weights under our keys, every problem as one line). No problems means every key is
        present with its shape and nothing is left over.
    """
    problems, gross = _size_problems(config, state_dict, rename)
    if gross:  # a config far larger than the weights: say which field, build nothing
        return {}, problems
    present = layers_present(config, state_dict, rename)
    n_listed = config.n_layer
    if config.n_layer > 2 * present + 16:  # list the blocks the weights hold and one more, not 10^6
        n_listed = present + 1
        problems.append(f"config field n_layer={config.n_layer}, but the weights hold {present} block(s); "
                        f"the keys of blocks {n_listed} to {config.n_layer - 1} are not listed")
    top, block = _one_block(model_class, config)
    expected = dict(top)
    for l in range(n_listed):
        expected.update({f"{block_prefix(l)}{k}": shape for k, shape in block.items()})
    converted, used = {}, set(ignore)
    for key, shape in expected.items():
        name = rename(key)
        used.add(name)
        if name not in state_dict:
            problems.append(f"{name}: missing (expected {shape})")
        elif tuple(state_dict[name].shape) != shape:
            problems.append(f"{name}: expected {shape}, found {tuple(state_dict[name].shape)}")
        else:
            converted[key] = state_dict[name]
    problems += [f"{k}: unexpected (found {tuple(t.shape)})" for k, t in state_dict.items() if k not in used]
    return converted, problems


def _size_problems(config, state_dict: dict, rename) -> tuple[list[str], bool]:
    """The config's vocab_size and d_model against the embedding's shape; gross when far larger (the
    walkthrough builds a module per head, so even one block of a hostile config is costly)."""
    embed = state_dict.get(rename("embed.weight"))
    problems, gross = [], False
    if embed is not None and embed.dim() == 2:
        for field, found in zip(("vocab_size", "d_model"), embed.shape):
            if getattr(config, field) != found:
                problems.append(f"config field {field}={getattr(config, field)}, but {rename('embed.weight')} "
                                f"is {tuple(embed.shape)} [vocab_size, d_model]")
                gross = gross or getattr(config, field) > max(GROSS * found, 4096)
    return problems, gross


def layers_present(config: Union[SproutConfig, WalkthroughConfig], state_dict: dict, rename: Callable[[str], str] = _same) -> int:
    """How many of the config's blocks 0, 1, ... have at least one weight in `state_dict`.

    Counts up to the first block with none, from one pass over the keys, so a config asking for
    10^6 layers costs only what the weights hold.
    """
    if rename("blocks.0.") == rename("blocks.1."):  # no block prefix (the walkthrough's steps 4.2/4.4)
        return config.n_layer
    mark = "123456789"  # a layer number no real name contains, turned into a pattern
    pattern = re.compile(re.escape(rename(block_prefix(mark))).replace(mark, r"(\d+)"))
    found = {int(m.group(1)) for k in state_dict if (m := pattern.match(k))}
    n = 0
    while n < config.n_layer and n in found:
        n += 1
    return n


def _one_block(model_class, config) -> tuple[Shapes, Shapes]:
    """(keys outside the blocks, keys inside block 0) with their shapes, from a one-block model on meta."""
    one = dataclasses.replace(config, n_layer=1)
    with torch.device("meta"):
        model = model_class(one)
    top: dict[str, tuple[int, ...]] = {}
    block: dict[str, tuple[int, ...]] = {}
    for key, t in model.state_dict().items():
        m = BLOCK.match(key)
        (block if m else top)[m.group(1) if m else key] = tuple(t.shape)
    return top, block


def describe(problems: list[str], what: str) -> str:
    """One error message listing the problems (the first SHOWN of them, then a count)."""
    shown = problems[:SHOWN] + ([f"... and {len(problems) - SHOWN} more"] if len(problems) > SHOWN else [])
    return f"{what} ({len(problems)} problem(s)):\n  " + "\n  ".join(shown)
