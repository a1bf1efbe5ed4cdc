"""The walkthrough's own state-dict keys: convert to and from them, infer a config from them.

The walkthrough script names its tensors `token_embedding_table`, `multi_head_attention.heads.{h}.query`
and so on, and stores a causal `mask` buffer per head; `WalkthroughGPT` keeps TransformerLens-style
module names. This module maps between the two, so weights saved from the walkthrough's own classes load
unchanged, and checks them with the same fit check as every other checkpoint (sprout/files/fit.py).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Optional, Union

import torch
from tokenizers import Tokenizer

from ..tokenizer import char_tokenizer
from ..walkthrough import WalkthroughConfig, WalkthroughGPT
from .fit import describe, fit
from .weightfiles import regular_file

# Our top-level modules and the walkthrough's names for them; inside a block, `attn` is its
# `multi_head_attention` and `mlp` its `feed_forward` (ln1, ln2, heads.{h}.query ... are the same).
_TOP = {"embed.": "token_embedding_table.", "pos_embed.": "position_embedding_table.",
        "ln_final.": "final_layer_norm.", "unembed.": "LM_head."}
_IN_BLOCK = {"attn.": "multi_head_attention.", "mlp.": "feed_forward."}


def walkthrough_name(key: str, cfg: WalkthroughConfig) -> str:
    """Our state-dict key -> the walkthrough's (`blocks.0.attn.projection.weight` ->
    `transformer_blocks.0.multi_head_attention.projection.weight`, or without the block prefix at 4.2/4.4)."""
    for ours, theirs in _TOP.items():
        if key.startswith(ours):
            return theirs + key[len(ours):]
    _, layer, rest = key.split(".", 2)  # blocks.{l}.rest
    for ours, theirs in _IN_BLOCK.items():
        if rest.startswith(ours):
            rest = theirs + rest[len(ours):]
    return f"transformer_blocks.{layer}.{rest}" if cfg.blocks else rest


def _mask_names(cfg: WalkthroughConfig) -> list[str]:
    prefix = [f"transformer_blocks.{l}." if cfg.blocks else "" for l in range(cfg.n_layer)]
    return [f"{p}multi_head_attention.heads.{h}.mask" for p in prefix for h in range(cfg.n_head)]


def to_walkthrough_state_dict(model: WalkthroughGPT) -> dict[str, torch.Tensor]:
    """Our weights under the walkthrough's keys, with its lower-triangular `mask` buffers, so its own
    classes (built with the same sizes) load them with strict=True."""
    cfg = model.config
    sd = {walkthrough_name(k, cfg): v.detach().clone() for k, v in model.state_dict().items()}
    mask = torch.ones(cfg.context, cfg.context, device=model.embed.weight.device).tril()
    sd.update({name: mask.clone() for name in _mask_names(cfg)})
    return sd


def _shape(sd: dict, key: str) -> tuple:
    if key not in sd:
        raise ValueError(f"walkthrough state dict has no {key!r}; found keys starting with "
                         f"{sorted({k.split('.')[0] for k in sd})}")
    return tuple(sd[key].shape)


def infer_config(state_dict: dict[str, torch.Tensor]) -> WalkthroughConfig:
    """The step a walkthrough state dict belongs to, read from its keys and shapes.

    Residual connections leave no trace in the weights (steps 4.6 and 4.7 have the same keys), so
    blocks are taken to have them; pass a config (`step_config("4.6")`) for a 4.6 checkpoint. Dropout
    is not stored either and is set to 0.
    """
    vocab, C = _shape(state_dict, "token_embedding_table.weight")
    context, C_pos = _shape(state_dict, "position_embedding_table.weight")
    if C_pos != C:
        raise ValueError(f"position_embedding_table.weight has width {C_pos} but token_embedding_table.weight "
                         f"has {C}")
    layers = {int(m.group(1)) for k in state_dict if (m := re.match(r"transformer_blocks\.(\d+)\.", k))}
    blocks = bool(layers)
    first = "transformer_blocks.0." if blocks else ""
    if not any(k.startswith(first + "multi_head_attention.heads.") for k in state_dict):
        raise ValueError(f"no attention heads in this state dict (expected keys like "
                         f"{first}multi_head_attention.heads.0.query.weight): only phase 4's models "
                         "(multi-head attention, steps 4.2 to the final script) can be loaded")
    heads = {int(m.group(1)) for k in state_dict
             if (m := re.match(re.escape(first) + r"multi_head_attention\.heads\.(\d+)\.", k))}
    d_head = _shape(state_dict, first + "multi_head_attention.heads.0.query.weight")[0]
    if d_head * len(heads) != C:
        raise ValueError(f"{len(heads)} heads of size {d_head} do not fill C = {C}: only models whose "
                         "heads split the embedding exactly are supported")
    return WalkthroughConfig(
        vocab_size=vocab, context=context, d_model=C, n_head=len(heads), n_layer=max(layers) + 1 if blocks else 1,
        dropout=0.0, blocks=blocks, feed_forward=first + "feed_forward.fc1.weight" in state_dict,
        residual=blocks, layer_norm=first + "ln1.weight" in state_dict,
        final_layer_norm="final_layer_norm.weight" in state_dict,
        extra_projections=first + "attention_projection.weight" in state_dict,
    )


def _mask_problems(state_dict: dict, masks: frozenset, cfg: WalkthroughConfig) -> list[str]:
    """Each `mask` buffer must be one this step has and the causal lower triangle."""
    known = set(_mask_names(cfg))
    problems = [f"{k}: unexpected (found {tuple(state_dict[k].shape)})" for k in sorted(masks - known)]
    causal = torch.ones(cfg.context, cfg.context).tril()
    for name in sorted(masks & known):
        mask = state_dict[name].detach().cpu()
        if tuple(mask.shape) != (cfg.context, cfg.context):
            problems.append(f"{name}: expected (block_size, block_size) = ({cfg.context}, {cfg.context}), "
                            f"found {tuple(mask.shape)}")
        elif not torch.equal((mask != 0).float(), causal):
            problems.append(f"{name}: not the causal lower-triangular mask this model assumes")
    return problems


def from_walkthrough_state_dict(state_dict: Union[dict, str, Path], config: Optional[WalkthroughConfig] = None,
                                tokenizer: Optional[Tokenizer] = None, text: Optional[str] = None) -> WalkthroughGPT:
    """Load weights saved from the walkthrough's own classes (`model.state_dict()` of its script).

    Args:
        state_dict: the walkthrough's state dict, a checkpoint dict holding it under "model_state_dict"
            (as its train_gpt.py saves), or the path of a torch file with either (read weights_only).
        config: the step; inferred from the keys and shapes when None (see `infer_config`).
        tokenizer: the character tokenizer the model was trained with, or
        text: its training text, from which `sprout.tokenizer.char_tokenizer` rebuilds the vocabulary.

    Returns:
        A WalkthroughGPT in eval mode with exactly those weights. Every weight must be present with
        its shape, each `mask` buffer must be the causal lower triangle, and no key may be left over.
    """
    if isinstance(state_dict, (str, Path)):
        state_dict = torch.load(regular_file(state_dict, "weights file"), map_location="cpu", weights_only=True)
    if isinstance(state_dict, dict) and "model_state_dict" in state_dict:
        state_dict = state_dict["model_state_dict"]
    if not isinstance(state_dict, dict):
        raise TypeError(f"a walkthrough state dict is a dict of tensors, not {type(state_dict).__name__}")
    if text is not None:
        if tokenizer is not None:
            raise ValueError("pass a tokenizer or the training text, not both")
        tokenizer = char_tokenizer(text)
    cfg = config if config is not None else infer_config(state_dict)
    if tokenizer is not None and tokenizer.get_vocab_size() != cfg.vocab_size:
        raise ValueError(f"the tokenizer has {tokenizer.get_vocab_size()} characters but the weights are for "
                         f"{cfg.vocab_size} (token_embedding_table.weight {_shape(state_dict, 'token_embedding_table.weight')})")
    masks = frozenset(k for k in state_dict if k.endswith(".mask"))  # buffers: checked once the sizes fit
    converted, problems = fit(WalkthroughGPT, cfg, state_dict, rename=lambda k: walkthrough_name(k, cfg), ignore=masks)
    if not problems:
        problems = _mask_problems(state_dict, masks, cfg)
    if problems:
        raise ValueError(describe(problems, f"this walkthrough state dict does not fit {cfg}"))
    model = WalkthroughGPT(cfg, tokenizer=tokenizer)
    model.load_state_dict(converted, strict=True)
    return model.eval()
