"""The tuned-lens throughput benchmark runs end to end on a tiny model (no timing is asserted)."""
import re

from benchmarks import tuned_lens


def test_tuned_lens_benchmark_prints_floor_and_ours(capsys):
    results = tuned_lens.main(["--tiny", "--batch", "2"])
    out = capsys.readouterr().out
    assert set(results) == {"tiny"} and results["tiny"]["tokens"] == 2 * 32
    assert all(results["tiny"][k] > 0 for k in ("floor", "ours", "floor_cpu", "ours_cpu"))
    assert re.search(r"\| tiny \| 64 \| [\d,]+ \| [\d,]+ \| \d+% \| \d+% \| >= 70% \| (yes|no) \|", out)
