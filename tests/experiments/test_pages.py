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
    assert 'src="plotly.min.js"' in page  # the folder's shared copy


def test_a_figure_without_a_designed_width_fills_its_container():
    div = figure_div(go.Figure(go.Bar(x=[1], y=[1])), div_id="f0")
    assert "max-width" not in div and 'id="f0"' in div and re.search(r"width:\s*100%", div)
    assert standalone_html(figure(), "a", "plotly.min.js").startswith("<!doctype html><html><head><meta charset='utf-8'><title>a</title>")


def test_the_index_page_names_one_top_head_per_kind(tmp_path):
    """head_detection states the top heads and their scores; attention_maps draws the same heads, with the
    same scores in its captions, and states no head score of its own (it once used other settings)."""
    import torch

    import sprout
    from experiments.run_all import run_all
    from sprout import Sprout, SproutConfig
    from sprout.material import generate_corpus
    from sprout.tokenizer import train_bpe

    torch.manual_seed(2)
    tok = train_bpe(generate_corpus(15_000, seed=3) + " Zorbin Plax", vocab_size=300)
    sprout.save(Sprout(SproutConfig(vocab_size=300, context=64, n_layer=2, n_head=2, d_model=32, d_ff=64), tok),
                tmp_path / "tiny")
    done = run_all({"tiny": sprout.load(tmp_path / "tiny")}, tmp_path / "results",
                   only=["head_detection", "attention_maps"], progress=False)
    stated = {r["quantity"]: r["measured"] for r in done["head_detection"][2]}
    assert [r["quantity"] for r in done["attention_maps"][2]] == ["tokens of the text drawn"]
    captions = {f.stem: f.caption for f in done["attention_maps"][1].figures}
    assert stated["top induction head (score)"] in captions["induction_tiny"]
    assert stated["top previous-token head (score)"] in captions["previous_token_tiny"]
