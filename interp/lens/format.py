"""The tuned-lens package's folder (Belrose et al.'s `tuned_lens`, 0.2), written and read for our lenses.

Its `TunedLens.save(path)` writes a folder with

    config.json   TunedLensConfig: base_model_name_or_path, d_model, num_hidden_layers, bias,
                  base_model_revision, unembed_hash, lens_type ("linear_tuned_lens")
    params.pt     the translators' state dict, {"{i}.weight": [d_model, d_model], "{i}.bias": [d_model]}
                  for i < num_hidden_layers (torch.save of plain tensors)

and its translator i maps the stream before block i to h + W_i h + b_i: our `TunedLens`' translator i, at
`lens_sites(model)[i]` (the embedding's output, then each block's output but the last). So converting is a
renaming of keys (`translators.{i}.weight` <-> `{i}.weight`); the numbers are the same tensors. Their
`from_unembed_and_pretrained(unembed, folder)` reads what `save_tuned_lens_format` writes; `TunedLens.load`
reads theirs (with `weights_only=True`: the file holds tensors only). Their files record no fingerprint of
the model, so a lens read from one is checked against the model's shapes alone.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Union

import torch

from sprout.files import check_floating, warn_non_finite

CONFIG, PARAMS, LENS_TYPE = "config.json", "params.pt", "linear_tuned_lens"


def is_tuned_lens_folder(path: Union[str, os.PathLike]) -> bool:
    """Whether `path` is a folder of the tuned-lens package's layout (config.json + params.pt)."""
    path = Path(path)
    return path.is_dir() and (path / CONFIG).is_file() and (path / PARAMS).is_file()


def save_tuned_lens_format(lens: Any, folder: Union[str, os.PathLike]) -> Path:
    """Write `lens` (an `interp.TunedLens`) as the tuned-lens package's folder; returns the params.pt path."""
    folder = Path(folder)
    if folder.suffix == ".safetensors" or (folder.exists() and not folder.is_dir()):
        raise ValueError(f"format='tuned-lens' writes a folder (config.json + params.pt); {folder} is not one")
    folder.mkdir(parents=True, exist_ok=True)
    n = len(lens.translators)
    state = {k.removeprefix("translators."): v.detach().cpu().contiguous().clone() for k, v in lens.state_dict().items()}
    config = {"base_model_name_or_path": str(lens.config.get("name") or "sprout"), "d_model": int(state["0.weight"].shape[0]),
              "num_hidden_layers": n, "bias": True, "base_model_revision": lens.model_fingerprint, "unembed_hash": None,
              "lens_type": LENS_TYPE}
    torch.save(state, folder / PARAMS)
    (folder / CONFIG).write_text(json.dumps(config, indent=1) + "\n")
    return folder / PARAMS


def load_tuned_lens_format(lens: Any, folder: Union[str, os.PathLike]) -> Any:
    """Fill `lens` (a fresh `TunedLens(model)`) with the translators of a tuned-lens package folder.

    Raises:
        ValueError: a config that is not a linear tuned lens, or translators of another count or width
            than the model's (the message names the field or the key).
    """
    folder = Path(folder)
    config = json.loads((folder / CONFIG).read_text())
    if not isinstance(config, dict) or config.get("lens_type", LENS_TYPE) != LENS_TYPE:
        raise ValueError(f"{folder / CONFIG}: field 'lens_type' must be {LENS_TYPE!r}")
    n, d = len(lens.translators), int(lens.state_dict()["translators.0.weight"].shape[0])
    if (config.get("num_hidden_layers"), config.get("d_model")) != (n, d):
        raise ValueError(f"{folder / CONFIG}: num_hidden_layers {config.get('num_hidden_layers')!r} and d_model "
                         f"{config.get('d_model')!r}, but this model's lens has {n} translators of width {d}")
    state = torch.load(folder / PARAMS, map_location="cpu", weights_only=True)
    if not config.get("bias", True):
        state.update({f"{i}.bias": torch.zeros(d) for i in range(n)})
    want = {k.removeprefix("translators.") for k in lens.state_dict()}
    if not isinstance(state, dict) or set(state) != want:
        got = sorted(state)[:4] if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"{folder / PARAMS} holds {got}, not the translators {sorted(want)[:4]}...")
    check_floating(state, folder / PARAMS)
    warn_non_finite(state, folder / PARAMS)
    lens.load_state_dict({f"translators.{k}": v for k, v in state.items()})
    lens.info = {"source": f"tuned-lens folder {folder}"}
    return lens
