"""The circuit figures on small hand-built frames: heads placed by their integer columns, never by their labels."""
import math

import numpy as np
import pandas as pd
import pytest

import figures

pytestmark = pytest.mark.filterwarnings("error::FutureWarning")


def _circuit_frame():
    rows = []
    for (sender, layer, head), share_k in ((("L0H0", 0, 0), 0.6), (("L0H1", 0, 1), 0.0), (("L1H0", 1, 0), 0.01)):
        for via in ("q", "k", "v"):
            share = share_k if via == "k" else 0.0
            rows.append(dict(receiver="L2H1", sender=sender, via=via, share_repeated=share, feeds=share > 0.02,
                             sender_layer=layer, sender_head=head, receiver_layer=2, receiver_head=1))
    return pd.DataFrame(rows)


def test_composition_heatmap_blanks_cells_at_or_below_the_baseline():
    comp = pd.DataFrame(dict(sender=["L0H0", "L0H1", "L0H0"], receiver=["L1H0", "L1H0", "L1H1"],
                             score=[0.3, 0.05, 0.2], baseline=0.07, kind="k", sender_layer=0, sender_head=[0, 1, 0],
                             receiver_layer=1, receiver_head=[0, 0, 1]))
    fig = figures.composition_heatmap(comp)
    z = np.array(fig.data[0].z, dtype=float)
    assert fig.data[0].y == ("L0H0", "L0H1") and fig.data[0].x == ("L1H0", "L1H1")
    assert z[0, 0] == pytest.approx(0.3) and math.isnan(z[1, 0])  # 0.05 is below the random 0.07
    assert "random 0.07" in fig.data[0].colorbar.ticktext[0]


def test_circuit_graph_draws_only_the_feeding_edges():
    fig = figures.circuit_graph(_circuit_frame())
    edges = [t for t in fig.data if t.mode == "lines" and t.x[0] is not None]
    assert len(edges) == 1 and "L0H0 -> L2H1 (keys)" in edges[0].hovertemplate
    nodes = fig.data[-1]
    assert list(nodes.text) == ["L0H0", "L0H1", "L1H0", "L2H1"]
    assert [(x, -y) for x, y in zip(nodes.x, nodes.y)] == [(0, 0), (0, 1), (1, 0), (2, 1)]


def test_circuit_figures_place_heads_by_their_integer_columns_not_their_labels():
    frame = _circuit_frame()
    frame["sender"] = frame["sender"].map({"L0H0": "first", "L0H1": "second", "L1H0": "third"})
    frame.loc[frame["sender"] == "first", ["sender_layer", "sender_head"]] = (1, 5)  # now the last sender
    nodes = figures.circuit_graph(frame).data[-1]
    assert list(nodes.text) == ["second", "third", "first", "L2H1"]
    assert list(figures.path_patching_matrix(frame).data[0].y) == ["second", "third", "first"]


def test_path_patching_matrix_and_dla_bars_and_scatter():
    m = figures.path_patching_matrix(_circuit_frame())
    assert list(m.data[0].x) == ["L2H1 queries", "L2H1 keys", "L2H1 values"]
    assert np.array(m.data[0].z, dtype=float)[0, 1] == pytest.approx(0.6)
    dla = pd.DataFrame(dict(seq=0, pos=[3, 3, 3], component=["embed", "L0H0", "MLP0"], kind=["embed", "head", "mlp"],
                            attribution=[0.5, -2.0, 1.0]))
    bars = figures.dla_bars(dla)
    assert list(bars.data[0].x) == ["L0H0", "MLP0", "embed"]  # largest |share| first
    sc = figures.attribution_scatter(pd.DataFrame(dict(metric=[0.0, 1.0, 2.0], estimate=[0.1, 0.9, 2.2], label=list("abc"))))
    assert "r = 0.99" in sc.layout.title.text
    with pytest.raises(ValueError, match="lacks column"):
        figures.circuit_graph(pd.DataFrame(dict(sender=["L0H0"])))
