"""The README's demo table is what `python -m experiments.demo_table` prints (within the last shown digit)."""
import re
from pathlib import Path

import pytest

from experiments import demo_table, readme

README = Path(__file__).resolve().parents[2] / "README.md"
NUMBER = re.compile(r"(?<![\w.\-])[-+]?\d[\d,]*(?:\.\d+)?")  # not inside a name like L3H1 or gpt-4


def same_within_rounding(shown: str, measured: str) -> list[str]:
    """The differences between two tables: text must match exactly, each number to within one unit of its
    last shown digit (a value on a rounding boundary may print either way on another machine)."""
    text_a, text_b = NUMBER.split(shown), NUMBER.split(measured)
    nums_a, nums_b = NUMBER.findall(shown), NUMBER.findall(measured)
    if text_a != text_b or len(nums_a) != len(nums_b):
        return [f"{a!r} != {b!r}" for a, b in zip(shown.splitlines(), measured.splitlines()) if a != b] or ["lengths differ"]
    bad = []
    for a, b in zip(nums_a, nums_b):
        unit = 10.0 ** -len(a.split(".")[1]) if "." in a else 1.0
        if abs(float(a.replace(",", "")) - float(b.replace(",", ""))) > unit * 1.01:
            bad.append(f"README {a}, measured {b}")
    return bad


def test_the_comparison_catches_a_changed_number_or_word():
    assert same_within_rounding("| 2.40 | L3H1 (0.98) |", "| 2.41 | L3H1 (0.97) |") == []
    assert same_within_rounding("| 2.40 |", "| 2.54 |") == ["README 2.40, measured 2.54"]
    assert same_within_rounding("| L3H1 |", "| L0H1 |")
    assert same_within_rounding("| gpt-4 2.40 |", "| gpt-1 2.40 |")


def test_the_readme_table_is_what_demo_table_prints(demo_measurements):
    measured = demo_table.markdown({name: m for name, (_, m) in demo_measurements.items()})
    assert same_within_rounding(readme.block(README.read_text(encoding="utf-8"), demo_table.BLOCK), measured) == []


def test_replacing_the_table_keeps_the_rest_of_the_readme():
    begin, end = readme.markers(demo_table.BLOCK)
    doc = f"intro\n{begin}\n| old |\n{end}\nrest $1 \\1\n"
    new = readme.replace_block(doc, demo_table.BLOCK, "| new | \\1 |")
    assert new == f"intro\n{begin}\n| new | \\1 |\n{end}\nrest $1 \\1\n"
    assert readme.block(new, demo_table.BLOCK) == "| new | \\1 |"
    empty = f"{begin}\n{end}"
    assert readme.replace_block(empty, demo_table.BLOCK, "| t |") == f"{begin}\n| t |\n{end}"
    with pytest.raises(ValueError, match="demo-table"):
        readme.replace_block("no markers", demo_table.BLOCK, "| t |")
    with pytest.raises(ValueError, match="demo-table"):
        readme.replace_block(doc + doc, demo_table.BLOCK, "| t |")


def test_the_index_page_measures_with_the_readme_tables_functions_and_settings(tmp_path):
    """run_all with its default settings prints, for any model, the numbers demo_table.measure gives it."""
    import torch

    import sprout
    from experiments.run_all import run_all
    from sprout import Sprout, SproutConfig
    from sprout.material import generate_corpus
    from sprout.tokenizer import train_bpe

    torch.manual_seed(1)
    tok = train_bpe(generate_corpus(15_000, seed=3) + " Zorbin Plax", vocab_size=300)
    sprout.save(Sprout(SproutConfig(vocab_size=300, context=128, n_layer=2, n_head=2, d_model=32, d_ff=64), tok),
                tmp_path / "tiny")
    model = sprout.load(tmp_path / "tiny")
    done = run_all({"tiny": model}, tmp_path / "results", only=["head_detection", "residual_growth", "training_dynamics"],
                   progress=False)
    shown = {r["quantity"]: r["measured"] for _, _, rows in done.values() for r in rows}
    m = demo_table.measure(model, "tiny")
    assert shown["top induction head (score)"] == f"{m['induction'][0]} ({m['induction'][1]:.2f})"
    assert shown["held-out loss on fresh stories (nats/token), measured here"] == pytest.approx(m["loss"], rel=1e-6)
    assert shown["RMS after the embedding"] == pytest.approx(m["rms"][0], rel=1e-6)
    assert shown["RMS after block 2 (the last)"] == pytest.approx(m["rms"][-1], rel=1e-6)
    assert shown["repeated random tokens: loss on the 2nd copy (nats/token)"] == pytest.approx(m["repeat"][1], rel=1e-6)
    top = [r for r in done["head_detection"][2] if r["quantity"].startswith("loss change, L")][0]
    assert top["measured"] == pytest.approx(m["ablation"][0], rel=1e-6)
