"""The generated blocks of the README and the docs pages (experiments.readme) and the one command that
rewrites them all (`python -m experiments.ship NAME --only readme`)."""
import importlib
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from experiments import english_loss, readme, ship
from sprout.files import demo_names

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def test_every_generated_block_has_its_experiment_and_its_file():
    steps = ship.readme_steps(ROOT)
    assert {m for m, _, _, _ in steps} == {"demo_table", "english_loss", "bos_loss", "features", "shipped_dictionaries",
                                           "interpretability_scores", "held_out_sources", "discovery", "graph_finding",
                                           "circuits"}
    for module, _, name, file in steps:
        assert readme.block(readme.read(file), name).strip(), name
        assert hasattr(importlib.import_module(f"experiments.{module}"), "main")
    assert ("circuits", ["--model", "gpt-4"], "circuit:gpt-4", ROOT / "docs/guide/circuits.md") in steps
    assert [file for _, _, name, file in steps if name == "demo-table"] == [README]  # the README keeps the demo table


def test_each_block_lives_in_exactly_one_file():
    files = [README, *sorted((ROOT / "docs").rglob("*.md"))]
    for _, _, name, home in ship.readme_steps(ROOT):
        holders = [f for f in files if readme.markers(name)[0] in f.read_text(encoding="utf-8")]
        assert holders == [home], (name, holders)
    with pytest.raises(ValueError, match="no file holds a block named 'nope'"):
        readme.home("nope", ROOT)


def copy_checkout(tmp_path):
    """README.md and the docs pages holding blocks, copied under tmp_path."""
    for _, _, _, file in ship.readme_steps(ROOT):
        target = tmp_path / file.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(file.read_text(encoding="utf-8"), encoding="utf-8")
    return tmp_path / "README.md"


def test_ship_readme_runs_each_experiment_on_the_readme_then_the_figures(monkeypatch, tmp_path):
    calls = []
    for module in list(ship.README_TABLES) + ["circuits"]:
        monkeypatch.setattr(importlib.import_module(f"experiments.{module}"), "main",
                            lambda argv, m=module: calls.append((m, argv)) or 0)
    monkeypatch.setattr(ship.run_all, "main", lambda argv: calls.append(("run_all", argv)) or 0)
    path = copy_checkout(tmp_path)
    ship.ship_readme(path, tmp_path / "docs", threads=1)
    assert [m for m, _ in calls] == [*ship.README_TABLES, "circuits", "run_all"]
    homes = {"demo_table": "README.md", "english_loss": "docs/results/demos.md", "bos_loss": "docs/guide/transformerlens.md",
             "features": "docs/guide/features.md", "shipped_dictionaries": "docs/features.md",
             "interpretability_scores": "docs/features.md",
             "held_out_sources": "docs/features.md",
             "discovery": "docs/results/discovery.md",
             "graph_finding": "docs/results/graph-finding.md",
             "circuits": "docs/guide/circuits.md"}
    assert all(argv[-2:] == ["--readme", str(tmp_path / homes[m])] for m, argv in calls if m != "run_all")
    assert calls[-1][1][calls[-1][1].index("--docs") + 1] == str(tmp_path / "docs")


def test_a_failing_step_stops_the_rewrite(monkeypatch, tmp_path):
    monkeypatch.setattr(importlib.import_module("experiments.demo_table"), "main", lambda argv: 2)
    path = copy_checkout(tmp_path)
    with pytest.raises(SystemExit, match="demo_table"):
        ship.ship_readme(path, tmp_path / "docs", threads=1)


def test_default_steps_are_what_the_demo_has():
    assert ship.default_steps("gpt-4", Path("runs/x")) == ["lens", "saes", "clt", "phase", "readme"]
    assert ship.default_steps("gpt-4", None) == ["lens", "saes", "clt", "readme"]
    assert ship.default_steps("gpt-1", None) == ["lens", "readme"]


def test_the_english_table_is_english_losss_markdown_of_each_demo():
    rows = []
    for name in demo_names():
        unit = "character" if name == "walkthrough" else "token"
        rows += [dict(model=name, unit=unit, source="held-out stories", loss=3.0, uniform=8.3, unigram=7.0,
                      bigram=5.5, trigram=5.6),
                 dict(model=name, unit=unit, source="everyday English", loss=5.0, uniform=8.3, unigram=6.8,
                      bigram=5.4, trigram=5.3),
                 dict(model=name, unit=unit, source="held-out shakespeare", loss=4.0, uniform=8.3, unigram=6.5,
                      bigram=4.7, trigram=4.3)]
    table = english_loss.markdown(pd.DataFrame(rows)).splitlines()
    assert table[2] == (f"| {demo_names()[0]} | 5.00 / 8.30 / 6.80 / 5.40 / 5.30 | "
                        "Shakespeare 4.00 / 6.50 / 4.70, stories 3.00 / 7.00 / 5.50 |")
    block = readme.block(readme.read(readme.home(english_loss.BLOCK, ROOT)), english_loss.BLOCK).splitlines()
    assert block[:2] == table[:2]  # the same columns
    labels = [line.split(" | ")[0].lstrip("| ") for line in block[2:]]
    assert labels == [line.split(" | ")[0].lstrip("| ") for line in table[2:]]  # a row per demo, labelled alike


def test_two_writers_of_one_file_both_land(monkeypatch, tmp_path):
    """Two experiments rewriting two blocks of one page at once (a read, then a write): the second waits for
    the first, so neither block's update is lost."""
    page = tmp_path / "page.md"
    page.write_text("<!-- a -->\nold a\n<!-- /a -->\n<!-- b -->\nold b\n<!-- /b -->\n")
    first_read, plain = threading.Event(), readme.read

    def slow_read(path):
        text = plain(path)
        if threading.current_thread().name == "a":
            first_read.set()
            time.sleep(0.5)  # the other writer starts while this one holds what it read
        return text

    monkeypatch.setattr(readme, "read", slow_read)
    a = threading.Thread(target=readme.rewrite, args=(page, "a", "new a"), name="a")
    a.start()
    assert first_read.wait(10)
    readme.rewrite(page, "b", "new b")
    a.join()
    assert readme.block(page.read_text(), "a") == "new a" and readme.block(page.read_text(), "b") == "new b"
