"""The feature pages come from autoescaped templates: a token, a description or a dictionary's name that looks
like HTML is shown as text, never read as markup; the plotly divs still arrive as markup."""
from html.parser import HTMLParser

import pandas as pd
import pytest

import interp
import sprout
from experiments.feature_pages import dictionary_page, model_page
from interp.saes.features import feature_report
from sprout.names import act_name

HOSTILE = "<script>alert(1)</script> & \"q\" 'q' <b>x</b>"
LABEL = "<i>resid_post</i> <0 & 'co'"
DEFINED = 10  # terms the definitions paragraph sets in bold: EV, CE rec., L0, dead, description, ... score


class Page(HTMLParser):
    """A page's tags (with attributes), its title, the token texts of its shaded contexts and its visible text."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.title, self.tokens, self.text = "", [], []
        self._open, self._in_ctx = None, False
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self._open = tag
        self._in_ctx = self._in_ctx or (tag == "div" and dict(attrs).get("class") == "ctx")
        if self._in_ctx and tag == "span":
            self.tokens.append("")

    def handle_endtag(self, tag):
        self._open = None
        self._in_ctx = self._in_ctx and tag != "div"

    def handle_data(self, data):
        if self._open == "title":
            self.title += data
        if self._in_ctx and self._open == "span":
            self.tokens[-1] += data
        if self._open != "script":
            self.text.append(data)


@pytest.fixture(scope="module")
def hostile_report():
    """gpt-4's last residual SAE read on a little text, then its tokens, summaries and a description made hostile."""
    model = sprout.load("gpt-4")
    sae = interp.load_sae(model, act_name("resid_post", int(model.cfg.n_layers) - 1))
    rep = feature_report(model, sae, interp.held_out_stories(1500, seed=3), n_show=2, n_examples=2, before=4, after=1)
    rep.contexts["token_str"] = [HOSTILE if off == 0 else t for t, off in zip(rep.contexts.token_str, rep.contexts.offset)]
    rep.table["summary"] = [HOSTILE if shown else s for s, shown in zip(rep.table.summary, rep.table.shown)]
    rep.logit_effects["token_str"] = HOSTILE  # into the figures' JSON: plotly escapes "<" there
    shown = rep.table.latent[rep.table.shown].tolist()
    scores = pd.DataFrame(dict(source="dictionary", index=shown, precision=0.5, recall=0.25, auroc=[0.9, 0.7][:len(shown)],
                               fuzz=0.5, description=HOSTILE))
    return rep, scores


def test_hostile_tokens_descriptions_and_names_are_text_on_a_dictionary_page(hostile_report):
    rep, scores = hostile_report
    page = dictionary_page(LABEL, "m<1>", rep, "plotly.min.js", scores)
    parsed = Page(page)
    assert len([t for t, _ in parsed.tags if t == "b"]) == DEFINED  # the definitions' own bold terms, none from the text
    assert [t for t, _ in parsed.tags if t == "i"] == []
    scripts = [a for t, a in parsed.tags if t == "script"]
    assert scripts[0] == {"src": "plotly.min.js"} and all(a == {} for a in scripts[1:])
    assert len(scripts) == 1 + 1 + 2  # plotly.js, the overview, one card per shown latent: no script from the text
    assert parsed.title == f"m<1>: {LABEL}"
    shown = len(rep.contexts.groupby(["latent", "example"]))
    assert parsed.tokens.count(HOSTILE) == shown  # each context's peak token, visible as the text it is
    visible = "".join(parsed.text)
    assert visible.count(HOSTILE) == shown + 2 * 2 + 2  # peaks, each latent's description in table and text, summaries
    assert "href='../m%3C1%3E.html'" in page  # the model's name as a link is a URL path, not markup


def test_a_hostile_dictionary_name_on_the_model_page():
    item = dict(label=LABEL, file="resid-post-0.html", kind="topk, d_sae 512, k 16", metrics=HOSTILE, score="5% / – / 0%")
    page = model_page("m<1>", [item], "../plotly.min.js")
    parsed = Page(page)
    assert [t for t, _ in parsed.tags if t in ("script", "i")] == ["script"]
    assert len([t for t, _ in parsed.tags if t == "b"]) == DEFINED
    assert parsed.title == "m<1>: features"
    links = [a["href"] for t, a in parsed.tags if t == "a"]
    assert links == ["../index.html", "m%3C1%3E/resid-post-0.html"]
    visible = "".join(parsed.text)
    assert LABEL in visible and HOSTILE in visible and "5% / – / 0%" in visible
