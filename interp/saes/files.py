"""SAE files: SAELens' layout (`cfg.json` + `sae_weights.safetensors`), ours and theirs, checked on the way in.

A folder holds

    cfg.json                  SAELens' config (v6: `architecture`, `d_in`, `d_sae`, `dtype`, `device`,
                              `apply_b_dec_to_input`, `normalize_activations`, `reshape_activations`, `k`
                              and `rescale_acts_by_decoder_norm` for topk, `d_out` for transcoders,
                              `metadata` {`model_name`, `hook_name`, `hook_name_out`, `sae_lens_version` ...};
                              `model_name` and `hook_name` also at the top, where older readers look);
                              our own record under `metadata.sprout` (kind, k, the model's fingerprint and
                              config, what training recorded).
    sae_weights.safetensors   W_enc [d_in, d_sae], b_enc, W_dec [d_sae, d_in], b_dec, threshold, W_skip.

Architectures as SAELens names them: relu -> "standard", topk -> "topk", jumprelu, BatchTopK and Matryoshka
-> "jumprelu" (with their inference threshold); transcoders "transcoder", "skip_transcoder" (ReLU),
"jumprelu[_skip]_transcoder" (the threshold kinds), "[skip_]topk_transcoder" with `k` (SAELens reads these
after `interp.saes.register_with_saelens()`; its spliced runs drop W_skip: docs/compatibility.md).
`metadata.sae_lens_version` is "6.0.0": the config format's version, which SAELens reads to pick its parser.

Loading reads both ours and SAELens-saved folders (v6 and the older flat configs), and refuses anything
else with an error naming the file and the field: files that are not regular files, JSON that is not
SAELens' (wrong types, unknown architectures, deep nesting), tensors missing, misshapen, integer or not
finite, and, given a model, an SAE for another model (fingerprint), another hook or another width.
"""
from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load as load_bytes
from safetensors.torch import save as save_bytes

from sprout.files import file_in, write_bytes, write_folder
from sprout.names import layer_of

from .._core.identity import PathLike
from .._core.model import HookedModel
from .saelens import warn_skip

CFG, WEIGHTS = "cfg.json", "sae_weights.safetensors"
FORMAT = "sprout-sae"
SAELENS_VERSION = "6.0.0"
MAX_JSON_BYTES, MAX_WEIGHT_BYTES, MAX_DEPTH = 4 << 20, 16 << 30, 12
_SAE_ARCH = {"relu": "standard", "topk": "topk", "jumprelu": "jumprelu", "batchtopk": "jumprelu",
             "matryoshka": "jumprelu"}
_KIND_OF = {"standard": "relu", "topk": "topk", "jumprelu": "jumprelu"}
_TC_ARCH = {("relu", False): "transcoder", ("relu", True): "skip_transcoder",
            **{(k, s): f"jumprelu{'_skip' * s}_transcoder" for k in ("jumprelu", "batchtopk", "matryoshka") for s in (False, True)}}
_DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16}


class SAEFileError(ValueError):
    """An SAE folder that cannot be read as one (the message names the file and the field)."""


def hook_layer(hook_name: Optional[str]) -> Optional[int]:
    """The block a hook name belongs to (`blocks.3.hook_resid_post` -> 3), None for others."""
    return layer_of(hook_name) if hook_name else None


def is_transcoder(sae: object) -> bool:
    # by what it has, not its class: this module reads and writes dictionaries without importing sae.py,
    # which imports it (so an SAE can save and load itself)
    return bool(getattr(sae, "transcoder", False)) or getattr(sae, "hook_name_out", None) is not None


def architecture(sae: Any) -> str:
    if is_transcoder(sae):
        return _TC_ARCH.get((sae.kind, sae.skip), f"{'skip_' if sae.skip else ''}{sae.kind}_transcoder")
    return _SAE_ARCH[sae.kind]


def _plain(v):
    """JSON's values: NaN and infinities (a run stopped before any step) become null."""
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def cfg_dict(sae: Any) -> dict:
    """The SAE's cfg.json as a dict (SAELens' fields, our record under metadata.sprout)."""
    dtype = str(sae.W_enc.dtype).removeprefix("torch.")
    meta = {"model_name": (sae.model_config or {}).get("name") or "sprout", "hook_name": sae.hook_name,
            "hook_head_index": None, "prepend_bos": False, "sae_lens_version": SAELENS_VERSION,
            "sae_lens_training_version": None, "sprout": _record(sae)}
    if is_transcoder(sae):
        meta.update(hook_name_out=sae.hook_name_out, hook_layer_out=hook_layer(sae.hook_name_out))
    cfg = {"architecture": architecture(sae), "d_in": sae.d_in, "d_sae": sae.d_sae, "dtype": dtype, "device": "cpu",
           "apply_b_dec_to_input": sae.apply_b_dec_to_input, "normalize_activations": "none",
           "reshape_activations": "none", "model_name": meta["model_name"], "hook_name": sae.hook_name,
           "hook_layer": hook_layer(sae.hook_name), "metadata": meta}
    if sae.kind == "topk":
        cfg.update(k=sae.k, rescale_acts_by_decoder_norm=False)
    if is_transcoder(sae):
        cfg["d_out"] = sae.d_out
    return cfg


def _record(sae: Any) -> dict:
    rec = {"format": FORMAT, "version": 1, "kind": sae.kind, "k": sae.k, "widths": sae.widths,
           "bandwidth": sae.bandwidth, "transcoder": is_transcoder(sae), "model_fingerprint": sae.model_fingerprint,
           "model_config": sae.model_config, "info": _plain(sae.info)}
    if is_transcoder(sae):
        rec.update(skip=sae.skip, layer=sae.layer, input="ln2.hook_normalized: the stream before the MLP divided by "
                   "ln2's scale, before ln2's gain" if (sae.hook_name or "").endswith("ln2.hook_normalized") else None)
    return rec


def _tensors(sae: Any) -> dict:
    out = {name: p.detach().cpu().contiguous() for name, p in (("W_enc", sae.W_enc), ("b_enc", sae.b_enc),
                                                                ("W_dec", sae.W_dec), ("b_dec", sae.b_dec))}
    if sae.threshold is not None:
        out["threshold"] = sae.threshold.detach().cpu().contiguous().clone()
    w_skip = getattr(sae, "W_skip", None)  # a Transcoder's
    if w_skip is not None:
        out["W_skip"] = w_skip.detach().cpu().contiguous()
    return out


def is_ours(folder: Path) -> bool:
    """Whether `folder/cfg.json` is one we wrote (metadata.sprout.format)."""
    try:
        cfg = json.loads((Path(folder) / CFG).read_text())
        return cfg["metadata"]["sprout"]["format"] == FORMAT
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return False


def save(sae: Any, folder: PathLike) -> Path:
    """Write `sae` into `folder` (created, or replaced only if it holds nothing but an SAE we wrote)."""
    if is_transcoder(sae) and sae.skip:
        warn_skip(f"the transcoder written to {folder}")
    return write_dictionary(folder, cfg_dict(sae), _tensors(sae), FORMAT, is_ours, "an SAE folder")


def write_dictionary(folder: PathLike, cfg: dict, tensors: dict[str, torch.Tensor], fmt: str,
                     is_ours: Callable[[Path], bool], what: str) -> Path:
    """Write cfg.json and the weights (stamped with `fmt`) into `folder`, both or neither: created, or
    replaced only if `is_ours` says it holds nothing but a dictionary we wrote (`what` names it in errors)."""
    text = json.dumps(cfg, indent=1, allow_nan=False) + "\n"
    blob = save_bytes(tensors, metadata={"format": fmt})

    def fill(tmp: Path) -> None:
        write_bytes(tmp / WEIGHTS, blob)
        write_bytes(tmp / CFG, text.encode())

    return Path(write_folder(folder, fill, frozenset({CFG, WEIGHTS}), is_ours, what))


def read_bytes(path: Path, limit: int) -> bytes:
    """The bytes of a regular file (no FIFO, device or folder), at most `limit` of them."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"no SAE at {path.parent}: {path.name} is missing") from None
    if not stat.S_ISREG(st.st_mode):
        raise SAEFileError(f"{path} is not a regular file (a FIFO, device or folder): refusing to read it")
    if st.st_size > limit:
        raise SAEFileError(f"{path} is {st.st_size} bytes, more than an SAE file of this kind holds ({limit})")
    with open(path, "rb") as f:
        data = f.read(st.st_size + 1)
    if len(data) > limit:
        raise SAEFileError(f"{path} grew past {limit} bytes while being read")
    return data


def _depth(v, d: int = 0) -> int:
    if d > MAX_DEPTH:
        return d
    if isinstance(v, dict):
        return max([_depth(x, d + 1) for x in v.values()], default=d + 1)
    if isinstance(v, list):
        return max([_depth(x, d + 1) for x in v], default=d + 1)
    return d


def read_json(path: Path) -> dict:
    """A JSON object from a regular file of bounded size and nesting (no NaN / Infinity constants)."""
    raw = read_bytes(path, MAX_JSON_BYTES)
    try:
        value = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise SAEFileError(f"cannot read {path}: {str(e)[:200]}") from e
    if not isinstance(value, dict):
        raise SAEFileError(f"{path} must hold a JSON object, got {type(value).__name__}")
    if _depth(value) > MAX_DEPTH:
        raise SAEFileError(f"{path} is nested deeper than {MAX_DEPTH} levels: not a file of ours or SAELens'")
    return value


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number JSON allows")


def _field(cfg: dict, key: str, types, path: Path, default=None, required: bool = False):
    meta = cfg["metadata"] if isinstance(cfg.get("metadata"), dict) else {}
    if key in cfg and cfg[key] is not None:
        value = cfg[key]
    elif key in meta and meta[key] is not None:
        value = meta[key]
    elif required:
        raise SAEFileError(f"{path}: field {key!r} is missing")
    else:
        return default
    bad_bool = isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,))
    if bad_bool or not isinstance(value, types):
        raise SAEFileError(f"{path}: field {key!r} must be {getattr(types, '__name__', types)}, got {value!r}")
    return value


def _spec(cfg: dict, path: Path) -> dict:
    """The dictionary a cfg.json describes, its fields type-checked."""
    meta = cfg.get("metadata", {})
    if not isinstance(meta, dict):
        raise SAEFileError(f"{path}: field 'metadata' must be an object, got {type(meta).__name__}")
    ours = meta.get("sprout") if isinstance(meta.get("sprout"), dict) else None
    if ours is not None and ours.get("format") != FORMAT:
        raise SAEFileError(f"{path}: field 'metadata.sprout.format' must be {FORMAT!r}, got {ours.get('format')!r}")
    act_fn = cfg.get("activation_fn", cfg.get("activation_fn_str"))  # SAELens before 6.0 named TopK here
    arch = _field(cfg, "architecture", str, path, default="topk" if act_fn == "topk" else "standard")
    if arch == "standard" and act_fn == "topk":
        arch = "topk"
    spec = {"arch": arch, "ours": ours or {}, "d_in": _pos_int(cfg, "d_in", path), "d_sae": _pos_int(cfg, "d_sae", path),
            "hook_name": _field(cfg, "hook_name", str, path) or _field(cfg, "hook_point", str, path),
            "hook_name_out": _field(cfg, "hook_name_out", str, path),
            "apply_b_dec": _field(cfg, "apply_b_dec_to_input", bool, path, default=True),
            "dtype": _field(cfg, "dtype", str, path, default="float32")}
    if spec["dtype"].removeprefix("torch.") not in _DTYPES:
        raise SAEFileError(f"{path}: field 'dtype' must be one of {sorted(_DTYPES)}, got {spec['dtype']!r}")
    norm = cfg.get("normalize_activations", "none")
    if norm not in ("none", "expected_average_only_in", None, False):
        raise SAEFileError(f"{path}: field 'normalize_activations' is {norm!r}; only SAEs whose inputs are used as "
                           "they are ('none', or 'expected_average_only_in' with the factor folded in) can be read")
    if cfg.get("reshape_activations", "none") not in ("none", None):
        raise SAEFileError(f"{path}: field 'reshape_activations' is {cfg.get('reshape_activations')!r}; only 'none' is read")
    _kind_of(spec, cfg, path)
    return spec


def _pos_int(cfg: dict, key: str, path: Path) -> int:
    value = _field(cfg, key, int, path, required=True)
    if value < 1:
        raise SAEFileError(f"{path}: field {key!r} must be >= 1, got {value}")
    return value


def _kind_of(spec: dict, cfg: dict, path: Path) -> None:
    arch, ours = spec["arch"], spec["ours"]
    transcoder = arch.endswith("transcoder")
    base, skip = _transcoder_parts(arch) if transcoder else (_KIND_OF.get(arch), False)
    if base is None or (transcoder and base not in ("relu", "jumprelu", "topk", "batchtopk", "matryoshka")):
        raise SAEFileError(f"{path}: field 'architecture' is {arch!r}; readable ones are standard, topk, jumprelu, "
                           "transcoder, skip_transcoder, jumprelu_transcoder, jumprelu_skip_transcoder and ours")
    kind = ours.get("kind", base)
    if not isinstance(kind, str) or (kind != base and not (base == "jumprelu" and kind in ("batchtopk", "matryoshka"))):
        raise SAEFileError(f"{path}: field 'metadata.sprout.kind' is {kind!r}, which architecture {arch!r} cannot hold")
    k = ours.get("k") if kind in ("batchtopk", "matryoshka") else None
    if kind == "topk":
        k = _field(cfg, "k", int, path)  # 0 is refused as 0 (by the SAE), not replaced by another source
        for other in ((cfg.get("activation_fn_kwargs") or {}).get("k") if isinstance(cfg.get("activation_fn_kwargs"),
                                                                                     dict) else None, ours.get("k")):
            k = other if k is None else k
    spec.update(transcoder=transcoder, skip=skip, kind=kind, k=k, widths=ours.get("widths"),
                bandwidth=0.05 if ours.get("bandwidth") is None else ours["bandwidth"],
                rescale=_field(cfg, "rescale_acts_by_decoder_norm", bool, path, default=False),
                d_out=_pos_int(cfg, "d_out", path) if transcoder else spec["d_in"])
    act_fn = cfg.get("activation_fn", cfg.get("activation_fn_str"))
    if not transcoder and kind != "topk" and act_fn not in ("relu", None):
        raise SAEFileError(f"{path}: field 'activation_fn' is {act_fn!r}; a {arch} SAE here uses relu")


def _transcoder_parts(arch: str) -> tuple[Optional[str], bool]:
    """(kind, skip) of "transcoder" (relu), "skip_transcoder", "jumprelu_skip_transcoder", "skip_topk_transcoder" ..."""
    parts = [p for p in arch.removesuffix("transcoder").split("_") if p]
    kinds = [p for p in parts if p != "skip"]
    return (kinds[0] if kinds else "relu") if len(kinds) <= 1 else None, "skip" in parts


def _build(spec: dict, path: Path, classes: tuple) -> Any:
    common = dict(kind=spec["kind"], k=spec["k"], widths=spec["widths"], bandwidth=spec["bandwidth"],
                  dtype=_DTYPES[spec["dtype"].removeprefix("torch.")])
    SAE, Transcoder = classes
    try:
        if spec["transcoder"]:
            return Transcoder(spec["d_in"], spec["d_sae"], spec["d_out"], skip=spec["skip"], hook_name=spec["hook_name"],
                              hook_name_out=spec["hook_name_out"], **common)
        sae = SAE(spec["d_in"], spec["d_sae"], hook_name=spec["hook_name"], **common)
    except (TypeError, ValueError) as e:
        raise SAEFileError(f"{path}: {e}") from e
    sae.apply_b_dec_to_input = spec["apply_b_dec"]
    return sae


def _read_tensors(sae: Any, path: Path, spec: dict) -> dict:
    try:
        tensors = load_bytes(read_bytes(path, MAX_WEIGHT_BYTES))
    except (SafetensorError, ValueError, RuntimeError) as e:
        raise SAEFileError(f"cannot read {path}: {str(e)[:200]}") from e
    if "log_threshold" in tensors and "threshold" not in tensors:  # SAELens' training-time JumpReLU
        tensors["threshold"] = tensors.pop("log_threshold").double().exp()
    if "scaling_factor" in tensors:
        sf = tensors.pop("scaling_factor")
        if not torch.all(sf == 1):
            raise SAEFileError(f"{path}: tensor 'scaling_factor' is not all ones (SAELens' finetuning scale): not read")
    want = {n: tuple(t.shape) for n, t in _tensors(sae).items()}
    for name, shape in want.items():
        t = tensors.get(name)
        if t is None:
            raise SAEFileError(f"{path}: tensor {name!r} is missing (an SAE of architecture {spec['arch']!r} has "
                               f"{', '.join(want)})")
        if not t.is_floating_point():
            raise SAEFileError(f"{path}: tensor {name!r} has dtype {t.dtype}; SAE weights are floating point")
        if tuple(t.shape) != shape:
            raise SAEFileError(f"{path}: tensor {name!r} has shape {list(t.shape)}, cfg.json says {list(shape)}")
        if not torch.isfinite(t).all():
            raise SAEFileError(f"{path}: tensor {name!r} holds NaN or infinite values")
    extra = sorted(set(tensors) - set(want))
    if extra:
        raise SAEFileError(f"{path}: unexpected tensors {extra} for architecture {spec['arch']!r}")
    return tensors


def weight_shapes(path: Path) -> dict[str, list[int]]:
    """The tensor shapes a safetensors file declares in its header, read without reading the tensors (the
    file already checked to be a regular file inside its folder)."""
    try:
        with safe_open(str(path), "pt") as f:
            return {name: list(f.get_slice(name).get_shape()) for name in f.keys()}
    except (SafetensorError, OSError, ValueError) as e:
        raise SAEFileError(f"cannot read {path}: not a safetensors file ({str(e)[:120]})") from e


def _check_header(path: Path, spec: dict, cfg_path: Path) -> None:
    """cfg.json's d_in, d_sae and d_out against the shapes of W_enc and W_dec in the weights' header, so a
    config that does not fit its weights is named before a dictionary of its size is allocated."""
    shapes = weight_shapes(path)
    want = {"W_enc": [spec["d_in"], spec["d_sae"]], "W_dec": [spec["d_sae"], spec["d_out"]]}
    for name, shape in want.items():
        if name in shapes and shapes[name] != shape:
            fields = "d_in, d_sae" if name == "W_enc" else "d_sae, " + ("d_out" if spec["transcoder"] else "d_in")
            raise SAEFileError(f"{cfg_path}: fields {fields} are {shape}, but {path.name} holds {name} of shape "
                               f"{shapes[name]}: the config does not fit the weights")


def load(folder: PathLike, model: Optional[HookedModel], expect: type, classes: tuple) -> Any:
    """The SAE or transcoder in `folder` (ours or SAELens'), checked against `model` when given.

    Raises:
        FileNotFoundError: no cfg.json / sae_weights.safetensors there.
        SAEFileError (a ValueError): a file that is not a readable SAE, naming the file and the field.
        ValueError: an SAE for another model, hook or width than `model`'s.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"no SAE at {folder}: not a folder")
    # refused: a name that leaves the folder through a symlink (as sprout.load refuses one)
    try:
        cfg_path, weights_path = file_in(folder, CFG, "SAE config"), file_in(folder, WEIGHTS, "SAE weights")
    except FileNotFoundError:
        raise
    except ValueError as e:
        raise SAEFileError(str(e)) from None
    cfg = read_json(cfg_path)
    spec = _spec(cfg, cfg_path)
    _check_header(weights_path, spec, cfg_path)  # before building: cfg.json's sizes against the weights' own
    sae = _build(spec, cfg_path, classes)
    if expect is classes[1] and not is_transcoder(sae):
        raise SAEFileError(f"{cfg_path}: architecture {spec['arch']!r} is an SAE, not a transcoder")
    tensors = _read_tensors(sae, weights_path, spec)
    with torch.no_grad():
        for name, t in tensors.items():
            getattr(sae, name).copy_(t)
        if spec["rescale"]:  # SAELens' rescale_acts_by_decoder_norm, folded: the same latents, unit rows
            norms = sae.W_dec.norm(dim=-1)
            sae.W_enc.mul_(norms)
            sae.b_enc.mul_(norms)
            sae.W_dec.div_(norms[:, None])
    return finish_load(sae, spec["ours"], model, f"the SAE at {folder}")


def finish_load(dictionary: Any, ours: dict, model: Optional[HookedModel], what: str) -> Any:
    """A loaded dictionary given the provenance we wrote (`ours`: fingerprint, config, info), put in eval
    mode and, given a model, checked against it (`what` names it in the error)."""
    dictionary.model_fingerprint, dictionary.model_config = ours.get("model_fingerprint"), ours.get("model_config")
    dictionary.info = ours.get("info") if isinstance(ours.get("info"), dict) else {}
    dictionary.eval()
    if model is not None:
        dictionary.check_model(model, what)
    return dictionary
