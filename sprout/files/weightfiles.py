"""The files the project reads: the one file contract, and weight files read into a state dict and a config.

The contract, for every file we read (weights, configs, indexes, tokenizers, tuned lenses, texts):
it is a regular file, checked with `stat` before anything opens it (opening a named pipe blocks until
a writer comes; a device or a socket can be endless), and a file named by another file (a shard in
`model.safetensors.index.json`) or expected in a folder is inside that folder: no absolute names, no
`..`, no symlink that resolves elsewhere (`regular_file`, `file_in`). JSON is read with a size bound,
without NaN or Infinity, and its fields are checked by type, so tampered JSON gets an error naming the
file and the field (`read_json_file`, `check_fields`).

Torch files are read only with torch's weights-only reader: a file that needs code to unpickle is
refused, never run. Every failure names the file and what is wrong with it: truncated or corrupt, a
plain pickle, code inside, or a tensor that does not fit in memory (with its size).
"""
from __future__ import annotations

import json
import math
import os
import pickle
import stat
import struct
import warnings
from pathlib import Path
from typing import Optional, Union

import torch
from safetensors import safe_open

PathLike = Union[str, os.PathLike]
CONFIG = "config.json"
WEIGHT_KEYS = ("model", "state_dict", "model_state_dict")  # where trainers nest the weights
CONFIG_KEYS = ("config", "cfg", "model_args")
WRAPPER_PREFIXES = ("_orig_mod.", "module.")  # torch.compile, DistributedDataParallel
BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


MAX_JSON_BYTES = 64 << 20  # a config, an index or a lens' JSON; a tokenizer.json of 250k tokens is ~20 MiB
MAX_INT = 1 << 63  # larger integers are tampering (or a field a float would have held), not a size


# --- the file contract ----------------------------------------------------------------------------

def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "a special file"


def regular_file(path: PathLike, what: str = "file") -> Path:
    """`path` if it is a regular file (a symlink to one is followed), checked before anything opens it.

    Raises:
        FileNotFoundError: nothing there (or a broken link). ValueError: a folder, a named pipe, a
            socket or a device, naming `what` and the path.
    """
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        broken = " (a broken symlink)" if os.path.islink(path) else ""
        raise FileNotFoundError(f"no {what} at {path}{broken}") from None
    except OSError as e:
        raise ValueError(f"cannot read the {what} {path}: {e.strerror or e}") from None
    if not stat.S_ISREG(mode):
        raise ValueError(f"{path} is not a file but {_kind(mode)} (not a regular file): refusing to read it as the "
                         f"{what} (a pipe would block, a device can be endless)")
    return path


def _roots(folder: Path) -> list[Path]:
    """Where a file of `folder` may really live: the folder, and for a Hugging Face hub snapshot
    (`<repo>/snapshots/<revision>/`, whose files are links to `../../blobs/<hash>`) the repo's blobs."""
    real = Path(os.path.realpath(folder))
    roots = [real]
    if real.parent.name == "snapshots":
        roots.append(real.parent.parent / "blobs")
    return roots


def file_in(folder: PathLike, name: PathLike, what: str = "file", must_exist: bool = True) -> Path:
    """`folder / name`, refused unless it is a regular file inside `folder`.

    Args:
        folder: the folder the file belongs to (a checkpoint, a Hugging Face folder, a lens' folder).
        name: a relative name, as an index file or a convention gives it: absolute names and `..` are
            refused, and a symlink must resolve inside `folder` (or, for a hub snapshot, its blobs).
        what: named in errors ("shard", "config.json").
        must_exist: with False, an absent file returns its path (a caller that reads it only if present).

    Raises:
        ValueError: a name or a link that leaves the folder, or not a regular file.
        FileNotFoundError: nothing there (when `must_exist`).
    """
    folder = Path(folder)
    if not isinstance(name, (str, os.PathLike)) or not os.fspath(name):
        raise ValueError(f"{folder}: the {what} name {name!r} is not a file name")
    rel = Path(name)
    if rel.is_absolute() or ".." in rel.parts or rel.drive:
        raise ValueError(f"{folder}: the {what} {os.fspath(name)!r} is outside the folder (an absolute name or "
                         "'..'); every file a folder names must be inside it")
    path = folder / rel
    if not os.path.lexists(path):
        if must_exist:
            raise FileNotFoundError(f"{folder}: no {what} {os.fspath(name)!r} in it")
        return path
    real = Path(os.path.realpath(path))
    if not any(real == r or r in real.parents for r in _roots(folder)):
        raise ValueError(f"{path}: the {what} is a link to {real}, outside {folder}; every file a folder "
                         "names must be inside it (copy the file in instead of linking it)")
    return regular_file(path, what)


def read_bounded(path: PathLike, what: str = "file", limit: int = MAX_JSON_BYTES) -> bytes:
    """The bytes of a regular file, at most `limit` of them (a longer file is refused, naming it)."""
    path = regular_file(path, what)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a pipe swapped in after the stat must not block
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"the {what} {path} is not a regular file: refusing to read it")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise ValueError(f"the {what} {path} is larger than {limit >> 20} MiB: not a file of this kind")
    return data


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def read_json(text: Union[str, bytes], where: PathLike) -> dict:
    """A JSON object from `text`, or a ValueError naming `where` (bad JSON, too deep, NaN, not an object)."""
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError(f"cannot read {where}: its JSON is nested too deeply to be a config") from None
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError, NaN, an int of more than 4300 digits
        raise ValueError(f"cannot read {where}: not valid JSON ({e})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(value).__name__}")
    return value


def read_json_file(path: PathLike, what: Optional[str] = None, fields: Optional[dict] = None) -> dict:
    """A JSON object from the regular file `path`, its `fields` ({key: kind}, see `check_fields`) checked."""
    path = Path(path)
    value = read_json(read_bounded(path, what or path.name), path)
    if fields:
        check_fields(value, fields, path)
    return value


FIELD_TYPES = {
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool) and abs(v) < MAX_INT,
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and abs(v) < 1e300,
    "str": lambda v: isinstance(v, str),
    "bool": lambda v: isinstance(v, bool),
    "list": lambda v: isinstance(v, list),
    "dict": lambda v: isinstance(v, dict),
    "none": lambda v: v is None,
}
_KIND_NAMES = {"int": "an integer below 2^63", "number": "a finite number", "str": "a string", "bool": "true or false",
               "list": "a list", "dict": "an object", "none": "null"}


def check_fields(obj: dict, fields: dict, where: PathLike) -> dict:
    """Check the types of the `fields` present in `obj`: {key: "int" | "number" | "str" | "bool" | "list" |
    "dict", or several joined by "|" ("int|none")}; a ValueError names `where`, the field and the value."""
    for key, kinds in fields.items():
        if key in obj and not any(FIELD_TYPES[k](obj[key]) for k in kinds.split("|")):
            shown = _short(obj[key])
            want = " or ".join(_KIND_NAMES[k] for k in kinds.split("|"))
            raise ValueError(f"{where}: field {key!r} is {type(obj[key]).__name__} {shown}, expected {want}")
    return obj


# --- safetensors ----------------------------------------------------------------------------------

def read_safetensors_file(path: Path) -> tuple[dict, Optional[dict]]:
    """(state dict, config or None); the config is the config.json beside the file, else its metadata."""
    regular_file(path, "weights file")
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
            state_dict = {k: f.get_tensor(k) for k in f.keys()}
    except MemoryError:
        raise MemoryError(out_of_memory(path)) from None
    except Exception as e:  # safetensors raises its own error type (and OSError) for bad files
        raise ValueError(f"cannot read {path}: not a valid safetensors file (truncated or corrupt?): {e}") from e
    tied = read_json(metadata.get("tied", "{}"), f"{path}'s metadata \"tied\"")
    check_fields(tied, dict.fromkeys(tied, "str"), f"{path}'s metadata \"tied\"")
    for name, target in tied.items():
        if target in state_dict:
            state_dict.setdefault(name, state_dict[target])
    beside = config_beside(path)
    if beside is not None:
        config = read_json_file(beside)
        if "config" in metadata:
            _warn_if_edited(config, read_json(metadata["config"], f"{path}'s metadata"), beside, path)
        return state_dict, config
    if "config" in metadata:
        return state_dict, read_json(metadata["config"], f"{path}'s metadata")
    return state_dict, None


def shard_files(directory: Path) -> dict[Path, Optional[set]]:
    """The weight files of a folder: {model.safetensors: None}, or {shard: the tensor names the index maps
    to it} from model.safetensors.index.json. Every shard must be a regular file inside the folder."""
    index = directory / "model.safetensors.index.json"
    if os.path.lexists(directory / "model.safetensors"):
        return {file_in(directory, "model.safetensors", "weights file"): None}
    if not os.path.lexists(index):
        raise ValueError(f"{directory}: no model.safetensors or model.safetensors.index.json "
                         "(only safetensors weights are read)")
    index = file_in(directory, index.name, index.name)
    weight_map = read_json_file(index, fields={"weight_map": "dict", "metadata": "dict|none"}).get("weight_map")
    if not weight_map:
        raise ValueError(f"{index}: field 'weight_map' is missing or empty (tensor name -> shard file)")
    check_fields(weight_map, dict.fromkeys(weight_map, "str"), f"{index} field 'weight_map'")
    shards: dict[Path, set] = {}
    for name, shard in weight_map.items():
        try:
            path = file_in(directory, shard, "shard")
        except (OSError, ValueError) as e:
            raise ValueError(f"{index}: weight_map[{name!r}]: {e}") from None
        shards.setdefault(path, set()).add(name)
    return dict(shards)


def read_safetensors(directory: Path) -> dict[str, torch.Tensor]:
    """All tensors of a folder: model.safetensors, or the shards named in model.safetensors.index.json
    (each tensor in the shard its index names, and in no other)."""
    tensors: dict[str, torch.Tensor] = {}
    where: dict[str, Path] = {}
    for f, names in sorted(shard_files(Path(directory)).items()):
        try:
            with safe_open(str(f), framework="pt") as sf:
                found = {k: sf.get_tensor(k) for k in sf.keys()}
        except Exception as e:  # safetensors raises its own error types for unreadable files
            raise ValueError(f"cannot read {f}: not a valid safetensors file ({e})") from e
        twice = sorted(set(found) & set(tensors))
        if twice:
            raise ValueError(f"{f}: tensor {twice[0]!r} is also in {where[twice[0]]}")
        if names is not None and names != set(found):
            missing, extra = sorted(names - set(found)), sorted(set(found) - names)
            raise ValueError(f"{f} does not hold what model.safetensors.index.json says: "
                             + "; ".join(x for x in (f"missing {missing[:8]}" if missing else "",
                                                     f"not in the index {extra[:8]}" if extra else "") if x))
        tensors.update(found)
        where.update(dict.fromkeys(found, f.name))
    return tensors


def config_beside(path: Path) -> Optional[Path]:
    """The config.json in the folder of the weights file `path`, if there is one (held to `file_in`)."""
    beside = file_in(path.parent, CONFIG, CONFIG, must_exist=False)
    return beside if os.path.lexists(beside) else None


def _warn_if_edited(config: dict, stored: dict, beside: Path, path: Path) -> None:
    differ = sorted(k for k in set(config) | set(stored) if config.get(k) != stored.get(k))
    if differ:  # an edited config.json: it wins, but say so (context and rope_base fit any weights)
        warnings.warn(f"{beside} disagrees with the config saved inside {path.name} on "
                      + ", ".join(f"{k} ({_short(config.get(k))} vs {_short(stored.get(k))})" for k in differ)
                      + f"; using {beside.name}", stacklevel=4)


def _short(value, width: int = 60) -> str:
    shown = repr(value)
    return shown if len(shown) <= width else shown[: width - 3] + "..."


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
    obj = _torch_load(regular_file(path, "weights file"))
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
