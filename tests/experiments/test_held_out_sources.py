"""experiments.held_out_sources: each shipped transcoder measured on each held-out source of its demo alone."""
from pathlib import Path

import pandas as pd
import pytest

import interp
import sprout
from experiments import held_out_sources as hs
from experiments import readme, ship
from experiments.ship_targets import BaselineFits
from experiments.shipped_dictionaries import KINDS, with_se

ROOT = Path(__file__).resolve().parents[2]
FIT_CHARS = 40_000  # the baselines' fit, shorter than the shipping run's: the same code, a tenth of the time


@pytest.fixture(scope="module")
def gpt4():
    """gpt-4's dictionary texts, held-out sources among them, built once (a build reads the whole corpus)."""
    return hs.english_texts("gpt-4")


@pytest.fixture
def quick(gpt4, monkeypatch):
    texts, vals = gpt4, gpt4["held_sources"]
    monkeypatch.setattr(ship, "demo_texts", lambda name, r: texts)
    monkeypatch.setattr(ship, "BASELINE_FIT_CHARS", FIT_CHARS)  # what ship.baseline_fits reads
    return vals, BaselineFits(sprout.load("gpt-4").eval(), ship.train_text(texts, FIT_CHARS)[0])


def test_each_source_is_measured_alone_beside_the_shipped_record(quick):
    vals, fits = quick
    rows = hs.demo_rows("gpt-4", 1_500, layers=[3])
    assert [(r["dictionary"], r["block"]) for r in rows] == [("transcoder, skip", 3), ("transcoder, no skip", 3)]
    model = sprout.load("gpt-4").eval()
    total = sum(map(len, vals.values()))
    columns = [f"{s} ({len(t) / total:.0%})" for s, t in vals.items()]
    assert list(rows[0]) == ["demo", "dictionary", "block", *columns, "training shares", "shipped (equal shares)"]
    mix = hs.training_shares(vals, 1_500)
    assert abs(len(mix) - 1_500) <= 2 * len(vals)
    for text in vals.values():  # each source's first characters, as many as its share of 1,500
        assert text[:round(1_500 * len(text) / total)] in mix
    for row, skip in zip(rows, (True, False)):
        tc = interp.load_transcoder(model, 3, skip=skip)
        for column, text in zip(columns, vals.values()):
            m = interp.sae_metrics(model, tc, text[:1_500], baselines=True, baseline_fit=fits.of(tc)).iloc[0]
            assert row[column] == f"{m.ce_loss_recovered_mean:.3f} ± {m.ce_loss_recovered_mean_se:.3f}", column
        m = interp.sae_metrics(model, tc, mix, baselines=True, baseline_fit=fits.of(tc)).iloc[0]
        assert row["training shares"] == f"{m.ce_loss_recovered_mean:.3f} ± {m.ce_loss_recovered_mean_se:.3f}"
        assert row["shipped (equal shares)"].startswith(f"{tc.info['held_out']['ce_loss_recovered_mean']:.3f}")
    page = hs.markdown({"gpt-4": pd.DataFrame(rows)}, 1_500)
    assert "first 1,500 characters" in page and "| transcoder, no skip | 3 |" in page


def test_slices_in_training_shares_are_disjoint_and_each_measured_with_its_error(quick):
    vals, fits = quick
    total = sum(map(len, vals.values()))
    slices = [hs.training_shares(vals, 2_000, part, 3) for part in range(3)]
    assert all(abs(len(s) - 2_000) <= 2 * len(vals) for s in slices)
    for text in vals.values():  # each slice holds a piece of each source's own third, as long as its share
        n = round(2_000 * len(text) / total)
        for part, piece in enumerate(slices):
            start = part * len(text) // 3
            assert text[start:start + n] in piece and start + n <= (part + 1) * len(text) // 3
    with pytest.raises(ValueError, match="3 disjoint slices of"):
        hs.training_shares(vals, sum(map(len, vals.values())) // 3 + 1, 0, 3)
    with pytest.raises(ValueError, match="2 disjoint slices of"):  # rounding would overlap "abcd" and "defg"
        hs.training_shares({"a": "abcdefg", "b": "ABCDEFGHIJKLM"}, 10, 0, 2)
    table = hs.spread("gpt-4", 3, parts=2, chars=1_000)
    model = sprout.load("gpt-4").eval()
    tc = interp.load_transcoder(model, 3)
    m = interp.sae_metrics(model, tc, hs.training_shares(vals, 1_000, 1, 2), baselines=True, baseline_fit=fits.of(tc)).iloc[0]
    assert table.slice.tolist() == [0, 1]
    assert table.ce_loss_recovered_mean[1] == pytest.approx(m.ce_loss_recovered_mean)
    assert table.se[1] == pytest.approx(m.ce_loss_recovered_mean_se) and (table.se > 0).all()


def test_a_demo_without_english_sources_is_refused(monkeypatch):
    monkeypatch.setattr(ship, "demo_recipe", lambda name: None)
    with pytest.raises(SystemExit, match="not trained on the English corpus"):
        hs.english_texts("gpt-4")
    with pytest.raises(SystemExit, match="leave out --demo"):
        hs.main(["--demo", "gpt-4", "--readme", "docs/features.md"])
    with pytest.raises(SystemExit, match="give --demo NAME"):
        hs.main(["--spread", "3"])
    with pytest.raises(SystemExit, match="give --spread LAYER"):
        hs.main(["--demo", "gpt-4", "--noskip"])


def test_the_docs_block_shows_the_shipped_records_it_was_run_beside():
    """Its last column, read from each shipped cfg.json, goes stale when a transcoder is retrained or re-measured."""
    text = readme.block(readme.read(readme.home(hs.BLOCK, ROOT)), hs.BLOCK)
    for name in hs.english_demos():
        model = sprout.load(name).eval()
        table = text.split(f"\n{name}:\n\n")[1].split("\n\n")[0].splitlines()
        rows = {tuple(cell.strip() for cell in line.split("|")[1:3]): line.split("|")[-2].strip() for line in table[2:]}
        for (layer, skip), tc in ship.shipped_dictionaries(model, ("transcoders",)).items():
            held = tc.info["held_out"]
            want = with_se(held["ce_loss_recovered_mean"], held.get("ce_loss_recovered_mean_se"))
            assert rows.pop((KINDS["skip" if skip else "noskip"][1], str(layer))) == want, (name, layer, skip)
        assert not rows, f"{name}: the block lists transcoders that are not shipped: {sorted(rows)}"
