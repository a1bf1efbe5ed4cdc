"""The stamps of the tables shipped beside a demo's weights (the phase tables): `artifacts.json` records,
per table, the fingerprint of the weights it was measured on and the file's SHA-256, so a table measured
on other weights, or edited since, is refused on load, as a stale tuned lens or dictionary is.

The tuned lens and the dictionaries carry their fingerprint in their own JSON (`tuned_lens.json`,
`saes/*/cfg.json`); `shipped_artifacts` lists every artifact of a demo folder with the fingerprint it
claims, which `tests/experiments/test_shipped_artifacts.py` compares with the weights'.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pandas as pd

from interp import fingerprint
from sprout.files import file_in, read_bounded, replace_file
from sprout.files.weightfiles import read_json_file

STAMPS = "artifacts.json"
TABLES = ("induction_snapshots.csv", "phase_snapshots.csv")  # the stamped tables a demo may ship
REBUILD = "rebuild it from the weights: python -m experiments.ship NAME --only phase --run RUN"


def sha256(path: Path) -> str:
    return hashlib.sha256(read_bounded(path, path.name, limit=1 << 30)).hexdigest()


def stamps(folder: Path) -> dict:
    """{table file: {"fingerprint", "sha256"}} of a folder ({} where it has no artifacts.json)."""
    path = Path(folder) / STAMPS
    return read_json_file(path) if path.exists() else {}


def stamp_tables(folder: Path, files: list[str], model) -> Path:
    """Record, for each table file of `folder`, the weights' fingerprint and the file's SHA-256."""
    folder = Path(folder)
    entries = stamps(folder)
    fp = fingerprint(model)
    for name in files:
        entries[name] = {"fingerprint": fp, "sha256": sha256(file_in(folder, name, "table"))}
    return replace_file(folder / STAMPS, (json.dumps(entries, indent=1, sort_keys=True) + "\n").encode())


def read_shipped_table(folder: Path, name: str, model) -> pd.DataFrame:
    """A table shipped beside `model`'s weights in `folder`.

    Raises:
        ValueError: the table is not stamped, was measured on other weights, or changed since it was stamped.
    """
    path = file_in(folder, name, "table")
    entry = stamps(folder).get(name)
    if not isinstance(entry, dict) or not {"fingerprint", "sha256"} <= set(entry):
        raise ValueError(f"{path}: not stamped in {Path(folder) / STAMPS}, so nothing says which weights it was "
                         f"measured on; {REBUILD}")
    if entry["fingerprint"] != fingerprint(model):
        raise ValueError(f"{path} was measured on other weights (fingerprint {entry['fingerprint']}, these are "
                         f"{fingerprint(model)}): a stale table; {REBUILD}")
    if entry["sha256"] != sha256(path):
        raise ValueError(f"{path} changed since it was stamped (SHA-256 differs from {STAMPS}); {REBUILD}")
    return pd.read_csv(path)


def shipped_artifacts(folder: Path) -> dict[str, str]:
    """{artifact (path relative to the folder): the weights' fingerprint it claims}: the tuned lens, every
    dictionary, every stamped table, and any table that ships unstamped (claiming "")."""
    folder = Path(folder)
    found = {}
    if (folder / "tuned_lens.json").is_file():
        found["tuned_lens.json"] = str(read_json_file(folder / "tuned_lens.json").get("fingerprint", ""))
    for cfg in sorted(folder.glob("saes/*/cfg.json")):
        meta = read_json_file(cfg).get("metadata", {}).get("sprout", {})
        found[str(cfg.relative_to(folder))] = str(meta.get("model_fingerprint", ""))
    table_stamps = stamps(folder)
    for name in TABLES:
        if (folder / name).exists():
            found[name] = str(table_stamps.get(name, {}).get("fingerprint", ""))
    return found
