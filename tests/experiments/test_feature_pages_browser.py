"""The feature pages render in headless Chromium: every plot drawn, no JavaScript errors, nothing wider than 1400 px.

Needs Debian's `chromium`, as tests/experiments/test_browser.py (whose helpers this reuses); without it
these tests fail, on purpose.
"""
import json
import re
import shutil

import pytest
import torch

import interp
import sprout
from experiments.common import Models
from experiments.run_all import run_all
from interp._core.identity import fingerprint, model_config
from sprout import Sprout, SproutConfig
from sprout.material import generate_corpus
from sprout.tokenizer import train_bpe

from .test_browser import BROWSERS, browse, ink, js_errors, read_png

PROBE = """<script>window.addEventListener('load', () => setTimeout(() => {
  const cut = [...document.querySelectorAll('figure')].filter(f => f.scrollWidth > f.clientWidth + 1).map(f => f.scrollWidth);
  document.body.setAttribute('data-probe', JSON.stringify({page: document.documentElement.scrollWidth,
    window: window.innerWidth, cut, plots: document.querySelectorAll('.plot-container.plotly').length,
    divs: document.querySelectorAll('.plotly-graph-div').length, shaded: document.querySelectorAll('.ctx span').length}));
}, 500));</script></body>"""


@pytest.fixture(scope="module")
def chromium():
    path = next((shutil.which(name) for name in BROWSERS if shutil.which(name)), None)
    if path is None:
        pytest.fail("no Chromium found: install it with `apt-get update && apt-get install -y chromium` (.ci/run does)")
    return path


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    root = tmp_path_factory.mktemp("features")
    tok = train_bpe(generate_corpus(10_000, seed=5), vocab_size=300)
    torch.manual_seed(0)
    sprout.save(Sprout(SproutConfig(vocab_size=300, context=128, n_layer=2, n_head=2, d_model=32, d_ff=64), tok), root / "tiny")
    model = sprout.load(root / "tiny")
    for layer in range(2):  # dictionaries beside the checkpoint, as a user's would be
        for d, folder in ((interp.SAE(32, 64, kind="topk", k=4, hook_name=f"blocks.{layer}.hook_resid_post", seed=layer),
                           f"blocks.{layer}.hook_resid_post"),
                          (interp.Transcoder(32, 64, kind="topk", k=4, layer=layer, seed=layer), f"transcoder-{layer}")):
            d.model_fingerprint, d.model_config = fingerprint(model), model_config(model)
            d.save(root / "tiny" / "saes" / folder)
    out = root / "results"
    models = Models({"tiny": model}, {"tiny": root / "tiny"})  # the folder: where its dictionaries are
    run_all(models, out, only=["features"], progress=False, options={"features": ["--chars", "3000", "--show", "4"]})
    return out / "features"


def probe(chromium, tmp_path, page, shot):
    probed = page.with_name(page.stem + "_probe.html")
    probed.write_text(page.read_text(encoding="utf-8").replace("</body>", PROBE), encoding="utf-8")
    dom, console = browse(chromium, tmp_path, probed.as_uri(), "--dump-dom", f"--screenshot={shot}", width=1400, height=1400)
    assert not js_errors(console), console
    found = re.search(r'data-probe="([^"]*)"', dom)
    assert found, f"the probe script did not run on {page.name}"
    return json.loads(found.group(1).replace("&quot;", '"'))


def test_every_dictionary_has_a_page_linked_from_the_model_page(pages):
    index = (pages / "tiny.html").read_text(encoding="utf-8")
    linked = re.findall(r"href='(tiny/[^']+\.html)'", index)
    assert sorted(linked) == sorted(f"tiny/{p.name}" for p in (pages / "tiny").glob("*.html") if "_probe" not in p.name)
    assert len(linked) == 4


def test_dictionary_pages_render_every_plot_and_fit_1400px(chromium, pages, tmp_path):
    """A residual SAE's page and a transcoder's (the same writer makes every page)."""
    for page in (pages / "tiny" / "resid-post-1.html", pages / "tiny" / "mlp-0-transcoder.html"):
        shot = tmp_path / f"{page.stem}.png"
        seen = probe(chromium, tmp_path, page, shot)
        assert seen["divs"] >= 2 and seen["plots"] == seen["divs"], (page.name, seen)  # overview + a card per latent
        assert seen["shaded"] > 0, f"{page.name} shows no shaded context tokens"
        assert seen["page"] <= seen["window"] and seen["cut"] == [], (page.name, seen)
        assert ink(read_png(shot)) > 0.03, f"the screenshot of {page.name} is (nearly) blank"
