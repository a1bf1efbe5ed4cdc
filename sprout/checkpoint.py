"""Checkpoints: write a model as safetensors, read it back from whatever form it arrives in.

A checkpoint is a directory holding `config.json` ({"family": ..., **config}), `model.safetensors`
(the config again in its metadata) and, when the model has one, `tokenizer.json`. `save` writes it
atomically: a crash or a full disk leaves either the old checkpoint or the new one, never half of one.

`load` also reads a lone `.safetensors` file, a torch file (.pt/.pth/.bin, read with weights_only=True
and never with code), a training run directory (its latest `checkpoints/step_*`), or the name of a
demo model shipped in `sprout/demo/`. Weights that do not fit the model raise one error that lists
every offending key; nothing is loaded halfway.
"""
from __future__ import annotations

import glob
import json
import os
import pickle
import re
import shutil
import tempfile
import uuid
import warnings
from pathlib import Path
from typing import Optional, Union

import torch
from safetensors import safe_open
from safetensors.torch import load_file as _read_safetensors
from safetensors.torch import save as _safetensors_bytes
from tokenizers import Tokenizer

from .config import SproutConfig
from .model import Sprout

PathLike = Union[str, os.PathLike]

CONFIG, WEIGHTS, TOKENIZER = "config.json", "model.safetensors", "tokenizer.json"
TORCH_SUFFIXES = (".pt", ".pth", ".bin")
WEIGHT_KEYS = ("model", "state_dict", "model_state_dict")  # where trainers nest the weights
CONFIG_KEYS = ("config", "cfg", "model_args")
WRAPPER_PREFIXES = ("_orig_mod.", "module.")  # torch.compile, DistributedDataParallel
DEFAULT_CONTEXT = 512
STEP_DIR = re.compile(r"^step_(\d+)$")


# --- save -----------------------------------------------------------------------------------------

def save(model: torch.nn.Module, directory: PathLike) -> Path:
    """Write `model` as a checkpoint directory, replacing any checkpoint already there.

    Everything goes into a temporary sibling directory first, is fsynced, and is then renamed into
    place; the previous checkpoint is deleted only once the new one is complete. Files in an old
    checkpoint directory that `save` does not write (e.g. a trainer's `trainer.pt`) go with it.

    Args:
        model: a Sprout, or any model with `.config.to_dict()`, `.tokenizer` and a class attribute
            `family` (the walkthrough GPT has family "walkthrough"; the default is "sprout").
        directory: where the checkpoint goes; its parent folders are created.

    Returns:
        The checkpoint directory.
    """
    directory = Path(directory)
    if directory.exists() and not _replaceable(directory):
        raise ValueError(f"refusing to replace {directory}: it exists and is not a checkpoint "
                         f"(no {CONFIG} or {WEIGHTS} in it)")
    config = {"family": getattr(type(model), "family", "sprout"), **model.config.to_dict()}
    tensors, tied = _untie(model.state_dict())
    metadata = {"format": "pt", "config": json.dumps(config), "tied": json.dumps(tied)}

    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.tmp-", dir=directory.parent))
    old = None
    try:
        _write(tmp / CONFIG, (json.dumps(config, indent=2) + "\n").encode())
        _write(tmp / WEIGHTS, _safetensors_bytes(tensors, metadata=metadata))
        if getattr(model, "tokenizer", None) is not None:
            _write(tmp / TOKENIZER, model.tokenizer.to_str().encode())
        _fsync_dir(tmp)
        if directory.exists():
            old = directory.with_name(f".{directory.name}.old-{uuid.uuid4().hex[:8]}")
            os.rename(directory, old)
        os.rename(tmp, directory)
        _fsync_dir(directory.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not directory.exists():
            os.rename(old, directory)  # put the previous checkpoint back
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    # what a save killed half way (SIGKILL, power loss) left behind for this same directory
    for kind in ("tmp", "old"):
        for stale in directory.parent.glob(f".{glob.escape(directory.name)}.{kind}-*"):
            shutil.rmtree(stale, ignore_errors=True)
    return directory


def _replaceable(directory: Path) -> bool:
    # Never delete a folder that is not a checkpoint (think save(model, "~")).
    return directory.is_dir() and ((directory / CONFIG).exists() or (directory / WEIGHTS).exists()
                                   or not any(directory.iterdir()))


def _untie(state_dict: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Drop tensors that share storage with an earlier one (safetensors stores each only once)."""
    kept, tied, seen = {}, {}, {}
    for name, t in state_dict.items():
        key = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.dtype)
        if key in seen:
            tied[name] = seen[key]
        else:
            seen[key] = name
            kept[name] = t.detach().contiguous()
    return kept, tied


def _write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --- load -----------------------------------------------------------------------------------------

def load(path: PathLike, map_location: Union[str, torch.device] = "cpu",
         tokenizer: Union[Tokenizer, PathLike, None] = None) -> torch.nn.Module:
    """Load a model in eval mode from a checkpoint in any form we read.

    Args:
        path: a checkpoint directory written by `save`; a `.safetensors` file (config from a
            `config.json` beside it, else its metadata, else inferred from the shapes); a torch file
            (.pt/.pth/.bin) holding a state dict, bare or under "model"/"state_dict"/"model_state_dict"
            with the config under "config"/"cfg"/"model_args"; a training run directory (its highest
            `checkpoints/step_*`); or a demo name such as "gpt-4".
        map_location: the device the model ends up on.
        tokenizer: a `tokenizers.Tokenizer` or tokenizer.json path; overrides a `tokenizer.json`
            found beside the weights.

    Returns:
        A Sprout, or a WalkthroughGPT for the walkthrough's weights, in eval mode.

    Raises:
        FileNotFoundError: nothing at `path` and no demo of that name (the message lists the demos).
        ValueError: unreadable files, files that would need code to unpickle, weights that do not fit.
    """
    path = _resolve(Path(path))
    if path.is_dir():
        weights = path / WEIGHTS
        if not weights.is_file():
            raise ValueError(f"{path} is not a checkpoint: no {WEIGHTS} in it and no checkpoints/step_* folders")
        path = weights
    if path.is_file() and path.stat().st_size == 0:
        raise ValueError(f"cannot read {path}: the file is empty (0 bytes; an interrupted copy or download?)")
    if path.suffix == ".safetensors":
        state_dict, config = _read_safetensors_file(path)
    elif path.suffix in TORCH_SUFFIXES:
        state_dict, config = _read_torch_file(path)
    else:
        raise ValueError(f"{path}: unknown checkpoint format; expected a directory, .safetensors or one of {TORCH_SUFFIXES}")
    if tokenizer is None and (path.parent / TOKENIZER).is_file():
        tokenizer = path.parent / TOKENIZER
    tokenizer = getattr(tokenizer, "backend_tokenizer", tokenizer)  # a model's HF tokenizer: the one inside
    if tokenizer is not None and not isinstance(tokenizer, Tokenizer):
        try:
            tokenizer = Tokenizer.from_file(str(tokenizer))
        except Exception as e:  # tokenizers raises a bare Exception for bad JSON
            raise ValueError(f"cannot read the tokenizer {tokenizer}: {e}") from e
    _warn_non_finite(state_dict, path)
    model = from_state_dict(state_dict, config, tokenizer, source=str(path))
    return model.to(map_location).eval()


def _resolve(path: Path) -> Path:
    """A path that exists, a run directory's latest checkpoint, or a demo model's directory."""
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
    name = str(path)
    if os.sep not in name and "/" not in name:
        demo = demo_dir() / name
        if (demo / WEIGHTS).is_file():
            return demo
    demos = demo_names()
    shipped = ", ".join(demos) if demos else f"none are shipped yet ({demo_dir()} is empty)"
    raise FileNotFoundError(f"no checkpoint file or directory at {name!r}, and no demo model of that name; "
                            f"demo models: {shipped}")


def demo_dir() -> Path:
    """Where the shipped demo models live: `<package dir of sprout>/demo/<name>/`."""
    return Path(__file__).resolve().parent / "demo"


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


def _read_safetensors_file(path: Path) -> tuple[dict, Optional[dict]]:
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
        state_dict = _read_safetensors(str(path), device="cpu")
    except Exception as e:  # safetensors raises its own error type (and OSError) for bad files
        raise ValueError(f"cannot read {path}: not a valid safetensors file (truncated or corrupt?): {e}") from e
    for name, target in _json(metadata.get("tied", "{}"), f"{path}'s metadata").items():
        if target in state_dict:
            state_dict.setdefault(name, state_dict[target])
    beside = path.parent / CONFIG
    if beside.is_file():
        config = _json(beside.read_bytes(), beside)
        if "config" in metadata:
            stored = _json(metadata["config"], f"{path}'s metadata")
            differ = sorted(k for k in set(config) | set(stored) if config.get(k) != stored.get(k))
            if differ:  # an edited config.json: it wins, but say so (context and rope_base fit any weights)
                warnings.warn(f"{beside} disagrees with the config saved inside {path.name} on "
                              + ", ".join(f"{k} ({config.get(k)!r} vs {stored.get(k)!r})" for k in differ)
                              + f"; using {beside.name}", stacklevel=3)
        return state_dict, config
    if "config" in metadata:
        return state_dict, _json(metadata["config"], f"{path}'s metadata")
    return state_dict, None


def _json(text, where) -> dict:
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read {where}: not valid JSON ({e})") from e
    if not isinstance(value, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(value).__name__}")
    return value


def _read_torch_file(path: Path) -> tuple[dict, Optional[dict]]:
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        reason = _weights_only_reason(str(e))
        # "Unsupported operand" is a byte the reader cannot parse (garbage); anything else it refuses
        # (a global, a class, a call) is code the file wants run.
        if (isinstance(e, pickle.UnpicklingError) and "Weights only load failed" in str(e)
                and not reason.startswith("Unsupported operand")):
            raise ValueError(
                f"refusing to load {path}: it holds more than tensors and plain data, so it would need to "
                f"run code to load, and we never do that (the weights-only reader stopped at: {reason}). "
                "If you trust it, load it yourself and save its state_dict() (or use sprout.save)."
            ) from None
        with open(path, "rb") as f:
            head = f.read(2)
        if reason.startswith("Unsupported operand") and head[:1] == b"\x80" and head[1:] >= b"\x04":
            raise ValueError(f"cannot read {path}: it is a plain pickle (protocol {head[1]}), not a torch.save "
                             "file; we read torch files only with the weights-only reader and never unpickle "
                             "with code. If you trust it, unpickle it yourself and torch.save its tensors.") from None
        if isinstance(e, EOFError):
            detail = "the file ends early"
        elif "Weights only load failed" in str(e):
            detail = reason
        else:
            detail = str(e).split(". This is an internal miniz error")[0]
        raise ValueError(f"cannot read {path}: not a valid torch file (truncated or corrupt?): "
                         f"{type(e).__name__}: {detail}") from e
    if not isinstance(obj, dict):
        raise ValueError(f"{path} holds a {type(obj).__name__}, not a state dict or a dict of them")
    config = None
    if not all(isinstance(v, torch.Tensor) for v in obj.values()):
        weights = [k for k in WEIGHT_KEYS if isinstance(obj.get(k), dict)]
        if not weights:
            raise ValueError(f"{path} is neither a state dict nor a dict with the weights under one of "
                             f"{list(WEIGHT_KEYS)}; its keys are {sorted(map(str, obj))[:20]}")
        configs = [k for k in CONFIG_KEYS if k in obj]
        if configs:
            config = obj[configs[0]]
            if not isinstance(config, dict):
                raise ValueError(f"{path}: the config under {configs[0]!r} is a {type(config).__name__}, expected a dict")
        obj = obj[weights[0]]
    state_dict = {}
    for name, t in obj.items():
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{path}: entry {name!r} of the state dict is a {type(t).__name__}, not a tensor")
        while name.startswith(WRAPPER_PREFIXES):
            name = name.split(".", 1)[1]
        state_dict[name] = t
    return state_dict, config


def _weights_only_reason(message: str) -> str:
    """What torch's weights-only reader stopped at, without its advice to allowlist or to trust."""
    text = message.split("Check the documentation")[0]
    if "WeightsUnpickler error:" in text:
        text = text.split("WeightsUnpickler error:")[-1]
    else:  # newer messages give the reason as the last paragraph
        text = ([p for p in text.split("\n\n") if p.strip()] or [text])[-1]
    return text.split(". Please")[0].strip().rstrip(".")


def _warn_non_finite(state_dict: dict[str, torch.Tensor], source) -> None:
    bad = [n for n, t in state_dict.items() if t.is_floating_point() and not torch.isfinite(t).all()]
    if bad:
        warnings.warn(f"{source}: non-finite (NaN or inf) values in {len(bad)} tensor(s): {', '.join(bad)}",
                      stacklevel=3)


# --- state dict -> model --------------------------------------------------------------------------

def from_state_dict(state_dict: dict[str, torch.Tensor], config: Union[SproutConfig, dict, None] = None,
                    tokenizer: Optional[Tokenizer] = None, source: str = "state dict") -> torch.nn.Module:
    """Build the model these weights belong to and load them (strict: every key, every shape).

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
        raise ValueError(f"{source}: unknown model family {family!r}; expected 'sprout' or 'walkthrough'")
    if config is None:
        config = infer_config(state_dict, source)
    elif isinstance(config, dict):
        config = _parse(SproutConfig, config, source)
    if tokenizer is not None and tokenizer.get_vocab_size() > config.vocab_size:
        raise ValueError(f"{source}: the tokenizer has {tokenizer.get_vocab_size()} tokens but the model's "
                         f"vocabulary has only {config.vocab_size}")
    state_dict = dict(state_dict)
    if "head.weight" not in state_dict and "embed.weight" in state_dict:
        state_dict["head.weight"] = state_dict["embed.weight"]  # tied: stored once
    return _build(Sprout, config, state_dict, tokenizer, source)


def _from_walkthrough(state_dict, config, tokenizer, source: str) -> torch.nn.Module:
    try:
        from . import walkthrough
    except ImportError as e:
        raise ValueError(f"{source} holds the walkthrough GPT's weights, but sprout.walkthrough cannot "
                         f"load them: {e}") from e
    if isinstance(config, dict):
        config = _parse(walkthrough.WalkthroughConfig, config, source)
    if "token_embedding_table.weight" in state_dict:  # saved from the walkthrough's own classes
        try:
            return walkthrough.from_walkthrough_state_dict(state_dict, config=config, tokenizer=tokenizer)
        except ValueError as e:
            raise ValueError(f"{source}: {e}") from e
    if config is None:
        raise ValueError(f"{source}: WalkthroughGPT weights without a config; pass a WalkthroughConfig")
    return _build(walkthrough.WalkthroughGPT, config, state_dict, tokenizer, source)


def _parse(config_class, config: dict, source: str):
    try:
        return config_class.from_dict(config)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{source}: bad config: {e}") from e


def _build(model_class, config, state_dict: dict[str, torch.Tensor], tokenizer, source: str) -> torch.nn.Module:
    """Check every key and shape against a fresh model, and only then load (nothing half-loaded)."""
    model = model_class(config, tokenizer=tokenizer)
    _check_fit(model, state_dict, config, source)
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


def _check_fit(model: torch.nn.Module, state_dict: dict[str, torch.Tensor], config, source: str) -> None:
    """Raise one ValueError listing every missing, unexpected or mis-shaped key (and a broken tie)."""
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    problems = []
    for k, shape in expected.items():
        if k not in state_dict:
            problems.append(f"{k}: missing (expected {shape})")
        elif tuple(state_dict[k].shape) != shape:
            problems.append(f"{k}: expected {shape}, found {tuple(state_dict[k].shape)}")
    problems += [f"{k}: unexpected (found {tuple(t.shape)})" for k, t in state_dict.items() if k not in expected]
    if not problems and isinstance(model, Sprout) and not torch.equal(state_dict["embed.weight"],
                                                                      state_dict["head.weight"]):
        problems.append("head.weight: differs from embed.weight, but Sprout ties them (they must be equal)")
    if problems:
        shown = problems[:60] + ([f"... and {len(problems) - 60} more"] if len(problems) > 60 else [])
        raise ValueError(f"{source}: the weights do not fit a {type(model).__name__} with config {config} "
                         f"({len(problems)} problem(s)):\n  " + "\n  ".join(shown))
