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
    dense = [t for t in fig.data if "regression" in t.name]  # L0 = d_model: a level line over the sparse L0s
    sparse_l0 = table[table.method != "regression"].l0
    assert all(list(t.x) == [sparse_l0.min(), sparse_l0.max()] and t.y[0] == t.y[1] for t in dense) and len(dense) == 2
    with pytest.raises(ValueError):
        frontier_figure(table.drop(columns="l0"))


def test_trial_flags_change_only_what_they_name():
    base = ship.SHIP_PLANS["gpt-4"]
    args = frontier.argparse.Namespace(name="gpt-4", steps=None, expansion=None, transcoder_expansion=None)
    assert frontier.trial_plan(args) == base
    args = frontier.argparse.Namespace(name="gpt-4", steps=7, expansion=None, transcoder_expansion=6.0)
    r = frontier.trial_plan(args)
    assert (r.steps, r.transcoder_steps, r.transcoder_expansion, r.expansion) == (7, 7, 6.0, base.expansion)


def _rows(demo, dictionary, k, own, *baselines):
    """Hand-made frontier rows: the dictionary's (l0, ev, ce), then (method, ev, ce) per baseline at its L0."""
    out = [dict(demo=demo, k=k, dictionary=dictionary, kind="transcoder", method="dictionary", l0=own[0],
                explained_variance=own[1], ce_loss_recovered_mean=own[2])]
    return out + [dict(demo=demo, k=k, dictionary=dictionary, kind="transcoder", method=m, l0=own[0],
                       explained_variance=ev, ce_loss_recovered_mean=ce) for m, ev, ce in baselines]


def test_each_dictionary_sits_beside_the_best_baseline_of_each_measure():
    table = frontier.pd.DataFrame(_rows("a", "MLP 1", 8, (7.5, 0.70, 0.60), ("regression", 0.40, 0.65),
                                        ("top_neurons", 0.75, 0.50))
                                  + _rows("a", "MLP 1", 16, (15.0, 0.90, 0.95), ("regression", 0.40, 0.65),
                                          ("top_neurons", 0.80, 0.70)))
    best = frontier.best_baselines(table)
    assert list(best.k) == [8, 16]
    first = best.iloc[0]
    assert first["best baseline EV"] == "0.750 (top_neurons)" and first["best baseline CE"] == "0.650 (regression)"
    assert first["EV margin"] == pytest.approx(-0.05) and first["CE margin"] == pytest.approx(-0.05)
    assert best.iloc[1]["EV margin"] == pytest.approx(0.10) and best.iloc[1]["CE margin"] == pytest.approx(0.25)


def test_from_csv_writes_the_docs_block_and_one_figure_per_demo(tmp_path, monkeypatch):
    table = frontier.pd.DataFrame(_rows("a", "MLP 1", 8, (7.5, 0.7, 0.6), ("regression", 0.4, 0.65))
                                  + _rows("b", "MLP 2", 8, (8.0, 0.8, 0.9), ("regression", 0.5, 0.55)))
    csvs = []
    for demo, g in table.groupby("demo"):
        csvs.append(tmp_path / f"frontier_{demo}.csv")
        g.to_csv(csvs[-1], index=False)
    doc = tmp_path / "docs" / "features.md"
    doc.parent.mkdir()
    doc.write_text("before\n<!-- frontier -->\nold\n<!-- /frontier -->\nafter\n")
    shots = []
    monkeypatch.setattr(frontier, "home", lambda name, root: doc)
    monkeypatch.setattr("experiments.png.screenshot", lambda fig, path: shots.append((fig, path)) or path)
    assert frontier.main(["--from-csv", *map(str, csvs), "--docs"]) == 0
    text = doc.read_text()
    assert text.startswith("before\n") and text.endswith("after\n") and "old" not in text
    assert "](frontier_a.png)" in text and "](frontier_b.png)" in text and "| b | MLP 2 | 8 |" in text
    assert [p.name for _, p in shots] == ["frontier_a.png", "frontier_b.png"]
    assert {t.name for t in shots[1][0].data} == {"MLP 2: dictionary", "MLP 2: regression (dense, L0 8)"}
