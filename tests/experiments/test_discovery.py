"""experiments.discovery: the planted circuit comes out as truth; the sweep's sentences hold in every row."""
import pandas as pd
import pytest
import torch

import sprout
from experiments import discovery
from interp.discovery import planted


def test_planted_circuit_is_found_exactly():
    model = planted.planted_model("induction")
    clean, corrupted = planted.induction_pair(n_seqs=4)
    task = (clean, corrupted, planted.induction_metric(clean))
    row, curve, scores = discovery.one_setting(model, task, exact=True, steps=5)
    truth = planted.truth("induction")
    for method, part in scores.groupby("method"):
        top = part.reindex(part["score"].abs().sort_values(ascending=False).index).head(len(truth))
        assert set(zip(top["sender"], top["receiver"], top["via"])) == truth, method
    assert row["top_found"] == 1.0  # exact's top 5% of edges are planted ones, and EAP-IG puts them on top too
    assert {"L0H0", "L1H0"} <= set(row["top_heads"].split())
    assert row["cpr_eap-ig-inputs"] > row["cpr_random"] and row["cmd_eap-ig-inputs"] < row["cmd_random"]
    assert set(curve["method"]) == {"eap-ig-inputs", "exact", "random"}


def test_names_task_marks_later_pieces_of_repeated_names():
    model = sprout.load("gpt-1").eval()
    clean, corrupted, metric = discovery.names_task(model, 64, seed=0)
    assert clean.shape == corrupted.shape == (discovery.N_SEQS, 64) and not torch.equal(clean, corrupted)
    # the metric is a mean log-probability over the marked positions: 0 for logits that put all mass on the answer
    nxt = torch.cat([clean[:, 1:], clean[:, :1]], dim=1)
    perfect = torch.nn.functional.one_hot(nxt, int(model.cfg.d_vocab)).float() * 100
    assert abs(float(metric(perfect))) < 1e-3
    assert float(metric(torch.zeros_like(perfect))) == pytest.approx(-torch.log(torch.tensor(float(model.cfg.d_vocab))).item())


def _rows(beats: list[bool]) -> pd.DataFrame:
    n = len(beats)
    return pd.DataFrame({"model": "m", "task": "induction", "seed": range(n), "length": [8, 16] * (n // 2),
                         "n_edges": 18, "cpr_eap-ig-inputs": [0.9 if b else 0.1 for b in beats], "cpr_random": 0.5,
                         "cmd_eap-ig-inputs": 0.1, "cmd_random": 0.5, "top_edge": ["a", "a", "a", "b"][:n],
                         "top_heads": ["L0H0 L1H1", "L1H1", "L1H1 L1H2", "L1H1"][:n], "induction_circuit_heads": "L1H1"})


def test_sentences_only_where_every_setting_agrees():
    good = discovery.claims(_rows([True] * 4))
    assert any("beats a random one" in s for s in good)
    assert not any("top edge" in s for s in good)  # "b" in the last row
    assert any("always include L1H1" in s for s in good) and any("(L1H1) is among them" in s for s in good)
    assert not any("beats a random one" in s for s in discovery.claims(_rows([True, True, True, False])))
    text = discovery.markdown(_rows([True] * 4))
    assert "holds over seeds 0, 1, 2, 3 and lengths 8, 16" in text


def test_summary_counts_the_settings_each_statement_holds_in():
    rows = _rows([True, True, True, False]).assign(cpr_exact=[0.92, 0.2, 0.92, 0.92])
    text = discovery.summary(rows)
    assert "beats a random ranking on both CPR and CMD in 3 of 4" in text
    assert "within 0.05 of it or above in 3 of 4" in text  # 0.9 against 0.92 or 0.2: yes; 0.1 against 0.92: no
    assert "among the heads of EAP-IG's top 5% of edges in 4 of 4" in text
    assert "exact patching" not in discovery.summary(rows.drop(columns="cpr_exact"))  # no exact run: no sentence


def test_sweep_on_a_one_layer_demo(tmp_path, monkeypatch):
    monkeypatch.setattr(discovery, "N_SEQS", 2)
    model = sprout.load("gpt-1").eval()
    rows, curves = discovery.sweep({"gpt-1": model}, (0, 1), {"induction": (6,), "names": (32,)}, False, 2)
    assert len(rows) == 4 and (rows["n_edges"] == 18).all()  # 1 layer, 3 heads: exact patching runs (18 <= limit)
    assert rows["induction_circuit_heads"].eq("").all()  # no head above layer 0 to be an induction head
    assert set(curves["method"]) == {"eap-ig-inputs", "exact", "random"}
    doc = tmp_path / "docs" / "results" / "d.md"
    doc.parent.mkdir(parents=True)
    doc.write_text("x\n<!-- discovery -->\nold\n<!-- /discovery -->\n")
    (tmp_path / "README.md").write_text("y\n<!-- discovery-summary -->\n<!-- /discovery-summary -->\n")
    from experiments.readme import rewrite
    rewrite(doc, discovery.BLOCK, discovery.markdown(rows))
    assert "holds over seeds 0, 1 and lengths 6" in doc.read_text() and "\nold\n" not in doc.read_text()
    written = doc.read_text()
    rows.to_csv(tmp_path / "settings.csv", index=False)  # the block again from the table alone: the same text
    doc.write_text("x\n<!-- discovery -->\n<!-- /discovery -->\n")
    assert discovery.main(["--from-csv", str(tmp_path / "settings.csv"), "--doc", str(doc)]) == 0
    assert doc.read_text() == written
    readme = (tmp_path / "README.md").read_text()  # the summary beside it, in the README two levels up
    assert "Over 4 settings (gpt-1; " in readme and f"in {len(rows)} of 4" in readme


def test_graph_head_loads_and_overlaps_equal_a_hand_computation_from_head_loadings():
    from interp.graphs import ReplacementModel, attribute, head_loadings
    from tests.interp.graphs.tiny import random_transcoders, tiny_sprout
    model = tiny_sprout()
    rm = ReplacementModel(model, random_transcoders(model))
    tokens = torch.randint(0, model.cfg.d_vocab, (8,), generator=torch.Generator().manual_seed(5))
    loads = discovery.graph_head_loads(rm, tokens)
    graph = attribute(rm, tokens[:-1], target=[int(tokens[-1])])
    logit = graph.slices()["logit"].start
    hand = {}
    for layer in range(graph.n_layers):
        for rec in head_loadings(rm, graph, logit, layer).itertuples():
            if rec.head >= 0:
                name = f"L{layer}H{rec.head}"
                hand[name] = hand.get(name, 0.0) + abs(rec.share)
    assert len(loads) == graph.n_layers * model.cfg.n_heads and min(hand.values()) > 0
    for name, value in hand.items():
        assert loads[name] == pytest.approx(value, rel=1e-12)
    ranked = sorted(hand, key=lambda h: -hand[h])
    eap = [ranked[0], "L9H9"]  # one head shared with the graph's top 2, one not
    row = discovery.graph_overlaps([loads, loads], eap)
    assert row["graph_heads_p0"] == " ".join(sorted(ranked[:2])) and row["jaccard_graph_p1"] == 1 / 3
    table = pd.DataFrame([row, {**row, "jaccard_graph_p1": 0.0}])
    assert discovery.graph_claims(table.head(1)) and not discovery.graph_claims(table)
