"""experiments.graphs on a tiny random Sprout with random transcoders: the pages hold the graph's own edges."""
import json
import re

import pytest
import torch

import interp
from experiments import graphs
from experiments.common import Models, Output, args_for
from sprout import Sprout, SproutConfig
from sprout.tokenizer import char_tokenizer
from tests.interp.graphs.tiny import random_transcoders

PROMPT = "ab </script><b>ab ab"  # user text: must reach the page only as data


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    tok = char_tokenizer("abcdefgh </>:" + PROMPT)
    torch.manual_seed(0)
    model = Sprout(SproutConfig(vocab_size=tok.get_vocab_size(), context=48, n_layer=2, n_head=2, d_model=32, d_ff=64),
                   tokenizer=tok).eval()
    tcs = random_transcoders(model, d_sae=24, k=3, dtype=torch.float32)
    original = graphs.transcoders
    graphs.transcoders = lambda model, folder: tcs
    try:
        root = tmp_path_factory.mktemp("graphs")
        (root / "val.txt").write_text(PROMPT * 20)  # the feature pages' held-out text (the tokenizer's characters)
        out = Output(root / "graphs", "graphs")
        args = args_for(graphs, ["--prompt", PROMPT, "--features", "12", "--chars", "300"])
        rows = graphs.run(Models({"../tiny model": model}, {"../tiny model": root}), out, args)
    finally:
        graphs.transcoders = original
    return dict(out=out, rows=rows, model=model, tcs=tcs)


def data_of(path):
    return json.loads(re.search(r'<script type="application/json" id="graph-data">(.*?)</script>', path.read_text(), re.S)[1])


def test_every_page_is_written_inside_out_and_listed(written):
    out = written["out"]
    names = sorted(p.name for p in out.dir.iterdir())
    assert names == ["circuit_planted_induction.html", "circuit_tiny-model_induction.html", "graph_tiny-model_0.html",
                     "plotly.min.js", "tiny-model", "tiny-model.html"]
    assert sorted(p.name for p in out.pages) == names[:3]
    assert "href='graph_tiny-model_0.html'" in (out.dir / "tiny-model.html").read_text()
    assert graphs.file_label("../../a b/..") == "a-b" and graphs.file_label("..") == "x"


def test_the_graph_page_holds_the_pruned_graphs_edges_the_right_way_round(written):
    graph = interp.attribute(written["model"], PROMPT, written["tcs"], max_feature_nodes=12, batch_size=28)
    pruned = interp.prune_graph(graph)
    data = data_of(written["out"].dir / "graph_tiny-model_0.html")
    ids = [n["id"] for n in data["nodes"]]
    plain = [e for e in data["edges"] if not ids[e["s"]].startswith("supernode") and not ids[e["t"]].startswith("supernode")]
    assert plain, "no edges drawn"
    for e in plain:  # adjacency is [target, source]; the page draws source -> target
        s, t = int(ids[e["s"]]), int(ids[e["t"]])
        assert bool(pruned.edge_mask[t, s])
        assert e["w"] == pytest.approx(float(graph.adjacency_matrix[t, s]), rel=1e-4, abs=1e-6)
    n_kept = int(pruned.edge_mask.sum())
    assert len(data["edges"]) <= n_kept
    kinds = {n["kind"] for n in data["nodes"]}
    assert {"token", "logit"} <= kinds
    tokens = [n["label"] for n in data["nodes"] if n["kind"] == "token"]
    assert "".join(tokens) == PROMPT  # every position's token, hostile text included, as data
    page = (written["out"].dir / "graph_tiny-model_0.html").read_text()
    assert "<b>" not in page and "<title>../tiny model: attribution graph</title>" in page


def test_the_planted_circuit_page_draws_the_planted_edges(written):
    data = data_of(written["out"].dir / "circuit_planted_induction.html")
    ids = [n["id"] for n in data["nodes"]]
    drawn = {(ids[e["s"]], ids[e["t"]], e["label"]) for e in data["edges"]}
    assert interp.planted.truth("induction") <= drawn
    header = (written["out"].dir / "circuit_planted_induction.html").read_text()
    assert re.search(r"<span>CPR: [0-9.]+</span><span>CMD: [0-9.]+</span>", header)
    row = [r for r in written["rows"] if r["quantity"].startswith("planted induction circuit")]
    assert row[0]["measured"] == "5 of 5"


def test_numbers_name_the_scores(written):
    quantities = {r["quantity"] for r in written["rows"]}
    assert {"prompt 0: replacement score (pruned graph)", "prompt 0: completeness score (pruned graph)"} <= quantities
    scores = [r["measured"] for r in written["rows"] if "score" in r["quantity"]]
    assert all(0 <= s <= 1 for s in scores)


def test_every_feature_node_opens_its_feature_page(written):
    out = written["out"].dir
    data = data_of(out / "graph_tiny-model_0.html")
    urls = [n["url"] for n in data["nodes"] if n["kind"] == "feature"]
    assert urls and all(u for u in urls)
    for n in data["nodes"]:
        if n["kind"] == "feature":
            page, anchor = n["url"].split("#")
            assert page == f"tiny-model/mlp-{n['layer']}-transcoder.html"
            assert f"id='{anchor}'" in (out / page).read_text() and anchor == f"l{n['label'][1:]}"


def test_the_say_supernode_groups_the_last_features_that_push_the_top_logit():
    import pandas as pd

    nodes = pd.DataFrame(dict(id=["a", "b", "c", "d", "e", "x", "y"], kind=["feature"] * 5 + ["logit"] * 2,
                              layer=[1, 1, 1, 1, 0, 2, 2], pos=[5, 5, 5, 5, 5, 5, 5], feature=[1, 2, 3, 4, 5, -1, -1],
                              token=["", "", "", "", "", " Plax", " P"], probability=[None] * 5 + [0.9, 0.05]))
    edges = pd.DataFrame(dict(source=["a", "b", "c", "d", "e", "a"], target=["x", "x", "x", "x", "x", "y"],
                              weight=[1.0, 0.5, 0.2, -0.3, 2.0, 1.0]))
    assert graphs._supernodes(nodes, edges) == [("say  Plax x3", ["a", "b", "c"])]  # d pushes down, e is a layer lower
    assert graphs._supernodes(nodes, edges[edges.source != "c"]) == []  # fewer than 3: no group
