"""Weight files read into a state dict and an optional config: safetensors, and torch files without code.

Torch files are read only with torch's weights-only reader: a file that needs code to unpickle is
refused, never run. Every failure names the file and what is wrong with it: truncated or corrupt, a
plain pickle, code inside, or a tensor that does not fit in memory (with its size).
"""
from __future__ import annotations

import json
import pickle
import struct
import warnings
from pathlib import Path
from typing import Optional

import torch
from safetensors import safe_open

CONFIG = "config.json"
WEIGHT_KEYS = ("model", "state_dict", "model_state_dict")  # where trainers nest the weights
CONFIG_KEYS = ("config", "cfg", "model_args")
WRAPPER_PREFIXES = ("_orig_mod.", "module.")  # torch.compile, DistributedDataParallel
BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


def read_json(text, where) -> dict:
    """A JSON object from `text`, or a ValueError naming `where` (bad JSON, too deep, not an object)."""
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read {where}: not valid JSON ({e})") from e
    except RecursionError:
        raise ValueError(f"cannot read {where}: its JSON is nested too deeply to be a config") from None
    if not isinstance(value, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(value).__name__}")
    return value


# --- safetensors ----------------------------------------------------------------------------------

def read_safetensors_file(path: Path) -> tuple[dict, Optional[dict]]:
    """(state dict, config or None); the config is the config.json beside the file, else its metadata."""
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
            state_dict = {k: f.get_tensor(k) for k in f.keys()}
    except MemoryError:
        raise MemoryError(out_of_memory(path)) from None
    except Exception as e:  # safetensors raises its own error type (and OSError) for bad files
        raise ValueError(f"cannot read {path}: not a valid safetensors file (truncated or corrupt?): {e}") from e
    for name, target in read_json(metadata.get("tied", "{}"), f"{path}'s metadata").items():
        if target in state_dict:
            state_dict.setdefault(name, state_dict[target])
    beside = path.parent / CONFIG
    if beside.is_file():
        config = read_json(beside.read_bytes(), beside)
        if "config" in metadata:
            _warn_if_edited(config, read_json(metadata["config"], f"{path}'s metadata"), beside, path)
        return state_dict, config
    if "config" in metadata:
        return state_dict, read_json(metadata["config"], f"{path}'s metadata")
    return state_dict, None


def _warn_if_edited(config: dict, stored: dict, beside: Path, path: Path) -> None:
    differ = sorted(k for k in set(config) | set(stored) if config.get(k) != stored.get(k))
    if differ:  # an edited config.json: it wins, but say so (context and rope_base fit any weights)
        warnings.warn(f"{beside} disagrees with the config saved inside {path.name} on "
                      + ", ".join(f"{k} ({config.get(k)!r} vs {stored.get(k)!r})" for k in differ)
                      + f"; using {beside.name}", stacklevel=4)


def out_of_memory(path: Path) -> str:
    """What ran out of memory reading `path`: the file's size and, for safetensors, its largest tensor."""
    largest = ""
    try:
        with open(path, "rb") as f:
            header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
        sizes = {k: (v["shape"], v["dtype"], _nbytes(v)) for k, v in header.items() if k != "__metadata__"}
        name, (shape, dtype, nbytes) = max(sizes.items(), key=lambda kv: kv[1][2])
        largest = f"; its largest tensor, {name} {shape} {dtype}, alone needs {_gib(nbytes)}"
    except Exception:  # a torch file, or a header we cannot read: the file size still says enough
        pass
    return (f"out of memory reading {path} ({_gib(path.stat().st_size)} on disk{largest}): free memory, "
            "raise the memory limit, or read it on a larger machine")


def _nbytes(entry: dict) -> int:
    n = BYTES.get(entry["dtype"], 4)
    for d in entry["shape"]:
        n *= d
    return n


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**26 else f"{n / 2**20:.1f} MiB"


# --- torch files ----------------------------------------------------------------------------------

def read_torch_file(path: Path) -> tuple[dict, Optional[dict]]:
    """(state dict, config or None) from a torch file, read with weights_only=True."""
    obj = _torch_load(path)
    if not isinstance(obj, dict):
        raise ValueError(f"{path} holds a {type(obj).__name__}, not a state dict or a dict of them")
    weights, config = _unwrap(obj, path)
    state_dict = {}
    for name, t in weights.items():
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{path}: entry {name!r} of the state dict is a {type(t).__name__}, not a tensor")
        while name.startswith(WRAPPER_PREFIXES):
            name = name.split(".", 1)[1]
        state_dict[name] = t
    return state_dict, config


def _torch_load(path: Path):
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except MemoryError:
        raise MemoryError(out_of_memory(path)) from None
    except Exception as e:
        if isinstance(e, RuntimeError) and "can't allocate memory" in str(e):
            raise MemoryError(out_of_memory(path)) from None
        raise _load_error(path, e) from (None if isinstance(e, pickle.UnpicklingError) else e)


def _load_error(path: Path, e: Exception) -> ValueError:
    """Why torch's weights-only reader failed on `path`, as one ValueError."""
    reason = _weights_only_reason(str(e))
    # "Unsupported operand" is a byte the reader cannot parse (garbage); anything else it refuses
    # (a global, a class, a call) is code the file wants run.
    if (isinstance(e, pickle.UnpicklingError) and "Weights only load failed" in str(e)
            and not reason.startswith("Unsupported operand")):
        return ValueError(
            f"refusing to load {path}: it holds more than tensors and plain data, so it would need to "
            f"run code to load, and we never do that (the weights-only reader stopped at: {reason}). "
            "If you trust it, load it yourself and save its state_dict() (or use sprout.save).")
    with open(path, "rb") as f:
        head = f.read(2)
    if reason.startswith("Unsupported operand") and head[:1] == b"\x80" and head[1:] >= b"\x04":
        return ValueError(f"cannot read {path}: it is a plain pickle (protocol {head[1]}), not a torch.save "
                          "file; we read torch files only with the weights-only reader and never unpickle "
                          "with code. If you trust it, unpickle it yourself and torch.save its tensors.")
    if isinstance(e, EOFError):
        detail = "the file ends early"
    elif "Weights only load failed" in str(e):
        detail = reason
    else:
        detail = str(e).split(". This is an internal miniz error")[0]
    return ValueError(f"cannot read {path}: not a valid torch file (truncated or corrupt?): {type(e).__name__}: {detail}")


def _unwrap(obj: dict, path: Path) -> tuple[dict, Optional[dict]]:
    """The weights and the config of a torch checkpoint: a bare state dict, or one nested under a key."""
    if all(isinstance(v, torch.Tensor) for v in obj.values()):
        return obj, None
    weights = [k for k in WEIGHT_KEYS if isinstance(obj.get(k), dict)]
    if not weights:
        raise ValueError(f"{path} is neither a state dict nor a dict with the weights under one of "
                         f"{list(WEIGHT_KEYS)}; its keys are {sorted(map(str, obj))[:20]}")
    configs = [k for k in CONFIG_KEYS if k in obj]
    config = obj[configs[0]] if configs else None
    if configs and not isinstance(config, dict):
        raise ValueError(f"{path}: the config under {configs[0]!r} is a {type(config).__name__}, expected a dict")
    return obj[weights[0]], config


def _weights_only_reason(message: str) -> str:
    """What torch's weights-only reader stopped at, without its advice to allowlist or to trust."""
    text = message.split("Check the documentation")[0]
    if "WeightsUnpickler error:" in text:
        text = text.split("WeightsUnpickler error:")[-1]
    else:  # newer messages give the reason as the last paragraph
        text = ([p for p in text.split("\n\n") if p.strip()] or [text])[-1]
    return text.split(". Please")[0].strip().rstrip(".")
