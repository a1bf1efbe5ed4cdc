"""The README's REPL tour runs as written on the shipped demos, and says what it does."""
import re
from pathlib import Path

import pandas as pd
import pytest

import sprout

README = Path(__file__).resolve().parents[2] / "README.md"


def tour() -> str:
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## A tour in the REPL"):]
    m = re.search(r"```python\n(.*?)\n```", section, re.S)
    assert m, "the README's tour has no python block"
    return m.group(1)


def run_tour(code: str) -> dict:
    """Execute the block line by line like a REPL, keeping each expression's value."""
    namespace, values = {}, []
    for line in code.splitlines():
        statement = line.split("  #")[0].rstrip()
        if not statement:
            continue
        try:
            values.append((statement, eval(compile(statement, "README tour", "eval"), namespace)))
        except SyntaxError:
            exec(compile(statement, "README tour", "exec"), namespace)
    namespace["_values"] = values
    return namespace


@pytest.mark.parametrize("name", ["gpt-4", "sprout-mini"])
def test_the_readme_tour_runs_as_written(name):
    code = tour()
    assert 'sprout.load("gpt-4")' in code
    ns = run_tour(code.replace('sprout.load("gpt-4")', f'sprout.load("{name}")'))
    values = dict(ns["_values"])
    lens = values['interp.logit_lens(model, "The cat sat on the mat")']
    stats = values['interp.logit_lens(model, "The cat sat on the mat", stats=True)']
    # the columns the comments name are there, and the extra ones only with stats=True
    assert {"top_tokens", "top_probs", "p_next", "is_top1"} <= set(lens.columns)
    assert not {"rank_next", "entropy", "kl_to_final"} & set(lens.columns)
    assert {"rank_next", "entropy", "kl_to_final"} <= set(stats.columns)
    assert isinstance(ns["held_out_text"], str) and len(ns["held_out_text"]) >= 20_000
    # the ablated head is the best induction head, and removing it does something
    scores = ns["scores"]
    assert scores["score"].iloc[0] == scores[scores["kind"] == "induction"]["score"].max()
    ablation = list(values.values())[-1]
    # the English demos have backup induction heads (the demo table: zeroing the top one costs little), so
    # the tour zeroes the top three, one at a time and then together, and together they cost nats
    assert isinstance(ablation, pd.DataFrame) and list(ablation["label"].iloc[:3]) == [
        f"L{int(r.layer)}H{int(r.head)}" for r in scores.head(3).itertuples()], ablation
    assert ablation["label"].iloc[-1].count("+") == 2 and ablation["delta"].iloc[-1] > 1.0, ablation


def test_the_tour_names_the_demos_real_top_induction_head():
    """The comment beside the ablation states gpt-4's best head and its score as head_scores finds them."""
    import interp

    top = interp.head_scores(sprout.load("gpt-4"), "induction").iloc[0]
    assert f"L{int(top.layer)}H{int(top['head'])} (score {top.score:.2f})" in tour()
