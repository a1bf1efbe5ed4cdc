"""The README's REPL tour runs as written on the shipped demos, and every comment says what the line gives."""
import ast
import re
from pathlib import Path

import pandas as pd
import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def tour() -> str:
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## A tour in the REPL"):]
    m = re.search(r"```python\n(.*?)\n```", section, re.S)
    assert m, "the README's tour has no python block"
    return m.group(1)


def comments() -> dict:
    """{statement: its comment} for every commented line of the tour."""
    pairs = [line.split("  #", 1) for line in tour().splitlines() if "  #" in line]
    return {statement.rstrip(): comment.strip() for statement, comment in pairs}


def run_tour(code: str) -> dict:
    """Execute the block line by line like a REPL, keeping each expression's value."""
    namespace, values = {}, {}
    for line in code.splitlines():
        statement = line.split("  #")[0].rstrip()
        if not statement:
            continue
        try:
            values[statement] = eval(compile(statement, "README tour", "eval"), namespace)
        except SyntaxError:
            exec(compile(statement, "README tour", "exec"), namespace)
    namespace["_values"] = values
    return namespace


def said(statement: str) -> str:
    return comments()[statement]


def numbers(text: str) -> list[float]:
    return [float(x) for x in re.findall(r"[-+]?\d+\.\d+", text)]


@pytest.fixture(scope="module")
def gpt4():
    return run_tour(tour())


def test_every_line_but_the_imports_says_what_it_gives():
    statements = [line.split("  #")[0].rstrip() for line in tour().splitlines() if line.strip()]
    assert all(s in comments() for s in statements if not s.startswith("import")), statements


def test_the_cache_and_the_pieces_are_what_the_comments_show(gpt4):
    values = gpt4["_values"]
    run_line = next(line for line in comments() if line.startswith("logits, cache = "))
    assert list(gpt4["logits"].shape) == ast.literal_eval(said(run_line).split(": ", 1)[1])
    shape_line = 'cache["blocks.1.attn.hook_pattern"].shape'
    assert said(shape_line).startswith("[batch, head, query_pos, key_pos]: ")
    assert list(values[shape_line]) == ast.literal_eval(said(shape_line).split(": ", 1)[1])
    pieces_line = 'model.to_str_tokens("Zorbin Plax")'
    assert values[pieces_line] == ast.literal_eval(said(pieces_line))


def test_the_top_head_and_its_score_are_what_the_comment_says(gpt4):
    top = gpt4["top"]
    assert f"L{int(top.layer)}H{int(top['head'])} (score {top.score:.2f})" in said("top = scores.iloc[0]")
    scores = gpt4["scores"]
    assert list(scores.columns[:3]) == ["layer", "head", "score"] and scores["score"].is_monotonic_decreasing


def test_the_lens_columns_are_the_ones_the_comments_name(gpt4):
    values = gpt4["_values"]
    plain = values['interp.logit_lens(model, "The cat sat on the mat")']
    stats = values['interp.logit_lens(model, "The cat sat on the mat", stats=True)']
    named = re.findall(r"\w+_\w+|is_top1", said('interp.logit_lens(model, "The cat sat on the mat")'))
    assert set(named) <= set(plain.columns) and plain["top_tokens"].map(len).eq(5).all()  # "top-5"
    added = re.findall(r"\w+", said('interp.logit_lens(model, "The cat sat on the mat", stats=True)').split("adds", 1)[1])
    assert set(stats.columns) - set(plain.columns) == set(added)
    assert isinstance(gpt4["held_out_text"], str) and len(gpt4["held_out_text"]) >= 20_000


def test_the_rms_comment_is_the_first_and_last_stream_rms(gpt4):
    rms = gpt4["_values"]["interp.residual_rms(model, held_out_text)"]
    stream = rms[rms["kind"] == "stream"].sort_values("layer")
    first, last = numbers(said("interp.residual_rms(model, held_out_text)"))
    assert f"{stream['mean'].iloc[0]:.3f}" == f"{first:.3f}" and f"{stream['mean'].iloc[-1]:.2f}" == f"{last:.2f}"
    assert f"after block {int(stream['layer'].iloc[-1])}" in said("interp.residual_rms(model, held_out_text)")


def test_the_ablation_costs_are_what_the_comment_says(gpt4):
    statement = "interp.ablate_heads(model, scores, top_k=3)"
    ablation = gpt4["_values"][statement]
    scores = gpt4["scores"]
    assert list(ablation["label"].iloc[:3]) == [f"L{int(r.layer)}H{int(r.head)}" for r in scores.head(3).itertuples()]
    assert ablation["label"].iloc[-1].count("+") == 2
    low, high, together = numbers(said(statement))
    alone = ablation["delta"].iloc[:3]
    assert (f"{alone.min():+.2f}", f"{alone.max():+.2f}") == (f"{low:+.2f}", f"{high:+.2f}")
    assert f"{ablation['delta'].iloc[-1]:+.2f}" == f"{together:+.2f}"


def test_the_tour_runs_on_sprout_mini_too():
    code = tour()
    assert 'sprout.load("gpt-4")' in code
    ns = run_tour(code.replace('sprout.load("gpt-4")', 'sprout.load("sprout-mini")'))
    ablation = list(ns["_values"].values())[-1]
    assert isinstance(ablation, pd.DataFrame) and ablation["delta"].iloc[-1] > 1.0, ablation
