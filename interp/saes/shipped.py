"""The dictionaries shipped with the demo models, found by the weights' fingerprint (as `load_tuned_lens`
finds a demo's tuned lens): `sprout/demo/<name>/saes/<hook>/` for an SAE, `.../saes/transcoder-<layer>/`
for the skip transcoder of block `layer`, `.../saes/transcoder-<layer>-noskip/` for the one without a skip,
each a folder of `files`' layout, and `.../saes/clt/` for the cross-layer transcoder (`clt_files`' layout)."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional, Union, cast

from .._core.identity import PathLike, fingerprint
from .._core.model import HookedModel, model_name, require_hooks
from . import clt_files
from .clt import CrossLayerTranscoder
from .files import CFG, is_ours
from .sae import SAE, Transcoder

CLT = "clt"  # the cross-layer transcoder's folder inside saes/


def shipped_folder(root: PathLike, hook: Optional[str] = None, layer: Optional[int] = None, skip: bool = True) -> Path:
    """Where a demo ships its dictionaries: `<root>/saes/<hook>/` for an SAE, `<root>/saes/transcoder-<layer>/`
    for the skip transcoder of block `layer`, `transcoder-<layer>-noskip/` for the one without (root: the
    demo's folder, e.g. sprout/demo/gpt-4)."""
    if (hook is None) == (layer is None):
        raise ValueError("give one of hook= (an SAE) or layer= (a transcoder)")
    if hook is not None:
        return Path(root) / "saes" / hook
    return Path(root) / "saes" / f"transcoder-{int(cast(int, layer))}{'' if skip else '-noskip'}"  # one of the two: checked above


def shipped_clt_folder(root: PathLike) -> Path:
    """Where a demo ships its cross-layer transcoder: `<root>/saes/clt/` (root: the demo's folder)."""
    return Path(root) / "saes" / CLT


def run_roots(root: PathLike) -> list[Path]:
    """The folders to look in for dictionaries saved beside a model: `root`; for a `sprout train` run folder also
    its latest checkpoint (`root/checkpoints/step_*`); for a checkpoint inside a run (`RUN/checkpoints/step_*`)
    also the run folder. So `RUN/saes/<hook>/` and `RUN/checkpoints/step_N/saes/<hook>/` are both found."""
    from sprout.files import latest_checkpoint

    root = Path(root)
    found = [root]
    if (root / "checkpoints").is_dir() and (latest := latest_checkpoint(root)) is not None:
        found.append(latest)
    if root.parent.name == "checkpoints" and root.name.startswith("step_"):
        found.append(root.parent.parent)
    return found


def _find(model: HookedModel, root, name_of, what: str, expect: type[Union[SAE, CrossLayerTranscoder]],
          ours=is_ours) -> Union[SAE, CrossLayerTranscoder]:
    from sprout.files import demo_dir

    roots = run_roots(root) if root is not None else sorted(p for p in demo_dir().iterdir() if p.is_dir())
    mine = fingerprint(model)
    for r in roots:
        folder = name_of(r)
        if (folder / CFG).is_file() and ours(folder):
            fp = json.loads((folder / CFG).read_text())["metadata"]["sprout"].get("model_fingerprint")
            if fp == mine:
                return expect.load(folder, model=model)
    where = root if root is not None else f"{demo_dir()}/*"
    raise FileNotFoundError(f"no shipped {what} for this {model_name(model)} (fingerprint {mine}) in {where}: none of "
                            f"the folders {name_of(Path(str(where)))} matches; train one with interp.train_sae / "
                            "interp.train_transcoder / interp.train_clt")


def load_sae(model: HookedModel, hook: str, root: Optional[PathLike] = None) -> SAE:
    """The SAE shipped for this model (found by its weights' fingerprint) at hook point `hook`.

    Looks in every demo folder (or in `root`: a demo-like folder, a `sprout train` run folder or one of its
    checkpoints, see `run_roots`) for `saes/<hook>/`.

    Raises:
        FileNotFoundError: none shipped for these weights at this hook (the message says where it looked).
    """
    if not isinstance(hook, str):
        raise TypeError(f"hook must be a hook name such as 'blocks.0.hook_resid_post', got {hook!r}")
    require_hooks(model, [hook])
    return cast(SAE, _find(model, root, lambda r: shipped_folder(r, hook=hook), f"SAE at {hook!r}", SAE))


def load_transcoder(model: HookedModel, layer: int, root: Optional[PathLike] = None, skip: bool = True) -> Transcoder:
    """The transcoder shipped for this model's MLP in block `layer`: with a skip (`saes/transcoder-<layer>/`),
    or without one (`skip=False`: `saes/transcoder-<layer>-noskip/`)."""
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < int(model.cfg.n_layers):
        raise ValueError(f"layer must be a block of {model_name(model)} (0..{int(model.cfg.n_layers) - 1}), got {layer!r}")
    # load(expect=Transcoder) refuses anything else
    what = f"transcoder for layer {layer}" + ("" if skip else " without a skip")
    return cast(Transcoder, _find(model, root, lambda r: shipped_folder(r, layer=layer, skip=skip), what, Transcoder))


def load_clt(model: HookedModel, root: Optional[PathLike] = None) -> CrossLayerTranscoder:
    """The cross-layer transcoder shipped for this model (`saes/clt/`, found by its weights' fingerprint as
    `load_transcoder` finds a per-layer one; `root` as in `load_sae`).

    Raises:
        FileNotFoundError: none shipped for these weights (the message says where it looked).

    Example:
        >>> clt = interp.load_clt(sprout.load("gpt-4"))                                   # doctest: +SKIP
    """
    if root is not None and not isinstance(root, (str, os.PathLike)):
        raise TypeError(f"root must be a folder (a path), got {type(root).__name__}")
    return cast(CrossLayerTranscoder, _find(model, root, shipped_clt_folder, "cross-layer transcoder",
                                            CrossLayerTranscoder, clt_files.is_ours))
