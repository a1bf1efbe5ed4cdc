"""The experiments' HTML pages come from autoescaped templates: text is escaped, our own markup is not."""
from experiments.pages import markup, render

EVIL = "<script>alert('x')</script> & \"quotes\""


def test_the_index_escapes_numbers_and_summaries_and_keeps_plot_divs():
    row = dict(model="gpt-4", quantity=EVIL, shown="1 < 2", chapter=None)
    figure = dict(div=markup("<div id='fig0'></div>"), caption=EVIL, file="a.html")
    section = dict(name="induction", summary=EVIL, rows=[row], links=[("x.html", EVIL)],
                   pages=[dict(href="g.html", text=EVIL)], figures=[figure])
    page = render("index.html.j2", title="t", css=markup(""), js="plotly.min.js", models=["gpt-4"], generated="now",
                  headline=[row], sections=[section])
    assert "<script>alert" not in page and "1 &lt; 2" in page and "<div id='fig0'></div>" in page
    assert "<a href='#induction'>induction</a>" in page and page.count("<table>") == 2
