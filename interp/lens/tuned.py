"""The tuned lens: the logit lens with one learned affine translator per layer (Belrose et al. 2023).

Early layers write in a basis the unembedding does not read, so the logit lens says little before the
last block. The tuned lens maps the stream at layer l to h + A_l h + b_l (A_l, b_l zero at the start,
so an untrained lens is the logit lens), then reads it through the model's own final norm and output
layer. A lens belongs to one model: it records the model's config and a fingerprint of its weights,
and refuses to load for any other. Training is in `interp.lens.train`.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import stat
from pathlib import Path
from typing import Iterable, Optional, cast

import pandas as pd
import torch
import torch.nn as nn
from jaxtyping import Float
from safetensors import safe_open
from safetensors.torch import load as safetensors_load
from safetensors.torch import save as safetensors_bytes

from sprout.files import check_floating, file_in, read_json_file, regular_file, warn_non_finite
from sprout.files.file_sets import current_file, replace_files

from .._core.batching import TextOrTokens, batches, token_rows
from .._core.identity import PathLike, check_once, fingerprint, model_config
from .._core.model import HookedModel, logits_of, model_name, require_hooks
from ..measures import unigram_log_probs
from .format import is_tuned_lens_folder, load_tuned_lens_format, save_tuned_lens_format
from .logit import _lens_batches, lens_frame, lens_sites

FORMAT = "sprout-tuned-lens"
WEIGHTS, META = "tuned_lens.safetensors", "tuned_lens.json"

class TunedLens(nn.Module):
    """One affine translator per layer boundary the logit lens reads, for one model.

    Translator i maps the stream at `lens_sites(model)[i]` (i = 0: after the embedding); the last site
    is the model's output, read as it is, so the lens has len(sites) - 1 translators, each
    resid [..., d_model] -> resid + resid @ A_i^T + b_i.

    Attributes:
        sites / layers: the hook names read and their layer numbers, as in `logit_lens`.
        config / model_fingerprint: the model the lens belongs to.
        info: what training recorded (data, steps, recipe, held_out_kl per layer).
        step: optimizer steps taken; optimizer_state: SGD's state, to resume training.
    """

    def __init__(self, model: HookedModel) -> None:
        super().__init__()
        require_hooks(model, [])  # a model that is not hooked at all: say so before reading its config
        sites = lens_sites(model)
        self.sites, self.layers = [name for _, name in sites], [layer for layer, _ in sites]
        require_hooks(model, self.sites)
        d = int(model.cfg.d_model)
        self.translators = nn.ModuleList(nn.Linear(d, d) for _ in self.sites[:-1])
        for t in cast("Iterable[nn.Linear]", self.translators):
            nn.init.zeros_(t.weight)
            nn.init.zeros_(t.bias)
        self.config = model_config(model)
        self.model_fingerprint: Optional[str] = fingerprint(model)  # None: a lens file that records none
        self.info: dict = {}
        self.step = 0
        self.optimizer_state: Optional[dict] = None

    def forward(self, index: int, resid: Float[torch.Tensor, "*batch d_model"]) -> Float[torch.Tensor, "*batch d_model"]:
        """The stream at site `index` [..., d_model] as the tuned lens reads it (same shape)."""
        if index == len(self.translators):
            return resid
        t = cast(nn.Linear, self.translators[index])
        return resid + t(resid.to(t.weight.dtype)).to(resid.dtype)

    def check_model(self, model: HookedModel, source: str = "this tuned lens") -> None:
        """Raise a ValueError naming the mismatch if `model` is not the one the lens was trained for.

        Checked once per model and state of its weights (`interp._core.identity.check_once`): a
        `tuned_lens` call after the first hashes nothing; an in-place edit of a weight checks again."""
        what = ("tuned lens", repr(sorted(self.config.items())), self.model_fingerprint)
        check_once(model, what, lambda: self._check_model(model, source))

    def _check_model(self, model: HookedModel, source: str) -> None:
        theirs = model_config(model)
        diff = [f"{k}: lens {self.config.get(k)!r}, model {theirs.get(k)!r}"
                for k in sorted(set(self.config) | set(theirs)) if self.config.get(k) != theirs.get(k)]
        if diff:
            raise ValueError(f"{source} was trained for another model: config differs ({'; '.join(diff)})")
        mine = fingerprint(model)
        if mine != self.model_fingerprint:
            raise ValueError(f"{source} was trained for another model: weights fingerprint {self.model_fingerprint}, "
                             f"this {model_name(model)}'s is {mine} (same config, other weights)")

    def meta(self) -> dict:
        return {"format": FORMAT, "version": 1, "model_config": self.config, "fingerprint": self.model_fingerprint,
                "sites": self.sites, "layers": self.layers, "step": self.step, **self.info}

    def save(self, path: PathLike, format: str = "sprout") -> Path:
        """Write the translators (safetensors) and a small JSON beside them; returns the .safetensors path.

        `format="tuned-lens"` writes the tuned-lens package's folder instead (config.json + params.pt,
        `interp.lens.format`), which its `TunedLens.from_unembed_and_pretrained` reads; returns params.pt.

        `path` is a directory (gets tuned_lens.safetensors + tuned_lens.json) or a .safetensors file
        (the JSON gets the same name with .json). Each file is written atomically, and the JSON records
        the weights' sha256. The two are switched as one (`sprout.files.file_sets.replace_files`): a save killed
        at any point leaves the old lens or the new one, which `load` reads, never a mix. An
        existing file is replaced only when both files there are a tuned lens of ours (`check_save_target`).
        """
        if format == "tuned-lens":
            return save_tuned_lens_format(self, path)
        if format != "sprout":
            raise ValueError(f"format must be 'sprout' or 'tuned-lens', got {format!r}")
        weights, meta = check_save_target(path)
        weights.parent.mkdir(parents=True, exist_ok=True)
        tensors = {k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()}
        data = safetensors_bytes(tensors, metadata={"format": FORMAT})
        record = {**self.meta(), "weights_sha256": hashlib.sha256(data).hexdigest()}
        text = (json.dumps(_finite(record), indent=1, allow_nan=False) + "\n").encode()
        replace_files({weights: data, meta: text})
        return weights

    @classmethod
    def load(cls, model: HookedModel, path: PathLike) -> "TunedLens":
        """The lens saved at `path` (a directory or its .safetensors file), checked against `model`.

        A folder of the tuned-lens package's layout (config.json + params.pt) is read as theirs. Both
        files must be regular files in the lens' folder; the JSON's fields are checked by type, the
        tensors must be the model's translators in floating point (NaN or inf is warned about, as for
        model weights).

        Raises:
            FileNotFoundError: no lens there. ValueError: an unreadable lens, or one for another model
            (the message names the config field or the fingerprint that differs).
        """
        if is_tuned_lens_folder(path):  # the tuned-lens package's config.json + params.pt
            return load_tuned_lens_format(cls(model), path)
        weights, meta_path = _current_paths(Path(path))
        for f in (weights, meta_path):
            if not os.path.lexists(f):
                raise FileNotFoundError(f"no tuned lens at {path}: {f} is missing")
            file_in(f.parent, f.name, "tuned-lens file")
        meta = read_json_file(meta_path, "tuned-lens file", fields=META_FIELDS)
        if meta.get("format") != FORMAT:
            raise ValueError(f"{meta_path} is not a tuned lens (no \"format\": \"{FORMAT}\")")
        if meta.get("version", 1) != 1:
            raise ValueError(f"{meta_path}: field 'version' is {meta['version']!r}; this sprout reads version 1")
        lens = cls(model)
        lens.config, lens.model_fingerprint = meta.get("model_config", {}), meta.get("fingerprint")
        lens.check_model(model, f"the tuned lens at {weights}")
        tensors = _read_translators(weights, meta)
        own = lens.state_dict()
        if set(tensors) != set(own) or any(tensors[k].shape != own[k].shape for k in own):
            raise ValueError(f"{weights} holds {sorted(tensors)[:4]}..., not this model's "
                             f"{len(lens.translators)} translators of d_model {model.cfg.d_model}")
        lens.load_state_dict(tensors)
        lens.step = meta.get("step", 0)
        lens.info = {k: v for k, v in meta.items() if k not in _OWN_KEYS}
        return lens


_OWN_KEYS = ("format", "version", "model_config", "fingerprint", "sites", "layers", "step", "weights_sha256")
# The JSON fields a load reads, and their types (a tampered file is named by its field, never half-read).
META_FIELDS = {"format": "str", "version": "int", "model_config": "dict", "fingerprint": "str", "sites": "list",
               "layers": "list", "step": "int", "weights_sha256": "str"}


def _read_translators(weights: Path, meta: dict) -> dict[str, torch.Tensor]:
    """The lens' tensors: the bytes the JSON's sha256 names, floating point (refused as model weights are)."""
    data = weights.read_bytes()
    if "weights_sha256" in meta and hashlib.sha256(data).hexdigest() != meta["weights_sha256"]:
        raise ValueError(f"{weights} is not the file its {META} was saved with (sha256 differs): a save that was "
                         "interrupted, or files from two lenses; train or save the lens again")
    try:
        tensors = safetensors_load(data)
    except Exception as e:  # safetensors raises its own error types for truncated or foreign files
        raise ValueError(f"cannot read {weights}: {e}") from e
    check_floating(tensors, weights)
    warn_non_finite(tensors, weights)
    return tensors


def _paths(path: Path) -> tuple[Path, Path]:
    if path.suffix == ".safetensors":
        return path, path.with_suffix(".json")
    return path / WEIGHTS, path / META


def _current_paths(path: Path) -> tuple[Path, Path]:
    """The (weights, JSON) files a reader reads: from the switch folder while a killed save's switch is unfinished."""
    weights, meta = _paths(path)
    return current_file(weights, weights), current_file(meta, weights)


def check_save_target(path: PathLike) -> tuple[Path, Path]:
    """The (weights, JSON) paths a lens saved at `path` writes, refused unless each is absent or a file of a
    tuned lens written here: a user's file is never replaced, even when the other file is ours.

    Raises:
        FileExistsError: naming the file that is not ours (a folder, a link, a pipe, another program's file).
    """
    weights, meta = _paths(Path(path))
    if os.path.lexists(path) and not Path(path).is_dir() and Path(path).suffix != ".safetensors":
        raise FileExistsError(f"{path} is a file: save a tuned lens into a folder or a .safetensors path")
    for f in (weights, meta):
        if os.path.lexists(f) and not (_regular(f) and (_is_ours(meta) if f == meta else _weights_ours(f))):
            raise FileExistsError(f"{f} exists and is not a tuned lens written here: not overwriting it")
    return weights, meta


def _regular(f: Path) -> bool:
    return not f.is_symlink() and stat.S_ISREG(os.stat(f).st_mode)


def _weights_ours(weights: Path) -> bool:
    try:
        with safe_open(str(regular_file(weights)), framework="pt") as f:
            return (f.metadata() or {}).get("format") == FORMAT
    except Exception:  # unreadable or not safetensors: not provably ours
        return False


def _is_ours(meta: Path) -> bool:
    try:
        return read_json_file(meta).get("format") == FORMAT
    except (OSError, ValueError):
        return False


def _finite(obj):
    """`obj` with NaN and inf floats as None (JSON has no NaN; a held-out KL can be NaN on empty data)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def load_tuned_lens(model: HookedModel, path: Optional[PathLike] = None) -> TunedLens:
    """The tuned lens for `model`: beside the checkpoint at `path` (a checkpoint folder or weights file, a
    training run's folder, or the lens itself), else the shipped lens of the demo whose weights these are.

    Raises:
        FileNotFoundError: no lens there / no demo lens for these weights (the message says where it looked).
        ValueError: a lens that is there belongs to another model.
    """
    from sprout.files import demo_dir, latest_checkpoint

    if path is not None:
        path = Path(path)
        places = [path] if path.suffix == ".safetensors" and path.name != "model.safetensors" else []
        places.append(path.parent if path.is_file() else path)
        if path.is_dir() and (path / "checkpoints").is_dir():
            last = latest_checkpoint(path)
            places += [] if last is None else [last]
        for place in places:
            if all(os.path.lexists(f) for f in _current_paths(place)):  # then `load` names a pipe or a link out
                return TunedLens.load(model, place)
        raise FileNotFoundError(f"no tuned lens beside {path} (looked for {WEIGHTS} + {META} in "
                                f"{', '.join(str(p) for p in places)})")
    mine = fingerprint(model)
    for meta in sorted(demo_dir().glob(f"*/{META}")):
        if _is_ours(meta) and read_json_file(meta).get("fingerprint") == mine:
            return TunedLens.load(model, meta.parent)
    raise FileNotFoundError(f"no tuned lens for this {model_name(model)} (fingerprint {mine}): none of the demo "
                            f"lenses in {demo_dir()}/*/{META} matches; pass the checkpoint's path, or train one "
                            "with interp.train_tuned_lens")


def _checked(model: HookedModel, lens) -> TunedLens:
    if not isinstance(lens, TunedLens):
        raise TypeError(f"lens must be an interp.TunedLens, got {type(lens).__name__}")
    lens.check_model(model)
    if lens.sites != [name for _, name in lens_sites(model)]:
        raise ValueError("the lens reads other sites than this model's lens sites")
    return lens


def tuned_lens(model: HookedModel, data: TextOrTokens, lens: TunedLens, k: int = 5, batch_size: int = 8,
               seq_len: Optional[int] = None, stats: bool = False) -> pd.DataFrame:
    """The tuned lens at every layer boundary and position: exactly `logit_lens`' frame (same columns).

    Args:
        model: the hooked model the lens was trained for.
        data: a text, a list of texts, or ids [pos] / [batch, pos].
        lens: a `TunedLens` for this model (`load_tuned_lens`, `train_tuned_lens`).
        k, batch_size, seq_len, stats: as in `logit_lens`.

    Example:
        >>> import torch, interp
        >>> from sprout import Sprout, SproutConfig
        >>> model = Sprout(SproutConfig(vocab_size=64, context=16, n_layer=2, n_head=2, d_model=32, d_ff=64))
        >>> lens = interp.TunedLens(model)  # zero translators: the logit lens
        >>> a, b = interp.tuned_lens(model, torch.arange(10), lens), interp.logit_lens(model, torch.arange(10))
        >>> a.columns.equals(b.columns), a.top_ids.equals(b.top_ids)
        (True, True)
    """
    lens = _checked(model, lens)
    with torch.inference_mode():
        return lens_frame(model, data, k, batch_size, False, seq_len, stats, lens)


def lens_comparison(model: HookedModel, data: TextOrTokens, lens: TunedLens, batch_size: int = 8, seq_len: Optional[int] = None,
                    by_seq: bool = False, unigram_fit: Optional[TextOrTokens] = None) -> pd.DataFrame:
    """The logit and the tuned lens side by side, per layer, on (held-out) data, beside a constant.

    The constant is the best single distribution: the unigram of the next tokens of `unigram_fit`
    (default: of `data` itself, the best constant for its cross-entropy; pass other held-out text to
    fit it out of sample), with add-1/2 smoothing so that no token has probability 0. It reads no layer,
    so its rows repeat one value at every layer: a lens that does not beat it at a layer says less there
    than token frequencies do.

    Returns:
        One row per (lens, layer) (per (seq, lens, layer) with `by_seq`): `lens` ("logit" / "tuned" /
        "unigram"), `layer`, `site`, `kl_to_final` (mean KL(output || lens), nats), `cross_entropy` (mean
        -log p of the actual next token, nats), `top1_agreement` (fraction of positions where the lens' top
        token is the output's), `n_positions`.

    Example:
        >>> import torch, interp
        >>> from sprout import Sprout, SproutConfig
        >>> model = Sprout(SproutConfig(vocab_size=64, context=16, n_layer=2, n_head=2, d_model=32, d_ff=64))
        >>> df = interp.lens_comparison(model, torch.randint(0, 64, (2, 16)), interp.TunedLens(model))
        >>> df.lens.tolist()
        ['logit', 'logit', 'logit', 'tuned', 'tuned', 'tuned', 'unigram', 'unigram', 'unigram']
    """
    lens = _checked(model, lens)
    rows = []
    with torch.inference_mode():
        for name, translator in (("logit", None), ("tuned", lens)):
            for b in _lens_batches(model, data, 1, batch_size, False, seq_len, True, translator):
                agree = b["top_ids"][..., 0] == b["top_ids"][-1:, ..., 0]  # [layer, batch, pos]
                for l, (layer, site) in enumerate(zip(b["layers"], b["sites"])):
                    for j, seq in enumerate(b["rows"]):
                        rows.append(dict(lens=name, seq=seq, layer=layer, site=site,
                                         kl=b["kl_to_final"][l, j].double().sum().item(),
                                         ce=-b["log_p_next"][l, j].double().sum().item(),
                                         agree=agree[l, j].sum().item(), n=agree.shape[-1],
                                         n_next=b["log_p_next"].shape[-1]))
        rows += _unigram_rows(model, data, unigram_fit, batch_size, seq_len)
    f = pd.DataFrame(rows)
    keys = ["lens", "seq", "layer", "site"] if by_seq else ["lens", "layer", "site"]
    g = f.groupby(keys, sort=True)[["kl", "ce", "agree", "n", "n_next"]].sum().reset_index()
    out = g[keys].assign(kl_to_final=g.kl / g.n, cross_entropy=g.ce / g.n_next.where(g.n_next > 0),
                         top1_agreement=g.agree / g.n, n_positions=g.n)
    return out.reset_index(drop=True)


def _unigram_rows(model: HookedModel, data, fit, batch_size: int, seq_len: Optional[int]) -> list[dict]:
    log_q = unigram_log_probs(model, data if fit is None else fit, 0.5, next_only=True, seq_len=seq_len)
    sites = lens_sites(model, False)
    rows = []
    for row_ids, ids in batches(token_rows(model, data, seq_len), batch_size, device=model.cfg.device):
        log_p = torch.log_softmax(logits_of(model, ids).double(), -1).cpu()  # [batch, pos, vocab]
        kl = (log_p.exp() * (log_p - log_q)).sum(-1)  # [batch, pos]
        ce = -log_q[ids[:, 1:].cpu()]  # [batch, pos - 1]
        agree = log_p.argmax(-1) == int(log_q.argmax())
        for j, seq in enumerate(row_ids):
            rows += [dict(lens="unigram", seq=seq, layer=layer, site=site, kl=kl[j].sum().item(), ce=ce[j].sum().item(),
                          agree=agree[j].sum().item(), n=ids.shape[1], n_next=ids.shape[1] - 1) for layer, site in sites]
    return rows
