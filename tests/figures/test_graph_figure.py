"""figures.graph: the graph page's layout (no two label boxes meet), escaping, slider data and supernodes."""
import json
import re
from html.parser import HTMLParser

import numpy as np
import pandas as pd
import pytest

from figures.graph import (
    CHAR_W,
    PAD,
    boxes_overlap,
    edge_widths,
    graph_layout,
    graph_page,
    merge_supernodes,
    page_data,
    shorten,
    slider_steps,
)

HOSTILE = "</script><b>bold</b><img src=x onerror=alert(1)>"


def crowded(n_pos=24, n_layers=4, per_cell=5, seed=0):
    """A graph with several features in every (layer, pos) cell, labels of random lengths, tokens, one logit."""
    rng = np.random.default_rng(seed)
    rows = [dict(id=f"t{p}", kind="token", layer=-1, pos=p, label=HOSTILE if p == 3 else "w" * int(rng.integers(1, 30)))
            for p in range(n_pos)]
    for layer in range(n_layers):
        for p in range(n_pos):
            for f in range(int(rng.integers(0, per_cell + 1))):
                rows.append(dict(id=f"f{layer}_{p}_{f}", kind="feature", layer=layer, pos=p,
                                 label="F" + "9" * int(rng.integers(1, 12)), influence=float(rng.random())))
    rows.append(dict(id="logit", kind="logit", layer=n_layers, pos=n_pos - 1, label=" Plax 0.93"))
    nodes = pd.DataFrame(rows)
    ids = nodes["id"].tolist()
    src, dst = rng.integers(0, len(ids), 200), rng.integers(0, len(ids), 200)
    edges = pd.DataFrame(dict(source=[ids[i] for i in src], target=[ids[j] for j in dst], weight=rng.normal(size=200)))
    return nodes, edges[edges.source != edges.target].drop_duplicates(["source", "target"]).reset_index(drop=True)


@pytest.mark.parametrize("n_pos,width", [(24, 1360), (64, 1360), (5, 400)])
def test_no_two_label_boxes_meet_and_all_fit_the_width(n_pos, width):
    nodes, _ = crowded(n_pos=n_pos)
    lay = graph_layout(nodes, width=width)
    boxes = lay[["x", "y", "w", "h"]].to_numpy()
    for i in range(len(boxes)):  # pairwise, written out (independent of boxes_overlap)
        x, y, w, h = boxes[i]
        for X, Y, W, H in boxes[i + 1:]:
            assert x + w <= X or X + W <= x or y + h <= Y or Y + H <= y, (lay.iloc[i].id, X, Y)
    assert boxes_overlap(lay) == []
    assert (lay.x >= 0).all() and (lay.x + lay.w <= width).all()
    # each box is exactly its shown label's width (the page stretches the text to it)
    assert np.allclose(lay.w, [len(t) * CHAR_W + 2 * PAD for t in lay.text])
    # layers go up: every box of a higher layer lies above every box of a lower one
    tops = lay.groupby("layer").y.min()
    bottoms = (lay.y + lay.h).groupby(lay.layer).max()
    assert all(bottoms[b] <= tops[a] for a, b in zip(tops.index[:-1], tops.index[1:]))


def test_boxes_overlap_finds_a_planted_overlap():
    lay = pd.DataFrame(dict(id=["a", "b", "c"], x=[0, 5, 100], y=[0, 5, 0], w=[10, 10, 10], h=[10, 10, 10]))
    assert boxes_overlap(lay) == [("a", "b")]


def test_nodes_stay_in_their_column_order_within_a_row():
    nodes = pd.DataFrame(dict(id=list("abcd"), kind="token", layer=0, pos=[0, 1, 2, 3], label=["x", "yy", "z", "w"]))
    lay = graph_layout(nodes, width=800)
    assert list(lay.sort_values("x").id) == list("abcd") and (lay.subrow == 0).all()


def test_shorten_marks_the_cut_and_shows_newlines():
    assert shorten("abcdef", 4) == "abc…" and shorten("a\nb", 5) == "a↵b" and shorten("ab", 5) == "ab"


class Tags(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.title, self._in_title, self.scripts, self._script = [], "", False, [], None

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self._in_title = tag == "title"
        if tag == "script":
            self._script = dict(attrs).get("id", "")
            self.scripts.append([self._script, ""])

    def handle_endtag(self, tag):
        self._in_title = False
        self._script = None if tag == "script" else self._script

    def handle_data(self, data):
        if self._in_title:
            self.title += data
        if self._script is not None:
            self.scripts[-1][1] += data


def test_hostile_labels_and_title_are_escaped():
    nodes, edges = crowded(n_pos=6)
    nodes.loc[nodes.kind == "logit", "detail"] = HOSTILE
    page = graph_page(nodes, edges, title="graph of " + HOSTILE, subtitle=HOSTILE, scores={HOSTILE: 0.5})
    assert "<b>" not in page and "<img" not in page
    parsed = Tags()
    parsed.feed(page)
    assert [t for t, _ in parsed.tags if t in ("b", "img")] == []
    assert parsed.title == "graph of " + HOSTILE
    assert [s[0] for s in parsed.scripts] == ["graph-data", ""]  # the hostile text opened no script
    data = json.loads(parsed.scripts[0][1])
    labels = {n["id"]: n["label"] for n in data["nodes"]}
    assert labels["t3"] == HOSTILE and data["nodes"][[n["id"] for n in data["nodes"]].index("logit")]["detail"] == HOSTILE


def test_the_page_fetches_nothing():
    nodes, edges = crowded(n_pos=6)
    nodes["url"] = [f"../features/x.html#l{i}" for i in range(len(nodes))]
    page = graph_page(nodes, edges, title="t")
    parsed = Tags()
    parsed.feed(page)
    for tag, attrs in parsed.tags:
        if tag in ("script", "link", "img", "iframe"):
            assert not re.match(r"\s*(https?:)?//", attrs.get("src", "") + attrs.get("href", "")), (tag, attrs)
    assert not re.search(r"<(script|link)[^>]*(src|href)=", page)


@pytest.mark.parametrize("url", ["javascript:alert(1)", " JavaScript:x", "data:text/html,x"])
def test_a_node_url_with_another_scheme_is_refused(url):
    nodes = pd.DataFrame(dict(id=["a"], kind="token", layer=0, pos=0, label="a", url=url))
    with pytest.raises(ValueError, match="only relative paths and http"):
        graph_page(nodes, pd.DataFrame(columns=["source", "target", "weight"]), title="t")


def test_slider_steps_edges_and_widths():
    nodes, edges = crowded(n_pos=8)
    data = page_data(nodes, edges)
    steps, a = data["steps"], np.array([e["a"] for e in data["edges"]])
    assert steps[0] == 0 and steps == sorted(steps) and len(set(steps)) == len(steps)
    assert steps[-1] == pytest.approx(a.max())
    shown = [(a >= s).sum() for s in steps]
    assert shown[0] == len(edges) and shown[-1] >= 1 and all(x >= y for x, y in zip(shown, shown[1:]))
    # edges drawn weakest first; each one's |w| and width as the input's
    assert list(a) == sorted(a)
    for e in data["edges"]:
        w = edges[(edges.source == data["nodes"][e["s"]]["id"]) & (edges.target == data["nodes"][e["t"]]["id"])].weight
        assert e["w"] == pytest.approx(float(w.iloc[0])) and e["a"] == pytest.approx(abs(e["w"]))
        assert e["sw"] == pytest.approx(0.6 + 5.4 * e["a"] / a.max(), abs=1e-3)
    assert edge_widths([2.0, -1.0, 0.0]) == [6.0, 3.3, 0.6]
    assert slider_steps([]) == [0.0]


def test_supernodes_sum_their_edges_and_drop_the_inner_ones():
    nodes = pd.DataFrame(dict(id=list("abcd"), kind="feature", layer=[0, 1, 2, 3], pos=[0, 2, 1, 1], label=list("ABCD")))
    edges = pd.DataFrame(dict(source=["a", "b", "a", "c", "d"], target=["c", "c", "b", "d", "a"],
                              weight=[1.0, 2.0, 5.0, -1.0, 0.25]))
    n, e = merge_supernodes(nodes, edges, [("A+B", ["a", "b"])])
    assert sorted(n.id) == ["c", "d", "supernode-0"]
    s = n.set_index("id").loc["supernode-0"]
    assert (s.kind, s.layer, s.pos, s.label, s.members) == ("supernode", 0, 1, "A+B", ["a", "b"])  # round(0.5) = 0
    got = {(r.source, r.target): r.weight for r in e.itertuples()}
    assert got == {("supernode-0", "c"): 3.0, ("c", "d"): -1.0, ("d", "supernode-0"): 0.25}
    page = graph_page(nodes, edges, title="t", supernodes=[("A+B", ["a", "b"])])
    data = json.loads(re.search(r'id="graph-data">(.*?)</script>', page, re.S).group(1))
    assert [x["members"] for x in data["nodes"] if x["kind"] == "supernode"] == [["a", "b"]]
    assert len(data["nodes"]) == 3 and len(data["edges"]) == 3


@pytest.mark.parametrize("groups,match", [([("x", ["zz"])], "not among"), ([("x", ["a"]), ("y", ["a", "b"])], "two supernodes"),
                                          ([("x", "ab")], "label, \\[node ids\\]"), ([("x", [])], "at least one")])
def test_bad_supernodes_are_named(groups, match):
    nodes = pd.DataFrame(dict(id=list("ab"), kind="feature", layer=0, pos=[0, 1], label=list("AB")))
    with pytest.raises(ValueError, match=match):
        merge_supernodes(nodes, pd.DataFrame(dict(source=["a"], target=["b"], weight=[1.0])), groups)


def test_missing_columns_and_unknown_edge_ends_are_named():
    nodes = pd.DataFrame(dict(id=["a"], kind="token", layer=0, pos=0, label="a"))
    with pytest.raises(ValueError, match="lacks column"):
        graph_layout(nodes.drop(columns="pos"))
    with pytest.raises(ValueError, match="not among the nodes' ids: \\['q'\\]"):
        page_data(nodes, pd.DataFrame(dict(source=["a"], target=["q"], weight=[1.0])))
