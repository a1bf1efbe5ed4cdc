"""The attribution-graph benchmark runs end to end on a tiny model and prints its row (no timing is asserted)."""
import re

from benchmarks import graphs


def test_graph_benchmark_prints_attribute_beside_forward_backward(tmp_path):
    out = graphs.main(["--tiny", "--batch", "16", "--out", str(tmp_path / "results.md")])
    assert out.strip() in (tmp_path / "results.md").read_text()
    row = next(line for line in out.splitlines() if line.startswith("| tiny |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "12" and int(cells[5]) >= 2  # tokens, backward passes (logit rows + feature rows)
    assert re.fullmatch(r"\d+\.\d+x", cells[8]) and re.fullmatch(r"\d+\.\d+x", cells[9])
