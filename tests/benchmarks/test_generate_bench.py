"""The generation benchmark runs end to end on a tiny config and prints its rows (no timing is asserted)."""
import re

from benchmarks import generate


def test_generate_benchmark_prints_a_row_with_and_without_the_cache_beside_transformer_lens(capsys):
    text = generate.main(["--tiny", "--new", "6", "--prompt", "4", "--repeats", "1", "--threads", "1"])
    assert capsys.readouterr().out.strip() == text.strip()
    for what in ("our generate, no KV cache", "our generate, KV cache", "TransformerBridge generate, no KV cache",
                 "TransformerBridge generate, KV cache"):
        line = next((l for l in text.splitlines() if l.startswith(f"| {what} |")), None)
        assert line is not None, f"no row for {what!r}"
        assert re.search(r"\| \d+ ms \| \d+\.\d\dx \| \d+ ms \| \d+\.\d\dx \|$", line), line
    assert "| our generate, no KV cache |" in text and "| 1.00x |" in text.splitlines()[4]
    assert text.endswith("same tokens in every row: yes")  # the four draw the same greedy tokens
