"""The discovery benchmark runs end to end on a tiny model and prints every row with a ratio (no timing asserted)."""
import re

from benchmarks import discovery


def test_discovery_benchmark_prints_every_row(tmp_path):
    text = discovery.main(["--tiny", "--repeats", "1", "--seqs", "2", "--half", "6", "--out", str(tmp_path / "results.md")])
    assert text in (tmp_path / "results.md").read_text()
    rows = [l for l in text.splitlines() if l.startswith("| ") and "---" not in l][1:]
    assert len(rows) == 4
    for row in rows:
        assert re.search(r"\| \d+\.\d\d s \| \d+\.\d{3}x \| -?\d\.\d{3} \| \d+% \|$", row), row
    assert "| exact patching of every edge (the reference) |" in rows[0] and "| 1.000x | 1.000 | 100% |" in rows[0]
