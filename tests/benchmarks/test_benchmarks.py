"""The benchmark runner runs end to end on a tiny config and prints its table both ways, with glibc's
malloc defaults and after keep_freed_memory() (no timing is asserted)."""
import re

import pytest

from benchmarks import run


@pytest.mark.filterwarnings("error::UserWarning")  # e.g. a probe of a hook the tiny model lacks
def test_runner_prints_every_row_with_a_numeric_ratio(capsys, tmp_path):
    # one torch thread, as the suite runs (conftest): the two child processes run ~1.7x faster on a busy 2-core machine
    rows = run.main(["--tiny", "--repeats", "1", "--lens-tokens", "128", "--threads", "1", "--out", str(tmp_path / "results.md")])
    out = capsys.readouterr().out
    assert out.strip() in (tmp_path / "results.md").read_text()
    expected = ["plain hook-free model.py, forward", "Hugging Face Qwen3ForCausalLM, forward",
                "TransformerBridge, forward", "TransformerBridge `run_with_cache` (everything",
                "TransformerBridge `run_with_cache` (`hook_resid_post` only)", "our Sprout forward, no hooks",
                "our `run_with_cache`, every hook", "our `run_with_cache`, `hook_resid_post` only", "with `stats=True`",
                "`stop_at_layer=", "our `run_with_cache_into`", "our training step", "`interp.logit_lens`"]
    for what in expected:
        line = next((l for l in out.splitlines() if what in l), None)
        assert line is not None, f"no table row for {what!r}"
        assert re.search(r"\| \d+ ms \| \d+\.\d\dx \| \d+ ms \| \d+\.\d\dx \|", line), line
    assert len(rows) == 2 * 17  # the table with glibc's defaults, then with keep_freed_memory()
    assert [r["allocator"] for r in rows] == ["default"] * 17 + ["keep"] * 17
    assert out.count("### Allocator: ") == 2
    # each reference row is its own group's 1.00x, and every ratio is a positive number
    assert [r["ratio"] for r in rows if r["target"] == "reference"] == [1.0, 1.0, 1.0] * 2
    assert all(r["ratio"] > 0 and r["cpu_ratio"] > 0 for r in rows)
    assert re.search(r"stop_at_layer probe: \d+\.\dx faster", out)
    # the memory table compares the same activations: the hook names both models have
    shared = re.search(r"\| TransformerBridge, the (\d+) hook names both have \| (\d+) \|", out)
    assert shared and shared.group(1) == shared.group(2) and int(shared.group(1)) >= 20 * 2


def test_patching_benchmark_checks_equality_and_prints_every_row(tmp_path):
    from benchmarks import patching

    text = patching.main(["--tiny", "--pos", "2", "--repeats", "1", "--out", str(tmp_path / "results.md")])
    assert text in (tmp_path / "results.md").read_text()
    assert re.search(r"equals TransformerLens'( and nnsight)? within \d\.\de-\d\d", text)  # nnsight: where installed
    for what in ("our Sprout |", "TransformerBridge |", "`interp.patch(", "`logit_positions=-1`", "`interp.attribution_patch`"):
        line = next(l for l in text.splitlines() if what in l)
        assert re.search(r"\| \d+\.\d\d s \| \d+\.\d{3}x \|", line), line
