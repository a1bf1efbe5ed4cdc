"""experiments.frontier: one row per dictionary and method at each k, and its figure."""
import pytest
import torch

import interp
from experiments import frontier, ship
from figures.features import frontier_figure
from sprout.names import act_name


def test_the_frontier_has_a_row_per_dictionary_method_and_k(monkeypatch, tiny_model):
    model = tiny_model
    d = int(model.cfg.d_model)

    def fake_train(model, r, texts, parts, layers):  # untrained dictionaries at the asked k: fast, and real to measure
        return {act_name("resid_post", 0): interp.SAE(d, 4 * d, kind="topk", k=r.k, hook_name=act_name("resid_post", 0)),
                (0, True): interp.Transcoder(d, 2 * d, d, kind="topk", k=r.k, layer=0, skip=True)}
    monkeypatch.setattr(ship, "train_dictionaries", fake_train)
    g = torch.Generator().manual_seed(0)
    texts = dict(train=[torch.randint(0, 256, (64,), generator=g) for _ in range(12)], train_desc="{n} rows",
                 held=[torch.randint(0, 256, (64,), generator=g) for _ in range(6)])
    monkeypatch.setattr(ship, "demo_texts", lambda name, r: texts)
    table = frontier.frontier("tiny", model, [2, 5], recipe=ship.ShipPlan())
    assert len(table) == 2 * (2 + 3)  # per k: the SAE and PCA; the transcoder, regression and top neurons
    dict_rows = table[table.method == "dictionary"]
    assert sorted(dict_rows.l0.round().astype(int)) == [2, 2, 5, 5]  # TopK: L0 is k
    pca = table[table.method == "pca"].sort_values("k")
    assert (pca.l0.values == dict_rows[dict_rows.kind == "sae"].sort_values("k").l0.values).all()
    assert pca.explained_variance.is_monotonic_increasing  # more coefficients explain more
    fig = frontier_figure(table)
    assert len(fig.data) == 2 * 5 and {t.line.dash for t in fig.data} == {"solid", "dot"}
    with pytest.raises(ValueError):
        frontier_figure(table.drop(columns="l0"))


def test_trial_flags_change_only_what_they_name():
    base = ship.SHIP_PLANS["gpt-4"]
    args = frontier.argparse.Namespace(name="gpt-4", steps=None, expansion=None, transcoder_expansion=None)
    assert frontier.trial_plan(args) == base
    args = frontier.argparse.Namespace(name="gpt-4", steps=7, expansion=None, transcoder_expansion=6.0)
    r = frontier.trial_plan(args)
    assert (r.steps, r.transcoder_steps, r.transcoder_expansion, r.expansion) == (7, 7, 6.0, base.expansion)
