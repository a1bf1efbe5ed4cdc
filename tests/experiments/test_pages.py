"""The pages the experiments write: each standalone figure titled, every figure as wide as its page allows
(plotly autosize and the responsive config) and never wider than it was designed."""
import re

import plotly.graph_objects as go

from experiments.common import Output, figure_div, standalone_html


def figure(width=1200, height=400):
    return go.Figure(go.Bar(x=[1, 2], y=[3, 4]), layout=dict(width=width, height=height, title=dict(text="t")))


def test_a_standalone_page_has_its_caption_as_title_and_follows_the_window(tmp_path):
    out = Output(tmp_path / "exp", "exp")
    fig = figure()
    path = out.figure(fig, "bars", "Heights & widths <per layer>")
    page = path.read_text(encoding="utf-8")
    assert "<title>Heights &amp; widths &lt;per layer&gt;</title>" in page
    assert '"responsive": true' in page and '"autosize":true' in page
    assert '"width":1200' not in page and "max-width:1200px" in page  # capped at its design, not fixed to it
    assert "height:400px" in page
    assert fig.layout.width == 1200 and fig.layout.autosize is None  # the builder's figure is left as it was
    assert "src='../plotly.min.js'" in page or "src='plotly.min.js'" in page


def test_a_figure_without_a_designed_width_fills_its_container():
    div = figure_div(go.Figure(go.Bar(x=[1], y=[1])), div_id="f0")
    assert "max-width" not in div and 'id="f0"' in div and re.search(r"width:\s*100%", div)
    assert standalone_html(figure(), "a", "plotly.min.js").startswith("<!doctype html><html><head><meta charset='utf-8'><title>a</title>")
