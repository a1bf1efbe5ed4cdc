"""The dictionary benchmark runs end to end on a tiny model and prints its rows (no timing is asserted)."""
import re

from benchmarks import saes


def test_sae_benchmark_prints_training_and_harvesting_beside_their_floors(tmp_path):
    out = saes.main(["--tiny", "--steps", "5", "--batch", "64", "--train-chars", "6000", "--no-peer",
                     "--out", str(tmp_path / "results.md")])
    assert out.strip() in (tmp_path / "results.md").read_text()
    for what in ("FLOP floor of a training step", "`interp.train_sae` on a tensor", "bare forward, `stop_at_layer`",
                 "activation harvesting"):
        line = next(l for l in out.splitlines() if what in l)
        assert re.search(r"\| [\d,]+ \| [\d,]+ \| (1\.00x|\d+\.\d\d / \d+\.\d\d) \|", line), line
    assert "SAELens: not compared (--no-peer)" in out
