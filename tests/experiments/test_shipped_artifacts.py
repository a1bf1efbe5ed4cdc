"""Every artifact shipped beside a demo's weights was made from those weights (issue 24, item 4): the tuned
lens, the dictionaries and the stamped phase tables each claim the weights' fingerprint, recomputed here
from the weights; no other file ships unaccounted for; a stale or edited table is refused on load."""
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

import sprout
from experiments import stamps
from interp._core.identity import fingerprint
from sprout.files import demo_dir, demo_names

BASE = {"config.json", "model.safetensors", "recipe.json", "tokenizer.json", "train_log.csv", stamps.STAMPS}
COMPANIONS = {"tuned_lens.json": "tuned_lens.safetensors"}  # the file beside the one that carries the stamp


@pytest.mark.parametrize("name", demo_names())
def test_every_shipped_artifact_claims_the_weights_it_ships_with(name):
    folder = demo_dir() / name
    fp = fingerprint(sprout.load(name))
    claimed = stamps.shipped_artifacts(folder)
    assert claimed and all(f == fp for f in claimed.values()), {a: f for a, f in claimed.items() if f != fp}
    accounted = set(BASE) | set(claimed) | {COMPANIONS[a] for a in claimed if a in COMPANIONS}
    accounted |= {a.replace("cfg.json", "sae_weights.safetensors") for a in claimed if a.startswith("saes/")}
    accounted |= {f"stages/{run}/{f}" for run in earlier_runs(folder) for f in ("recipe.json", "train_log.csv")}
    shipped = {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}
    assert shipped - accounted == set(), "files shipped with no stamp saying which weights they belong to"


def earlier_runs(folder):
    """The runs these weights continued, followed from the demo's recipe.json through each stage's `init`: their
    logs are the weights' history (as train_log.csv is), shipped in stages/<run>/ by sprout.training.ship."""
    runs, d = [], folder
    while (d / "recipe.json").is_file() and len(runs) < 16:
        init = json.loads((d / "recipe.json").read_text()).get("init", "")
        d = folder / "stages" / Path(init).name
        if not init or not (d / "train_log.csv").is_file():
            break
        runs.append(d.name)
    return runs


@pytest.mark.parametrize("name", [n for n in demo_names() if any((demo_dir() / n / t).exists() for t in stamps.TABLES)])
def test_stamped_tables_load_for_their_weights(name):
    model = sprout.load(name)
    for table in stamps.TABLES:
        if (demo_dir() / name / table).exists():
            got = stamps.read_shipped_table(demo_dir() / name, table, model)
            pd.testing.assert_frame_equal(got, pd.read_csv(demo_dir() / name / table))


@pytest.fixture
def stamped(tmp_path):
    model = sprout.load("gpt-1")
    pd.DataFrame({"tokens": [0, 10], "value": [0.1, 0.9]}).to_csv(tmp_path / "phase_snapshots.csv", index=False)
    stamps.stamp_tables(tmp_path, ["phase_snapshots.csv"], model)
    return tmp_path, model


def test_a_table_is_read_only_for_the_weights_it_was_measured_on(stamped):
    folder, model = stamped
    assert stamps.read_shipped_table(folder, "phase_snapshots.csv", model)["value"].tolist() == [0.1, 0.9]
    with pytest.raises(ValueError, match="other weights"):
        stamps.read_shipped_table(folder, "phase_snapshots.csv", sprout.load("gpt-4"))


def test_an_edited_or_unstamped_table_is_refused(stamped):
    folder, model = stamped
    shutil.copy(folder / "phase_snapshots.csv", folder / "induction_snapshots.csv")
    with pytest.raises(ValueError, match="not stamped"):
        stamps.read_shipped_table(folder, "induction_snapshots.csv", model)
    with open(folder / "phase_snapshots.csv", "a") as f:
        f.write("20,0.95\n")
    with pytest.raises(ValueError, match="changed since"):
        stamps.read_shipped_table(folder, "phase_snapshots.csv", model)
    (folder / stamps.STAMPS).write_text(json.dumps({"phase_snapshots.csv": "ec43"}))
    with pytest.raises(ValueError, match="not stamped"):
        stamps.read_shipped_table(folder, "phase_snapshots.csv", model)
