"""Checkpoints: write a model as safetensors, read it back from whatever form it arrives in.

A checkpoint is a directory holding `config.json` ({"family": ..., **config}), `model.safetensors`
(the config again in its metadata) and, when the model has one, `tokenizer.json`. `save` writes it
atomically: a crash or a full disk leaves either the old checkpoint or the new one, never half of one;
it replaces only a folder that is provably a checkpoint (`sprout.files.folders`), never a user's folder.

`load` also reads a lone `.safetensors` file, a torch file (.pt/.pth/.bin, read with weights_only=True
and never with code), a training run directory (its latest `checkpoints/step_*`), or the name of a
demo model shipped in `sprout/demo/`. The config is compared with the weights' keys and shapes before
any module is built (`sprout.files.fit`); weights that do not fit raise one error that lists every offending
key, integer weights are refused, and nothing is loaded halfway.
"""
from __future__ import annotations

import glob
import json
import os
import re
import warnings
from pathlib import Path
from typing import Optional, TypeVar, Union

import torch
from safetensors import safe_open
from safetensors.torch import save as _safetensors_bytes
from tokenizers import Tokenizer

from ..config import SproutConfig
from ..model import Sprout
from ..tl.hooked import HookedLM
from ..walkthrough import WalkthroughConfig, WalkthroughGPT
from .fit import describe, fit
from .folders import NotOursError, write_bytes, write_folder
from .walkthrough_keys import from_walkthrough_state_dict
from .weightfiles import check_fields, config_beside, file_in, read_json, read_safetensors_file, read_torch_file, regular_file

PathLike = Union[str, os.PathLike]

CONFIG, WEIGHTS, TOKENIZER = "config.json", "model.safetensors", "tokenizer.json"
OWN_FILES = frozenset({CONFIG, WEIGHTS, TOKENIZER, "trainer.pt"})  # what a checkpoint folder may hold
FAMILIES = ("sprout", "walkthrough")
TORCH_SUFFIXES = (".pt", ".pth", ".bin")
DEFAULT_CONTEXT = 512
MAX_ROPE_BYTES = 1 << 30  # the RoPE tables a config may ask for (its context is in no weight's shape)
STEP_DIR = re.compile(r"^step_(\d+)$")
__all__ = ["NotOursError", "from_state_dict", "load", "read_json", "save"]


# --- save -----------------------------------------------------------------------------------------

def save(model: HookedLM, directory: PathLike) -> Path:
    """Write `model` as a checkpoint directory, replacing only a checkpoint already there.

    Everything goes into a temporary sibling directory first, is fsynced, and is then renamed into
    place; the previous checkpoint is deleted only once the new one is complete. An existing folder
    is replaced only when it is provably a checkpoint: it holds nothing but `config.json`,
    `model.safetensors`, `tokenizer.json` and a trainer's `trainer.pt`, and its config.json (or the
    safetensors header) carries our "family" entry. Anything else is refused (NotOursError, a
    FileExistsError and a ValueError) naming the files that would have been lost. A symlink is
    followed and kept.

    Args:
        model: a Sprout, or any model with `.config.to_dict()`, `.tokenizer` and a class attribute
            `family` (the walkthrough GPT has family "walkthrough"; the default is "sprout").
        directory: where the checkpoint goes; its parent folders are created.

    Returns:
        The checkpoint directory.
    """
    config = {"family": getattr(type(model), "family", "sprout"), **model.config.to_dict()}
    tensors, tied = _untie(model.state_dict())
    metadata = {"format": "pt", "config": json.dumps(config), "tied": json.dumps(tied)}

    def fill(tmp: Path) -> None:
        write_bytes(tmp / CONFIG, (json.dumps(config, indent=2) + "\n").encode())
        write_bytes(tmp / WEIGHTS, _safetensors_bytes(tensors, metadata=metadata))
        if getattr(model, "tokenizer", None) is not None:
            write_bytes(tmp / TOKENIZER, model.tokenizer.to_str().encode())

    return Path(write_folder(directory, fill, OWN_FILES, is_checkpoint, "a Sprout checkpoint"))


def is_checkpoint(directory: Path) -> bool:
    """Whether `directory` holds a config.json or model.safetensors that `save` wrote (a "family" entry)."""
    config = directory / CONFIG
    if config.is_file() and config.stat().st_size < 1 << 20:
        try:
            return json.loads(config.read_bytes()).get("family") in FAMILIES
        except (ValueError, RecursionError, AttributeError):
            return False
    try:
        with safe_open(str(directory / WEIGHTS), framework="pt") as f:
            return json.loads((f.metadata() or {}).get("config", "{}")).get("family") in FAMILIES
    except Exception:  # absent, unreadable or not ours: not provably a checkpoint
        return False


def _untie(state_dict: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Drop tensors that share storage with an earlier one (safetensors stores each only once)."""
    kept: dict[str, torch.Tensor] = {}
    tied: dict[str, str] = {}
    seen: dict[tuple, str] = {}
    for name, t in state_dict.items():
        key = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.dtype)
        if key in seen:
            tied[name] = seen[key]
        else:
            seen[key] = name
            kept[name] = t.detach().cpu().contiguous()  # a model trained on a GPU too
    return kept, tied


# --- load -----------------------------------------------------------------------------------------

def load(path: PathLike, map_location: Union[str, torch.device] = "cpu",
         tokenizer: Union[Tokenizer, PathLike, None] = None) -> HookedLM:
    """Load a model in eval mode from a checkpoint in any form we read.

    Args:
        path: a checkpoint directory written by `save`; a `.safetensors` file (config from a
            `config.json` beside it, else its metadata, else inferred from the shapes); a torch file
            (.pt/.pth/.bin) holding a state dict, bare or under "model"/"state_dict"/"model_state_dict"
            with the config under "config"/"cfg"/"model_args"; a training run directory (its highest
            `checkpoints/step_*`); or a demo name such as "gpt-4". A bare demo name (a str without a
            slash) always means the shipped demo, even if a folder of that name is in the working
            directory: write "./gpt-4" for the folder.
        map_location: the device the model ends up on.
        tokenizer: a `tokenizers.Tokenizer` or tokenizer.json path; overrides a `tokenizer.json`
            found beside the weights.

    Returns:
        A Sprout, or a WalkthroughGPT for the walkthrough's weights, in eval mode.

    Raises:
        FileNotFoundError: nothing at `path` and no demo of that name (the message lists the demos).
        ValueError: unreadable files, files that would need code to unpickle, non-floating weights, a
            config that does not fit the weights (checked before any module is built).
        MemoryError: a tensor does not fit in memory (the message names its size).
    """
    path = regular_file(_weights_file(_resolve(path)), "checkpoint file")
    if path.stat().st_size == 0:
        raise ValueError(f"cannot read {path}: the file is empty (0 bytes; an interrupted copy or download?)")
    if path.suffix == ".safetensors":
        state_dict, config = read_safetensors_file(path)
    elif path.suffix in TORCH_SUFFIXES:
        state_dict, config = read_torch_file(path)
    else:
        raise ValueError(f"{path}: unknown checkpoint format; expected a directory, .safetensors or one of {TORCH_SUFFIXES}")
    check_floating(state_dict, path)
    tokenizer = _tokenizer(tokenizer, path.parent)
    warn_non_finite(state_dict, path)
    beside = config_beside(path) if path.suffix == ".safetensors" else None
    source = f"{path} (config from {beside})" if beside is not None else str(path)
    model = from_state_dict(state_dict, config, tokenizer, source=source)
    return model.to(map_location).eval()


def _weights_file(path: Path) -> Path:
    """The weights to read at `path`: the file itself, or a checkpoint directory's model.safetensors."""
    if not path.is_dir():
        return path
    weights = file_in(path, WEIGHTS, WEIGHTS, must_exist=False)
    others = sorted(p.name for p in path.iterdir() if p.suffix in TORCH_SUFFIXES and p.name != "trainer.pt")
    if not os.path.lexists(weights):
        hint = f"; to read {others[0]}, pass the file itself: {path / others[0]}" if others else ""
        raise ValueError(f"{path} is not a checkpoint: no {WEIGHTS} in it and no checkpoints/step_* folders{hint}")
    if others:
        warnings.warn(f"{path} holds {WEIGHTS} and also {', '.join(others)}: reading {WEIGHTS} only (pass "
                      f"{path / others[0]} to read that instead)", stacklevel=3)
    return weights


def _tokenizer(tokenizer, folder: Path) -> Optional[Tokenizer]:
    """The tokenizer given, or the tokenizer.json beside the weights; anything but a file there is an error."""
    beside = folder / TOKENIZER
    if tokenizer is None and os.path.lexists(beside):
        try:
            tokenizer = file_in(folder, TOKENIZER, "tokenizer.json")
        except (OSError, ValueError) as e:
            raise ValueError(f"{e}; expected the model's tokenizer.json: move it away or pass tokenizer=") from None
    elif isinstance(tokenizer, (str, os.PathLike)):
        tokenizer = regular_file(tokenizer, "tokenizer file")
    tokenizer = getattr(tokenizer, "backend_tokenizer", tokenizer)  # a model's HF tokenizer: the one inside
    if tokenizer is None or isinstance(tokenizer, Tokenizer):
        return tokenizer
    try:
        return Tokenizer.from_file(str(tokenizer))
    except Exception as e:  # tokenizers raises a bare Exception for bad JSON
        raise ValueError(f"cannot read the tokenizer {tokenizer}: {e}") from e


def _resolve(given: PathLike) -> Path:
    """A path that exists, a run directory's latest checkpoint, or a demo model's directory."""
    name = os.fspath(given)
    if isinstance(given, str) and name in demo_names():  # a bare demo name means the demo
        if os.path.lexists(name):
            warnings.warn(f"{name!r} is a demo name, so load({name!r}) reads the shipped demo, not ./{name} "
                          f"in the working directory; pass './{name}' to read that", stacklevel=3)
        return demo_dir() / name
    path = Path(given)
    if path.is_dir() and (path / "checkpoints").is_dir():
        latest = latest_checkpoint(path)
        if latest is None:
            raise ValueError(f"{path} is a run directory but {path / 'checkpoints'} holds no complete step_* checkpoint")
        return latest
    if path.exists():
        return path
    left = sorted(path.parent.glob(f".{glob.escape(path.name)}.old-*/{WEIGHTS}")) if path.name else []
    if left:
        raise FileNotFoundError(f"no checkpoint at {path}, but a save that was killed half way left the previous "
                                f"one at {left[0].parent}: move it back (mv '{left[0].parent}' '{path}')")
    if os.sep not in name and "/" not in name and (demo_dir() / name / WEIGHTS).is_file():
        return demo_dir() / name
    demos = demo_names()
    shipped = ", ".join(demos) if demos else f"none are shipped yet ({demo_dir()} is empty)"
    raise FileNotFoundError(f"no checkpoint file or directory at {name!r}, and no demo model of that name; "
                            f"demo models: {shipped}")


def demo_dir() -> Path:
    """Where the shipped demo models live: `<package dir of sprout>/demo/<name>/`."""
    return Path(__file__).resolve().parent.parent / "demo"


def demo_names() -> list[str]:
    """The names `load` accepts as demo models (directories in `demo_dir()` holding a checkpoint)."""
    root = demo_dir()
    return sorted(d.name for d in root.iterdir() if (d / WEIGHTS).is_file()) if root.is_dir() else []


def latest_checkpoint(run_dir: PathLike) -> Optional[Path]:
    """The highest-step complete checkpoint `run_dir/checkpoints/step_XXXXXXXX/`, or None if none."""
    steps = []
    root = Path(run_dir) / "checkpoints"
    if root.is_dir():
        for d in root.iterdir():
            m = STEP_DIR.match(d.name)
            if m and d.is_dir() and (d / WEIGHTS).is_file():
                steps.append((int(m.group(1)), d))
    return max(steps)[1] if steps else None


def check_floating(state_dict: dict[str, torch.Tensor], source: PathLike) -> None:
    """Refuse integer or bool weights: casting them into a float model would silently change them.

    The walkthrough's `mask` buffers are compared by value (nonzero = attend), so they may be integers.
    """
    bad = [f"{k} ({t.dtype})" for k, t in state_dict.items() if not t.is_floating_point() and not k.endswith(".mask")]
    if bad:
        shown = ", ".join(bad[:20]) + (f" and {len(bad) - 20} more" if len(bad) > 20 else "")
        raise ValueError(f"{source}: {len(bad)} weight(s) are not floating point: {shown}; a model's weights are "
                         "float32/bfloat16/float16 (quantized checkpoints are not supported)")


def warn_non_finite(state_dict: dict[str, torch.Tensor], source: PathLike) -> None:
    """Warn, naming the tensors, when any floating tensor holds NaN or inf (loaded as it is, but say so)."""
    bad = [n for n, t in state_dict.items() if t.is_floating_point() and not torch.isfinite(t).all()]
    if bad:
        warnings.warn(f"{source}: non-finite (NaN or inf) values in {len(bad)} tensor(s): {', '.join(bad)}",
                      stacklevel=3)


# --- state dict -> model --------------------------------------------------------------------------

def from_state_dict(state_dict: dict[str, torch.Tensor], config: Union[SproutConfig, dict, None] = None,
                    tokenizer: Optional[Tokenizer] = None, source: str = "state dict") -> HookedLM:
    """Build the model these weights belong to and load them (strict: every key, every shape).

    The config is compared with the weights' keys and shapes before any module is built
    (`sprout.files.fit`), so a config.json asking for a huge model over small weights is refused at once.

    Args:
        state_dict: the weights, with model.py's keys; or the walkthrough GPT's, under its own names
            (`token_embedding_table.weight`, ...) or WalkthroughGPT's (`embed.weight`, `pos_embed.weight`).
        config: a SproutConfig or WalkthroughConfig, or its dict (a "family" entry picks the model
            family); None infers it from the shapes, for Sprout assuming a context of 512 tokens.
        tokenizer: attached to the model as `model.tokenizer`.
        source: named in error messages (e.g. the file the weights came from).

    Returns:
        The model, on the CPU, in the dtype of the weights.
    """
    family = None
    if isinstance(config, dict):
        config = dict(config)
        family = config.pop("family", None)
    elif config is not None:
        family = "walkthrough" if type(config).__name__ == "WalkthroughConfig" else "sprout"
    if family is None:
        family = "walkthrough" if "token_embedding_table.weight" in state_dict else "sprout"
    if family == "walkthrough":
        return _from_walkthrough(state_dict, config, tokenizer, source)
    if family != "sprout":
        raise ValueError(f"{source}: unknown model family {family!r}; expected one of {list(FAMILIES)}")
    if config is None:
        config = infer_config(state_dict, source)
    elif isinstance(config, dict):
        config = _parse(SproutConfig, config, source)
    _check_context(config, source)
    if tokenizer is not None and tokenizer.get_vocab_size() > config.vocab_size:
        raise ValueError(f"{source}: the tokenizer has {tokenizer.get_vocab_size()} tokens but the model's "
                         f"vocabulary has only {config.vocab_size}")
    state_dict = dict(state_dict)
    if "head.weight" not in state_dict and "embed.weight" in state_dict:
        state_dict["head.weight"] = state_dict["embed.weight"]  # tied: stored once
    return _build(Sprout, config, state_dict, tokenizer, source)


def _check_context(config: SproutConfig, source: str) -> None:
    # The context is in no weight's shape, yet it sizes the RoPE tables: bound them.
    table_bytes = config.context * config.d_head * 4  # cos and sin, [context, d_head / 2] float32 each
    if table_bytes > MAX_ROPE_BYTES:
        raise ValueError(f"{source}: config field context={config.context} would need {table_bytes / 2**30:.1f} GiB "
                         f"of RoPE tables (more than {MAX_ROPE_BYTES / 2**30:.0f} GiB); lower context in the config")


def _from_walkthrough(state_dict, config, tokenizer, source: str) -> HookedLM:
    if isinstance(config, dict):
        config = _parse(WalkthroughConfig, config, source)
    if "token_embedding_table.weight" in state_dict:  # saved from the walkthrough's own classes
        try:
            return from_walkthrough_state_dict(state_dict, config=config, tokenizer=tokenizer)
        except ValueError as e:
            raise ValueError(f"{source}: {e}") from e
    if config is None:
        raise ValueError(f"{source}: WalkthroughGPT weights without a config; pass a WalkthroughConfig")
    return _build(WalkthroughGPT, config, state_dict, tokenizer, source)


_Config = TypeVar("_Config", SproutConfig, WalkthroughConfig)


def _parse(config_class: type[_Config], config: dict, source: str) -> _Config:
    ints = {k: v for k, v in config.items() if type(v) is int}  # the dataclass checks types; bound the sizes
    check_fields(ints, dict.fromkeys(ints, "int"), f"{source}: config")
    try:
        return config_class.from_dict(config)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{source}: bad config: {e}") from e


def _build(model_class, config, state_dict: dict[str, torch.Tensor], tokenizer, source: str) -> HookedLM:
    """Check every key and shape against the config, and only then build and load (nothing half-loaded)."""
    converted, problems = fit(model_class, config, state_dict)
    if not problems and model_class is Sprout and not torch.equal(state_dict["embed.weight"], state_dict["head.weight"]):
        problems.append("head.weight: differs from embed.weight, but Sprout ties them (they must be equal)")
    if problems:
        raise ValueError(describe(problems, f"{source}: the weights do not fit a {model_class.__name__} with config {config}"))
    model = model_class(config, tokenizer=tokenizer)
    dtype = next((t.dtype for t in state_dict.values() if t.is_floating_point()), None)
    if dtype is not None:
        model.to(dtype)
    model.load_state_dict(state_dict, strict=True)
    return model


def infer_config(state_dict: dict[str, torch.Tensor], source: str = "state dict") -> SproutConfig:
    """A SproutConfig read off the weights' shapes; the context (not in any shape) is assumed 512."""
    need = ["embed.weight", "blocks.0.ffn.w1.weight", "blocks.0.attn.q_norm.weight"]
    missing = [k for k in need if k not in state_dict]
    if missing:
        raise ValueError(f"{source}: no config given and cannot infer one: missing {missing} "
                         f"(found keys {sorted(state_dict)[:10]}...)")
    vocab_size, d_model = state_dict["embed.weight"].shape
    d_head = state_dict["blocks.0.attn.q_norm.weight"].numel()
    if d_model % d_head:
        raise ValueError(f"{source}: d_model {d_model} is not a multiple of d_head {d_head} "
                         "(the length of blocks.0.attn.q_norm.weight)")
    layers = {int(m.group(1)) for k in state_dict if (m := re.match(r"blocks\.(\d+)\.", k))}
    warnings.warn(f"{source}: no config stored with the weights; inferred it from their shapes, assuming a "
                  f"context of {DEFAULT_CONTEXT} tokens (and RoPE base 10000), which no shape records",
                  stacklevel=3)
    return SproutConfig(vocab_size=vocab_size, context=DEFAULT_CONTEXT, n_layer=max(layers) + 1,
                        n_head=d_model // d_head, d_model=d_model,
                        d_ff=state_dict["blocks.0.ffn.w1.weight"].shape[0])
