"""The circuits page's blocks are what `python -m experiments.circuits --readme docs/guide/circuits.md` writes for gpt-4:
the circuit at the experiment's setting, and what holds at every setting of its spread."""
import argparse
import re
from pathlib import Path

import interp
import sprout
from experiments import circuits, readme
from tests.experiments.test_demo_table import same_within_rounding

PAGE = readme.home("circuit:gpt-4", Path(__file__).resolve().parents[2])


def readme_block(label: str) -> str:
    m = re.search(rf"<!-- circuit:{label} -->\n```text\n(.*?)\n```\n<!-- /circuit:{label} -->",
                  PAGE.read_text(encoding="utf-8"), re.S)
    assert m, f"{PAGE} has no circuit block for {label}"
    return m.group(1)


def test_the_readme_circuit_block_is_what_the_experiment_prints():
    parser = argparse.ArgumentParser()
    circuits.add_args(parser)
    args = parser.parse_args([])  # the experiment's defaults, as run_all runs it
    model = sprout.load("gpt-4")
    repeated, stories = circuits._pairs(model, args.n_seqs, args.story_len)
    _, summary = interp.induction_circuit(model, data=repeated, stories=stories)
    assert same_within_rounding(readme_block("gpt-4"), summary) == []


def test_the_readme_spread_block_is_what_the_experiment_prints():
    parser = argparse.ArgumentParser()
    circuits.add_args(parser)
    args = parser.parse_args([])
    model = sprout.load("gpt-4")
    spread = circuits.circuit_spread(model, args.n_seqs, args.story_len)
    block = readme_block("spread:gpt-4")
    assert same_within_rounding(block, interp.spread_sentences(spread)) == []
    # what the README says of every setting holds at every setting
    ranges = interp.spread_ranges(spread)
    n = int(ranges["settings"].iloc[0])
    for r in ranges[ranges["in_joint_set"] == n].itertuples():
        assert f"{r.sender} (alone" in block
