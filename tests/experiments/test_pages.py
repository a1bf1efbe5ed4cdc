"""The experiments' HTML pages come from autoescaped templates: text is escaped, our own markup is not."""
from experiments.pages import markup, render

EVIL = "<script>alert('x')</script> & \"quotes\""


def test_text_in_a_page_is_escaped_and_figures_are_kept():
    page = render("features_index.html.j2", title=EVIL, css=markup("a>b{color:red}"), js="plotly.min.js",
                  dictionaries=[dict(href="m/d.html", label=EVIL, kind="topk, d_sae 64, k 4", metrics="EV 0.9")])
    assert "<script>alert" not in page and page.count("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp;") == 3
    assert "<style>a>b{color:red}</style>" in page and "<a href='m/d.html'>" in page


def test_the_index_escapes_numbers_and_summaries_and_keeps_plot_divs():
    row = dict(model="gpt-4", quantity=EVIL, shown="1 < 2", chapter=None)
    section = dict(name="induction", summary=EVIL, rows=[row], figures=[dict(div=markup("<div id='fig0'></div>"),
                                                                              caption=EVIL, file="a.html")])
    page = render("index.html.j2", title="t", css=markup(""), js="plotly.min.js", models=["gpt-4"], generated="now",
                  headline=[row], sections=[section])
    assert "<script>alert" not in page and "1 &lt; 2" in page and "<div id='fig0'></div>" in page
    assert "<a href='#induction'>induction</a>" in page and page.count("<table>") == 2


def test_a_dictionary_page_shades_each_token_escaped():
    latent = dict(latent=3, density=0.125, mean_act=1.5, max_act=2.0, summary=EVIL, card=markup("<div></div>"),
                  examples=[[dict(tok="<b>", act=2.0, alpha=1.0, peak=True), dict(tok="x", act=0.5, alpha=0.25, peak=False)]])
    page = render("dictionary.html.j2", title="m: d", css=markup(""), js="p.js", model_label="m", n_latents=64,
                  n_fired=10, overview=markup("<div></div>"), latents=[latent])
    assert "<span class=peak style='background:rgba(214,39,40,1.00)' title='2'>&lt;b&gt;</span>" in page
    assert "density 12.50%, mean activation 1.5, max 2." in page and "<script>alert" not in page
