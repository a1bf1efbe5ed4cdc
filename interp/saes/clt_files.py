"""Cross-layer transcoder files: a folder in SAELens' style, read back with every field and tensor checked.

    cfg.json                  SAELens' field names where SAELens has one (`architecture` "jumprelu_clt" /
                              "batchtopk_clt", `d_in`, `d_sae` (latents per layer), `d_out`, `dtype`, `device`,
                              `apply_b_dec_to_input` false, `normalize_activations` "none", `model_name`,
                              `metadata` {model_name, sae_lens_version, sprout}) and circuit-tracer's for what
                              only it has (`n_layers`, `feature_input_hook` "ln2.hook_normalized" and
                              `feature_output_hook` "hook_mlp_out", relative to `blocks.{l}`); our record
                              under `metadata.sprout` (kind, k, skip, the model's fingerprint and config, info).
    sae_weights.safetensors   W_enc [n_layers, d_in, d_sae] (SAELens' orientation), b_enc [n_layers, d_sae],
                              b_dec [n_layers, d_out], threshold [n_layers, d_sae], W_dec_{l}
                              [d_sae, n_layers - l, d_out] (circuit-tracer's layout, l <= l' only),
                              W_skip [n_layers, d_out, d_in] when the CLT has a skip.

SAELens has no cross-layer class, so no SAELens reader loads this; circuit-tracer's own folder is written by
`interp.save_circuit_tracer` (its CLT form). Loading refuses, naming the file and the field: JSON that is not
ours, missing or misshapen tensors, integer or non-finite values, and, given a model, a CLT for another one.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_bytes

from .._core.identity import PathLike
from .._core.model import HookedModel
from .files import (
    _DTYPES,
    CFG,
    MAX_WEIGHT_BYTES,
    SAELENS_VERSION,
    WEIGHTS,
    SAEFileError,
    _plain,
    finish_load,
    read_bytes,
    read_json,
    write_dictionary,
)

FORMAT = "sprout-clt"
INPUT, OUTPUT = "ln2.hook_normalized", "hook_mlp_out"


def cfg_dict(clt: Any) -> dict:
    """The CLT's cfg.json as a dict."""
    name = (clt.model_config or {}).get("name") or "sprout"
    record = {"format": FORMAT, "version": 1, "kind": clt.kind, "k": clt.k, "skip": clt.skip,
              "model_fingerprint": clt.model_fingerprint, "model_config": clt.model_config, "info": _plain(clt.info)}
    return {"architecture": f"{clt.kind}_clt", "d_in": clt.d_in, "d_sae": clt.d_sae, "d_out": clt.d_out,
            "n_layers": clt.n_layers, "dtype": str(clt.W_enc.dtype).removeprefix("torch."), "device": "cpu",
            "apply_b_dec_to_input": False, "normalize_activations": "none", "model_name": name,
            "feature_input_hook": INPUT, "feature_output_hook": OUTPUT,
            "metadata": {"model_name": name, "sae_lens_version": SAELENS_VERSION, "sprout": record}}


def _parameters(clt: Any) -> dict[str, torch.Tensor]:
    """The CLT's tensors under their file names (no copies)."""
    out = {"W_enc": clt.W_enc, "b_enc": clt.b_enc, "b_dec": clt.b_dec, "threshold": clt.threshold,
           **{f"W_dec_{l}": w for l, w in enumerate(clt.W_dec)}}
    if clt.W_skip is not None:
        out["W_skip"] = clt.W_skip
    return out


def tensors(clt: Any) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().contiguous().clone() for k, v in _parameters(clt).items()}


def is_ours(folder: Path) -> bool:
    try:
        return json.loads((Path(folder) / CFG).read_text())["metadata"]["sprout"]["format"] == FORMAT
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return False


def save(clt: Any, folder: PathLike) -> Path:
    """Write `clt` into `folder` (created, or replaced only if it holds nothing but a CLT we wrote)."""
    return write_dictionary(folder, cfg_dict(clt), tensors(clt), FORMAT, is_ours, "a cross-layer transcoder folder")


def _int(cfg: dict, key: str, path: Path) -> int:
    value = cfg.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SAEFileError(f"{path}: field {key!r} must be an int >= 1, got {value!r}")
    return value


def _spec(cfg: dict, path: Path) -> dict:
    meta = cfg.get("metadata")
    ours = meta.get("sprout") if isinstance(meta, dict) else None
    if not isinstance(ours, dict) or ours.get("format") != FORMAT:
        raise SAEFileError(f"{path}: field 'metadata.sprout.format' must be {FORMAT!r} (a cross-layer transcoder of "
                           f"ours); got {ours.get('format') if isinstance(ours, dict) else None!r}")
    kind = ours.get("kind")
    if cfg.get("architecture") != f"{kind}_clt" or kind not in ("batchtopk", "jumprelu"):
        raise SAEFileError(f"{path}: fields 'architecture' {cfg.get('architecture')!r} and 'metadata.sprout.kind' "
                           f"{kind!r} must be 'batchtopk_clt'/'batchtopk' or 'jumprelu_clt'/'jumprelu'")
    for key, want in (("feature_input_hook", INPUT), ("feature_output_hook", OUTPUT), ("apply_b_dec_to_input", False)):
        if cfg.get(key) != want:
            raise SAEFileError(f"{path}: field {key!r} must be {want!r}, got {cfg.get(key)!r}")
    dtype = cfg.get("dtype", "float32")
    if not isinstance(dtype, str) or dtype.removeprefix("torch.") not in _DTYPES:
        raise SAEFileError(f"{path}: field 'dtype' must be one of {sorted(_DTYPES)}, got {dtype!r}")
    k, skip = ours.get("k"), ours.get("skip")
    if kind == "batchtopk" and (isinstance(k, bool) or not isinstance(k, int)):
        raise SAEFileError(f"{path}: field 'metadata.sprout.k' must be an int for a batchtopk CLT, got {k!r}")
    if not isinstance(skip, bool):
        raise SAEFileError(f"{path}: field 'metadata.sprout.skip' must be true or false, got {skip!r}")
    return {"n_layers": _int(cfg, "n_layers", path), "d_in": _int(cfg, "d_in", path), "d_sae": _int(cfg, "d_sae", path),
            "d_out": _int(cfg, "d_out", path), "kind": kind, "k": k if kind == "batchtopk" else None, "skip": skip,
            "dtype": _DTYPES[dtype.removeprefix("torch.")], "ours": ours}


def _read_tensors(path: Path, want: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    try:
        found = load_bytes(read_bytes(path, MAX_WEIGHT_BYTES))
    except (SafetensorError, ValueError, RuntimeError) as e:
        raise SAEFileError(f"cannot read {path}: {str(e)[:200]}") from e
    extra = sorted(set(found) - set(want))
    if extra:
        raise SAEFileError(f"{path}: unexpected tensor(s) {extra[:4]} for this cfg.json (expected {sorted(want)[:6]}...)")
    out = {}
    for name, like in want.items():
        t = found.get(name)
        if t is None:
            raise SAEFileError(f"{path}: tensor {name!r} is missing")
        if tuple(t.shape) != tuple(like.shape):
            raise SAEFileError(f"{path}: tensor {name!r} has shape {list(t.shape)}, cfg.json says {list(like.shape)}")
        if not t.is_floating_point():
            raise SAEFileError(f"{path}: tensor {name!r} is {t.dtype}, not floating point")
        if not torch.isfinite(t).all():
            raise SAEFileError(f"{path}: tensor {name!r} holds NaN or infinite values")
        out[name] = t.to(like.dtype)
    return out


def _build(cls: type, spec: dict, cfg_path: Path) -> Any:
    try:
        return cls(spec["n_layers"], spec["d_in"], spec["d_sae"], spec["d_out"], kind=spec["kind"], k=spec["k"],
                   skip=spec["skip"], dtype=spec["dtype"])
    except (TypeError, ValueError) as e:
        raise SAEFileError(f"{cfg_path}: {e}") from e


def load(folder: PathLike, model: Optional[HookedModel], cls: type) -> Any:
    """The CLT in `folder` (an instance of `cls`), checked against `model` if given."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"no cross-layer transcoder at {folder}: not a folder")
    cfg_path = folder / CFG
    spec = _spec(read_json(cfg_path), cfg_path)
    # the cfg's shapes on the meta device first: a cfg asking for terabytes is refused by the weights it names
    # (read within MAX_WEIGHT_BYTES) before anything that size is allocated
    with torch.device("meta"):
        found = _read_tensors(folder / WEIGHTS, _parameters(_build(cls, spec, cfg_path)))
    clt = _build(cls, spec, cfg_path)
    with torch.no_grad():
        for name, t in found.items():
            target = clt.W_dec[int(name.removeprefix("W_dec_"))] if name.startswith("W_dec_") else getattr(clt, name)
            target.copy_(t)
    return finish_load(clt, spec["ours"], model, f"the cross-layer transcoder at {folder}")
