"""A training run's checkpoint: every dictionary's weights, Adam's state and the data position, in one folder.

    trainer.json          format, step, settings, hooks, the data's and the model's fingerprints, and
                          per dictionary its input scales, sparsity coefficient
    trainer.safetensors   "{i}.sae.<name>" (parameters and buffers, in training's scaled units),
                          "{i}.opt.<param>.exp_avg" / "exp_avg_sq" (Adam's moments; its step count in the JSON), "{i}.since_fired"

Written whole by rank 0 (`sprout.files.folders.write_folder`: a folder that is not a checkpoint of ours is
never replaced). Resuming checks the settings, hooks, data and model and names what differs; since
every step's batch is a function of the step alone, the resumed run takes the steps the uninterrupted
one would have taken.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import ContextManager

import torch
import torch.distributed as dist
from safetensors import SafetensorError
from safetensors.torch import load as load_bytes
from safetensors.torch import save as save_bytes

from sprout.files import file_in, folder_lock, write_bytes, write_folder
from sprout.settings import range_error, type_error
from sprout.training.core import resume_changes

from ..._core.identity import PathLike
from ..files import SAEFileError, read_bytes, read_json
from ..settings import TrainSettings

FORMAT = "sprout-sae-trainer"
META, TENSORS = "trainer.json", "trainer.safetensors"


def _is_ours(folder: Path) -> bool:
    try:
        return json.loads((Path(folder) / META).read_text()).get("format") == FORMAT
    except (OSError, ValueError, AttributeError, RecursionError):
        return False


def write(folder: PathLike, units: list, s: TrainSettings, meta: dict, step: int) -> None:
    """Write the checkpoint at `step` (rank 0; the others wait for it)."""
    if not dist.is_initialized() or dist.get_rank() == 0:
        tensors, scalars = {}, []
        for i, u in enumerate(units):
            tensors.update({f"{i}.sae.{n}": t.detach().cpu().contiguous().clone() for n, t in u.sae.state_dict().items()})
            for j, (m, v) in enumerate(zip(u.opt.m, u.opt.v)):
                tensors[f"{i}.opt.{j}.exp_avg"], tensors[f"{i}.opt.{j}.exp_avg_sq"] = m.contiguous().clone(), v.contiguous().clone()
            tensors[f"{i}.since_fired"] = u.since_fired.clone()
            scalars.append({"scale_in": u.scale_in, "scale_out": u.scale_out, "coef": u.coef, "adam_t": u.opt.t})
        record = {"format": FORMAT, "version": 1, "step": step, "settings": s.to_dict(), **meta, "units": scalars}
        text, blob = json.dumps(record, indent=1) + "\n", save_bytes(tensors)

        def fill(tmp: Path) -> None:
            write_bytes(tmp / TENSORS, blob)
            write_bytes(tmp / META, text.encode())

        write_folder(folder, fill, frozenset({META, TENSORS}), _is_ours, "an SAE training checkpoint")
    if dist.is_initialized():
        dist.barrier()


def run_lock(folder: PathLike) -> ContextManager[Path]:
    """The checkpoint folder's run lock (`sprout.files.folders.lock_path`), held for a whole run by rank 0: a
    second run with the same folder fails at once instead of both overwriting each other's checkpoints."""
    return folder_lock(folder, wait=0, kind="run.lock", what="an SAE training run")


def refuse_existing(folder: PathLike) -> None:
    """A new run does not overwrite another run's checkpoint (as `sprout train` refuses without --resume)."""
    if (Path(folder) / META).exists():
        raise FileExistsError(f"{folder} already holds an SAE training checkpoint: pass resume=True to continue it, "
                              "or use another checkpoint folder")


def restore(folder: PathLike, units: list, s: TrainSettings, meta: dict) -> int:
    """Load the checkpoint in `folder` into `units`; returns its step (0 when there is none yet).

    Raises:
        ValueError: the checkpoint was made with other settings, hooks, data or model (names which).
    """
    if folder is None:
        raise ValueError("resume=True needs checkpoint=: the folder the run writes its checkpoint to")
    folder = Path(folder)
    if not (folder / META).exists():
        return 0
    record = _read_record(folder, len(units), s.steps)
    _check_same(folder, record, s, meta)
    path = _inside(folder, TENSORS)
    try:
        tensors = load_bytes(read_bytes(path, 1 << 36))
    except (SafetensorError, ValueError, RuntimeError) as e:
        raise SAEFileError(f"cannot read {path}: {str(e)[:200]}") from e
    for i, u in enumerate(units):
        _restore_unit(u, i, tensors, path)
        sc = record["units"][i]
        u.scale_in, u.scale_out, u.coef, u.opt.t = sc["scale_in"], sc["scale_out"], sc["coef"], sc["adam_t"]
    return record["step"]


def _tensor(tensors: dict, key: str, path: Path, like: torch.Tensor) -> torch.Tensor:
    """One tensor of the checkpoint, refused by name when missing, misshapen or not finite."""
    t = tensors.get(key)
    if t is None:
        raise SAEFileError(f"{path}: tensor {key!r} is missing: not a checkpoint of this run's dictionaries")
    if tuple(t.shape) != tuple(like.shape) or t.is_floating_point() != like.is_floating_point():
        raise SAEFileError(f"{path}: tensor {key!r} has shape {list(t.shape)} and dtype {t.dtype}, expected "
                           f"{list(like.shape)} ({like.dtype})")
    if t.is_floating_point() and not torch.isfinite(t).all():
        raise SAEFileError(f"{path}: tensor {key!r} holds NaN or infinite values: the run had diverged")
    return t


def _restore_unit(u, i: int, tensors: dict, path: Path) -> None:
    own = {n: _tensor(tensors, f"{i}.sae.{n}", path, t) for n, t in u.sae.state_dict().items()}
    u.sae.load_state_dict(own)
    for j, (m, v) in enumerate(zip(u.opt.m, u.opt.v)):
        m.copy_(_tensor(tensors, f"{i}.opt.{j}.exp_avg", path, m))
        v.copy_(_tensor(tensors, f"{i}.opt.{j}.exp_avg_sq", path, v))
    u.since_fired = _tensor(tensors, f"{i}.since_fired", path, u.since_fired).clone()


def _inside(folder: Path, name: str) -> Path:
    """`folder / name`, refused (naming it) when a symlink takes it out of the folder, as `sprout.load` refuses."""
    try:
        return file_in(folder, name, "checkpoint file")
    except ValueError as e:
        raise SAEFileError(str(e)) from None


# each dictionary's scalars in trainer.json: (type, range), as sprout.settings.Checked states them
_UNIT_FIELDS = {"scale_in": ("float", (0, None, "(")), "scale_out": ("float", (0, None, "(")),
                "coef": ("float", (0, None, "[")), "adam_t": ("int", (0, None, "["))}


def _read_record(folder: Path, n_units: int, steps: int) -> dict:
    """trainer.json, every field the resume reads checked: its step, and per dictionary its scalars."""
    path = _inside(folder, META)
    record = read_json(path)
    if record.get("format") != FORMAT:
        raise SAEFileError(f"{path} is not an SAE training checkpoint of ours (format {record.get('format')!r})")
    bad = type_error("int", record.get("step")) or range_error((0, steps, "[]"), record.get("step"))
    if bad:
        raise SAEFileError(f"{path}: field 'step' must be {bad} (the run has {steps} steps), got {record.get('step')!r}")
    units = record.get("units")
    if not isinstance(units, list) or len(units) != n_units or not all(isinstance(u, dict) for u in units):
        raise SAEFileError(f"{path}: field 'units' must be a list of {n_units} objects (one per dictionary), got "
                           f"{str(units)[:80]}")
    for i, unit in enumerate(units):
        for name, (kind, rule) in _UNIT_FIELDS.items():
            value = unit.get(name)
            bad = type_error(kind, value) or range_error(rule, value)
            if bad:
                raise SAEFileError(f"{path}: field 'units[{i}].{name}' must be {bad}, got {value!r}")
    return record


def _check_same(folder: Path, record: dict, s: TrainSettings, meta: dict) -> None:
    diff = resume_changes(record.get("settings") or {}, s, was="checkpoint")
    for key, what in (("hooks", "hooks"), ("data", "data fingerprint"), ("model", "model fingerprint")):
        if record.get(key) != meta[key]:
            diff.append(f"{what}: checkpoint {record.get(key)!r}, now {meta[key]!r}")
    if diff:
        raise ValueError(f"resume: the checkpoint at {folder} was made with other settings, refusing to continue "
                         f"it ({'; '.join(diff)}); use another checkpoint folder for a new run")
