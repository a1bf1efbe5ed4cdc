"""Transcoder sets in circuit-tracer's folder layout, written and read back exactly (up to float rounding).

circuit-tracer (Ameisen et al. 2025, "Circuit Tracing"; Hanna, Piotrowski et al.'s library) reads a set of
per-layer transcoders, one for each block 0..n_layers-1, from a folder:

    config.yaml          model_kind: transcoder_set, feature_input_hook / feature_output_hook (relative
                         to `blocks.{l}`), scan, model_name; our record under `sprout` (kinds, widths)
    layer_{l}.safetensors  W_enc [d_transcoder, d_model]  (ours transposed)
                           b_enc [d_transcoder], W_dec [d_transcoder, d_model], b_dec [d_model]
                           W_skip [d_model, d_model]  (x @ W_skip.T, as ours), when the set has a skip
                           activation_function.threshold [d_transcoder]  (JumpReLU; absent: ReLU)

Its conventions, and how ours map onto them:
- Input: its replacement model reads the MLP's input, `mlp.hook_in`, which is ln2's output *with* the
  gain; ours read `ln2.hook_normalized`, before the gain. The gain g is folded into the encoder and the
  skip: W_enc[:, i] / g[i], W_skip[:, i] / g[i] (so a model whose ln2 has a zero gain or a bias is refused).
- Activation: its loader knows ReLU and JumpReLU, x * (x > threshold), only. Ours: relu as ReLU;
  jumprelu, batchtopk and matryoshka as JumpReLU with the threshold clamped at 0 (relu(x) * (x > t) is
  x * (x > max(t, 0)) exactly). A TopK transcoder keeps the k largest latents of each row, which no
  threshold reproduces: it is refused, with that reason.
- One width: every layer has the same d_transcoder; narrower layers are padded with latents that never
  fire (zero encoder and decoder rows, zero bias, threshold 1), and trimmed again on the way back.
- A skip term in one layer gives every layer a W_skip (zeros where there was none), as its set has one
  flag for all.

A cross-layer transcoder (`interp.CrossLayerTranscoder`) is written in its CLT form: `model_kind:
cross_layer_transcoder`, and per layer i `W_enc_{i}.safetensors` {W_enc_i [d_transcoder, d_model] (gain folded,
transposed), b_enc_i, b_dec_i, threshold_i} and `W_dec_{i}.safetensors` {W_dec_i [d_transcoder, n_layers - i,
d_model]}. A CLT with a skip is refused (that form's skip layout is not one this writer knows).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Sequence, Union

import torch
import yaml
from safetensors.torch import load_file, save_file

from .._core.identity import PathLike
from .._core.model import HookedModel, model_name
from .clt import CrossLayerTranscoder
from .sae import Transcoder, input_hook, output_hook

CONFIG, INPUT_HOOK, OUTPUT_HOOK = "config.yaml", "mlp.hook_in", "mlp.hook_out"
THRESHOLD = "activation_function.threshold"
FORMAT = "sprout-circuit-tracer"
_THRESHOLD_KINDS = ("jumprelu", "batchtopk", "matryoshka")
_PAD_THRESHOLD = 1.0  # padded latents: pre-activation 0, never above it


def _ln2_gain(model: HookedModel, layer: int) -> torch.Tensor:
    """The gain [d_model] of block `layer`'s ln2, refused where it cannot be folded (none, a zero, a bias)."""
    block = model.blocks[layer]
    norm = getattr(block, "norm2", None) or getattr(block, "ln2", None)
    gain, bias = getattr(norm, "weight", None), getattr(norm, "bias", None)
    if not isinstance(gain, torch.Tensor):
        raise ValueError(f"block {layer} of {model_name(model)} has no ln2 gain to fold into circuit-tracer's mlp.hook_in")
    if isinstance(bias, torch.Tensor) and bool(bias.any()):
        raise ValueError(f"block {layer}'s ln2 has a bias: circuit-tracer's transcoders read mlp.hook_in through a "
                         "linear encoder, and only a gain folds into one (this writer folds gains only)")
    if bool((gain == 0).any()):
        raise ValueError(f"block {layer}'s ln2 gain has a zero: its input coordinate cannot be recovered from mlp.hook_in")
    return gain.detach().float().cpu()


def _check_set(transcoders: Sequence[Transcoder], model: HookedModel) -> list[Transcoder]:
    if isinstance(transcoders, (str, bytes)) or not hasattr(transcoders, "__iter__"):
        raise TypeError(f"transcoders must be a list of interp.Transcoder, got {type(transcoders).__name__}")
    tcs = list(transcoders)
    if not tcs or not all(isinstance(t, Transcoder) for t in tcs):
        raise TypeError("transcoders must be a list of interp.Transcoder, one per block, in block order")
    n = int(model.cfg.n_layers)
    layers = [t.layer for t in tcs]
    if layers != list(range(n)):
        raise ValueError(f"circuit-tracer reads one transcoder for each block 0..{n - 1} of {model_name(model)}; "
                         f"got transcoders for blocks {layers}")
    for layer, t in enumerate(tcs):
        if t.kind == "topk":
            raise ValueError(f"the transcoder of block {layer} is TopK: circuit-tracer's loader knows ReLU and JumpReLU "
                             "only, and the k largest latents of a row have no threshold form, so it cannot be written "
                             "exactly; train a threshold kind (kind='batchtopk' or 'jumprelu') for circuit-tracer")
        if (t.hook_name, t.hook_name_out) != (input_hook(layer), output_hook(layer)):
            raise ValueError(f"the transcoder of block {layer} reads {t.hook_name!r} and writes {t.hook_name_out!r}; "
                             f"circuit-tracer's sets replace MLPs ({input_hook(layer)!r} -> {output_hook(layer)!r})")
        t.check_model(model, f"the transcoder of block {layer}")
    return tcs


def _layer_tensors(t: Transcoder, gain: torch.Tensor, width: int, skip: bool) -> dict[str, torch.Tensor]:
    """One layer's file: encoder transposed with the gain folded in, padded to `width` latents."""
    pad = width - t.d_sae
    w_enc = (t.W_enc.detach().float().cpu() / gain[:, None]).T
    out = {"W_enc": torch.cat([w_enc, w_enc.new_zeros(pad, t.d_in)]),
           "b_enc": torch.cat([t.b_enc.detach().float().cpu(), torch.zeros(pad)]),
           "W_dec": torch.cat([t.W_dec.detach().float().cpu(), torch.zeros(pad, t.d_out)]),
           "b_dec": t.b_dec.detach().float().cpu()}
    if t.kind in _THRESHOLD_KINDS:
        thr = t.threshold.detach().float().cpu().clamp_min(0) if t.threshold is not None else torch.zeros(t.d_sae)
        out[THRESHOLD] = torch.cat([thr, torch.full((pad,), _PAD_THRESHOLD)])
    if skip:
        w_skip = t.W_skip.detach().float().cpu() if t.W_skip is not None else torch.zeros(t.d_out, t.d_in)
        out["W_skip"] = w_skip / gain[None, :]
    return {k: v.contiguous() for k, v in out.items()}


def _save_clt(clt: CrossLayerTranscoder, folder: Path, model: HookedModel, scan: Optional[str]) -> Path:
    """A cross-layer transcoder in circuit-tracer's CLT form (module docstring)."""
    if clt.skip:
        raise ValueError("this cross-layer transcoder has a skip: its circuit-tracer form is written without one only")
    clt.check_model(model)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(clt.n_layers):
        gain = _ln2_gain(model, i)
        enc = {f"W_enc_{i}": (clt.W_enc[i].detach().float().cpu() / gain[:, None]).T,
               f"b_enc_{i}": clt.b_enc[i].detach().float().cpu(), f"b_dec_{i}": clt.b_dec[i].detach().float().cpu(),
               f"threshold_{i}": clt.threshold[i].detach().float().cpu().clamp_min(0)}
        save_file({k: v.contiguous() for k, v in enc.items()}, str(folder / f"W_enc_{i}.safetensors"))
        save_file({f"W_dec_{i}": clt.W_dec[i].detach().float().cpu().contiguous()}, str(folder / f"W_dec_{i}.safetensors"))
    record = {"format": FORMAT, "version": 1, "input": "ln2.hook_normalized, ln2's gain folded into W_enc",
              "kind": clt.kind, "d_sae": clt.d_sae}
    config = {"model_kind": "cross_layer_transcoder", "model_name": model_name(model), "scan": scan or model_name(model),
              "feature_input_hook": INPUT_HOOK, "feature_output_hook": OUTPUT_HOOK, "sprout": record}
    (folder / CONFIG).write_text(yaml.safe_dump(config, sort_keys=False))
    return folder


def save_circuit_tracer(transcoders: Union[Sequence[Transcoder], CrossLayerTranscoder], folder: PathLike,
                        model: HookedModel, scan: Optional[str] = None) -> Path:
    """Write a set of transcoders, one per block of `model`, as circuit-tracer's transcoder folder.

    Args:
        transcoders: one `Transcoder` for each block 0..n_layers-1, in order (ReLU or a threshold kind), or a
            `CrossLayerTranscoder` (written in circuit-tracer's CLT form).
        folder: the folder to write (created; files of the same names are replaced).
        model: the model they were trained on: its ln2 gains are folded into the encoders.
        scan: circuit-tracer's name for the set (default: the model's name).

    Returns:
        The folder. circuit-tracer loads it with its own loader, e.g.
        `load_transcoder_set({l: f"{folder}/layer_{l}.safetensors" ...}, scan, "mlp.hook_in", "mlp.hook_out")`.

    Raises:
        ValueError: a TopK transcoder (no exact form there), a missing or extra block, transcoders of
            another model or hook, or an ln2 that cannot be folded (the message says which).
    """
    if isinstance(transcoders, CrossLayerTranscoder):
        return _save_clt(transcoders, Path(folder), model, scan)
    tcs = _check_set(transcoders, model)
    width, skip = max(t.d_sae for t in tcs), any(t.skip for t in tcs)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for layer, t in enumerate(tcs):
        save_file(_layer_tensors(t, _ln2_gain(model, layer), width, skip), str(folder / f"layer_{layer}.safetensors"))
    record = {"format": FORMAT, "version": 1, "input": "ln2.hook_normalized, ln2's gain folded into W_enc and W_skip",
              "layers": [{"kind": t.kind, "k": t.k, "widths": t.widths, "d_sae": t.d_sae, "skip": t.skip} for t in tcs]}
    config = {"model_kind": "transcoder_set", "model_name": model_name(model), "scan": scan or model_name(model),
              "feature_input_hook": INPUT_HOOK, "feature_output_hook": OUTPUT_HOOK, "sprout": record}
    (folder / CONFIG).write_text(yaml.safe_dump(config, sort_keys=False))
    return folder


def _read_config(folder: Path) -> dict:
    path = folder / CONFIG
    if not path.is_file():
        raise FileNotFoundError(f"no circuit-tracer transcoder set at {folder}: {CONFIG} is missing")
    config = yaml.safe_load(path.read_text())
    if not isinstance(config, dict) or config.get("model_kind") != "transcoder_set":
        raise ValueError(f"{path}: field 'model_kind' must be 'transcoder_set' (per-layer transcoders)")
    hooks = (config.get("feature_input_hook"), config.get("feature_output_hook"))
    if hooks[0] not in (INPUT_HOOK, "ln2.hook_normalized") or hooks[1] not in (OUTPUT_HOOK, "hook_mlp_out"):
        raise ValueError(f"{path}: transcoders from {hooks[0]!r} to {hooks[1]!r}; readable here are those from the MLP's "
                         "input (mlp.hook_in or ln2.hook_normalized) to its output (mlp.hook_out or hook_mlp_out)")
    return config


def _transcoder(layer: int, tensors: dict, meta: dict, gain: Optional[torch.Tensor]) -> Transcoder:
    d_sae = int(meta.get("d_sae", tensors["b_enc"].shape[0]))
    threshold = tensors.get(THRESHOLD)
    kind = meta.get("kind", "jumprelu" if threshold is not None else "relu")
    w_enc = tensors["W_enc"][:d_sae].T.float()
    w_skip = tensors.get("W_skip")
    skip = bool(meta.get("skip", w_skip is not None))
    if gain is not None:
        w_enc = w_enc * gain[:, None]
        w_skip = None if w_skip is None else w_skip.float() * gain[None, :]
    tc = Transcoder(w_enc.shape[0], d_sae, tensors["b_dec"].shape[0], kind=kind, k=meta.get("k"),
                    widths=meta.get("widths"), skip=skip, layer=layer)
    with torch.no_grad():
        tc.W_enc.copy_(w_enc)
        tc.b_enc.copy_(tensors["b_enc"][:d_sae])
        tc.W_dec.copy_(tensors["W_dec"][:d_sae])
        tc.b_dec.copy_(tensors["b_dec"])
        if tc.threshold is not None and threshold is not None:
            tc.threshold.copy_(threshold[:d_sae])
        if tc.W_skip is not None and w_skip is not None:
            tc.W_skip.copy_(w_skip)
    return tc.eval()


def load_circuit_tracer(folder: PathLike, model: HookedModel) -> list[Transcoder]:
    """The transcoders of a circuit-tracer transcoder folder (ours or theirs), one per block of `model`.

    Reads `config.yaml` and `layer_{l}.safetensors`; unfolds ln2's gain where the set reads `mlp.hook_in`;
    a JumpReLU layer comes back as "jumprelu" (or the kind our record names), a layer without threshold as
    "relu"; padding latents of our own sets are trimmed.

    Raises:
        FileNotFoundError: no config.yaml, or a layer file missing.
        ValueError: another kind of set, other hooks, or layers that do not match `model`.
    """
    if not isinstance(folder, (str, os.PathLike)):
        raise TypeError(f"load_circuit_tracer: folder must be a path, got {type(folder).__name__}")
    folder = Path(folder)
    config = _read_config(folder)
    record = config.get("sprout")
    metas = (record.get("layers") if isinstance(record, dict) else None) or []
    fold = config["feature_input_hook"] == INPUT_HOOK
    out = []
    for layer in range(int(model.cfg.n_layers)):
        path = folder / f"layer_{layer}.safetensors"
        if not path.is_file():
            raise FileNotFoundError(f"{folder} has no {path.name}: circuit-tracer's set needs one file per block")
        meta = metas[layer] if layer < len(metas) and isinstance(metas[layer], dict) else {}
        tc = _transcoder(layer, load_file(str(path)), meta, _ln2_gain(model, layer) if fold else None)
        tc.check_model(model, f"the transcoder in {path}")
        out.append(tc)
    return out
