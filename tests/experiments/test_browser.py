"""The written HTML renders in a real browser: headless Chromium draws the plots without JavaScript errors.

Needs Debian's `chromium` (installed by .ci/run). Without it these tests fail, on purpose: a figure
nobody has seen render is not a tested figure.
"""
import html
import json
import re
import shutil
import struct
import subprocess
import zlib

import numpy as np
import pytest
import torch

import sprout
from experiments.run_all import run_all
from sprout import Sprout, SproutConfig
from sprout.material import generate_corpus
from sprout.tokenizer import train_bpe

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--enable-logging=stderr", "--v=0", "--virtual-time-budget=10000"]


@pytest.fixture(scope="module")
def chromium():
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    pytest.fail("no Chromium found (looked for chromium, chromium-browser, google-chrome): install it with "
                "`apt-get update && apt-get install -y chromium` (.ci/run does this) to run the browser tests")


def browse(chromium, tmp_path, url, *mode, width=1400, height=1000):
    """Run headless Chromium with a fresh profile; returns (stdout, the console lines of its log)."""
    profile = tmp_path / f"profile{len(list(tmp_path.glob('profile*')))}"
    proc = subprocess.run([chromium, *FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}", *mode, url],
                          capture_output=True, text=True, timeout=120)
    console = [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]
    return proc.stdout, console


def js_errors(console):
    return [line for line in console if re.search(r"error|uncaught|not defined|failed", line, re.I)]


def read_png(path):
    """8-bit RGB(A) PNG -> an array [height, width, 3]; enough for Chromium's screenshots."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    pos, idat = 8, b""
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", chunk)
            assert depth == 8 and color in (2, 6) and interlace == 0, "unexpected PNG format"
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    bpp = 4 if color == 6 else 3
    raw, stride = np.frombuffer(zlib.decompress(idat), dtype=np.uint8), width * bpp
    out, prev = np.zeros((height, stride), dtype=np.uint8), np.zeros(stride, dtype=np.int64)
    for y in range(height):
        f, line = raw[y * (stride + 1)], raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)].astype(np.int64)
        if f == 1:  # Sub: a running sum along each channel
            line = line.reshape(width, bpp).cumsum(0).reshape(-1) & 255
        elif f == 2:  # Up
            line = (line + prev) & 255
        elif f in (3, 4):  # Average, Paeth: sequential along the row
            for i in range(stride):
                a = line[i - bpp] if i >= bpp else 0
                b, c = prev[i], prev[i - bpp] if i >= bpp else 0
                if f == 3:
                    line[i] = (line[i] + (a + b) // 2) & 255
                else:
                    p = a + b - c
                    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                    line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        out[y], prev = line, line
    return out.reshape(height, width, bpp)[..., :3]


def ink(pixels) -> float:
    """Fraction of pixels that are not white."""
    return float((pixels != 255).any(-1).mean())


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = tmp_path_factory.mktemp("browser")
    tok = train_bpe(generate_corpus(10_000, seed=5) + " Mira Tolk", vocab_size=300)
    torch.manual_seed(0)
    sprout.save(Sprout(SproutConfig(vocab_size=300, context=128, n_layer=2, n_head=2, d_model=32, d_ff=64), tok),
                root / "tiny")
    model = sprout.load(root / "tiny")
    out = root / "results"
    done = run_all({"tiny": model}, out, progress=False,
                   options={"residual_growth": ["--chars", "2000"], "logit_lens": ["--chars", "1000"],
                            "training_dynamics": ["--chars", "1000"], "tuned_lens": ["--chars", "1000"]})
    return out, done


def test_index_renders_every_plot_without_errors(chromium, results, tmp_path):
    out, done = results
    n_figures = sum(len(o.figures) for _, o, _ in done.values())
    shot = tmp_path / "index.png"
    dom, console = browse(chromium, tmp_path, (out / "index.html").as_uri(), "--dump-dom", f"--screenshot={shot}",
                          height=1600)
    assert not js_errors(console), console
    # plotly replaces each figure's empty div with a plot container holding its SVG layers
    assert dom.count('class="plot-container plotly"') == n_figures, "not every plot on index.html was drawn"
    assert dom.count('class="main-svg"') >= 2 * n_figures
    assert ink(read_png(shot)) > 0.03, "the index screenshot is (nearly) blank"


PROBE = """<script>window.addEventListener('load', () => setTimeout(() => {
  const cut = [...document.querySelectorAll('figure')].filter(f => f.scrollWidth > f.clientWidth + 1)
    .map(f => [f.querySelector('.plotly-graph-div').id, f.scrollWidth, f.clientWidth,
               f.querySelector('figcaption').textContent.slice(0, 40)]);
  document.body.setAttribute('data-probe', JSON.stringify({page: document.documentElement.scrollWidth, window: window.innerWidth, cut}));
}, 500));</script></body>"""


def test_index_reads_in_a_1400px_window_without_sideways_scrolling(chromium, results, tmp_path):
    """No figure is wider than its column (the parameter chart's share panel and the lens grids used to be
    cut off), and the page itself never scrolls sideways."""
    out, _ = results
    probe = out / "index_probe.html"
    probe.write_text((out / "index.html").read_text(encoding="utf-8").replace("</body>", PROBE), encoding="utf-8")
    dom, console = browse(chromium, tmp_path, probe.as_uri(), "--dump-dom", width=1400)
    assert not js_errors(console), console
    found = re.search(r'data-probe="([^"]*)"', dom)
    assert found, "the probe script did not run"
    seen = json.loads(found.group(1).replace("&quot;", '"'))
    assert seen["page"] <= seen["window"], seen
    assert seen["cut"] == [], f"figures wider than the page's column (id, width, column, caption): {seen['cut']}"


LAYOUT_PROBE = """<script>window.addEventListener('load', () => setTimeout(() => {
  const inside = (a, b) => a.left >= b.left - 1 && a.right <= b.right + 1 && a.top >= b.top - 1 && a.bottom <= b.bottom + 1;
  const overlap = (a, b) => a.left < b.right - 1 && b.left < a.right - 1 && a.top < b.bottom - 1 && b.top < a.bottom - 1;
  const out = [...document.querySelectorAll('.plotly-graph-div')].map(div => {
    const svg = div.querySelector('svg.main-svg'), box = svg.getBoundingClientRect();
    const title = div.querySelector('.gtitle');
    const outside = [...div.querySelectorAll('.gtitle, .colorbar, .legend, .xtick text, .ytick text, .y2tick text, .annotation')]
      .filter(e => { const r = e.getBoundingClientRect(); return r.width > 0 && !inside(r, box); })
      .map(e => (e.getAttribute('class') || e.parentNode.getAttribute('class')) + ': ' + e.textContent.slice(0, 30));
    const clashes = [];
    for (const sel of ['.xtick text', '.ytick text', '.y2tick text']) {
      for (const axis of div.querySelectorAll('.xaxislayer-above, .yaxislayer-above, .overaxes-above')) {
        const ticks = [...axis.querySelectorAll(sel)].map(e => [e.textContent, e.getBoundingClientRect()]).filter(t => t[1].width > 0);
        for (let i = 1; i < ticks.length; i++)
          if (overlap(ticks[i - 1][1], ticks[i][1])) clashes.push(ticks[i - 1][0] + ' / ' + ticks[i][0]);
      }
    }
    const nan = [...div.querySelectorAll('text')].filter(e => /^\\s*NaN\\s*$/.test(e.textContent)).length;
    return {id: div.id, width: box.width, title: title ? title.getBoundingClientRect().width : 0, outside, clashes, nan};
  });
  document.body.setAttribute('data-probe', JSON.stringify(out));
}, 500));</script></body>"""


def test_every_figure_fits_1400px_with_its_title_ticks_and_colour_bar_inside(chromium, results, tmp_path):
    """Each figure is at most 1400 px wide; its title, colour bar, legend, annotations and tick labels lie
    inside it (nothing cut off at an edge); neighbouring tick labels do not overlap; no cell reads "NaN"."""
    out, done = results
    figs = [f.fig for _, o, _ in done.values() for f in o.figures]
    assert all((f.layout.width or 700) <= 1400 for f in figs), [(f.layout.title.text, f.layout.width) for f in figs
                                                                 if (f.layout.width or 700) > 1400]
    probe = out / "index_layout.html"
    probe.write_text((out / "index.html").read_text(encoding="utf-8").replace("</body>", LAYOUT_PROBE), encoding="utf-8")
    dom, console = browse(chromium, tmp_path, probe.as_uri(), "--dump-dom", width=1400, height=1000)
    assert not js_errors(console), console
    found = re.search(r'data-probe="([^"]*)"', dom)
    assert found, "the probe script did not run"
    seen = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    assert len(seen) == len(figs)
    assert [s for s in seen if s["width"] > 1400] == []
    assert [(s["id"], s["outside"]) for s in seen if s["outside"]] == []
    assert [(s["id"], s["clashes"][:3]) for s in seen if s["clashes"]] == []
    assert [s["id"] for s in seen if s["nan"]] == []
    assert all(s["title"] <= s["width"] for s in seen)


def test_long_titles_are_wrapped_to_the_figure_width():
    """A title longer than its figure is broken into lines that fit, never cut at the edge."""
    import figures
    from figures.style import MAX_TITLE, TITLE_CHAR_W, base_layout

    title = "Ablating the top induction heads, gpt-4: the change in loss when heads are removed, one at a time"
    layout = base_layout(title, "a subtitle " * 20, width=560, height=400)
    lines = layout["title"]["text"].split("<br>")
    assert len(lines) > 2 and all(len(re.sub("<[^>]+>", "", line)) * TITLE_CHAR_W <= 560 for line in lines[:2])
    assert all(len(re.sub("<[^>]+>", "", line)) <= MAX_TITLE for line in lines)
    assert layout["margin"]["t"] > 100 and layout["height"] > 400
    assert figures is not None


def test_logit_lens_figure_fills_its_plot_area(chromium, results, tmp_path):
    out, done = results
    (fig,) = [f for f in done["logit_lens"][1].figures]
    layout = fig.fig.layout
    shot = tmp_path / "lens.png"
    _, console = browse(chromium, tmp_path, fig.html.as_uri(), f"--screenshot={shot}",
                        width=int(layout.width) + 40, height=int(layout.height) + 40)
    assert not js_errors(console), console
    pixels = read_png(shot)
    # the heatmap's cells cover the plot area (between the margins), apart from 1-px gaps and text
    m = layout.margin
    top, bottom = int(m.t) + 10, int(layout.height - m.b) - 10
    left, right = int(m.l) + 10, int(layout.width - m.r) - 110  # leave out the colour bar
    area = pixels[top:bottom, left:right]
    assert ink(area) > 0.6, f"only {ink(area):.0%} of the lens plot area is drawn"
    colours = len(np.unique(area.reshape(-1, 3), axis=0))
    # cells, text and frames, not a flat fill; a grid too wide for its cells' text (64 tokens in 1400 px)
    # drops the text, and then the 1-px gaps between its cells still show
    assert colours > 5 if fig.fig.data[0].texttemplate else colours >= 2


def test_broken_page_is_caught(chromium, tmp_path):
    """The console check itself works: a page whose script throws is reported."""
    page = tmp_path / "bad.html"
    page.write_text("<html><body><script>Plotly.newPlot('x', [])</script></body></html>")
    _, console = browse(chromium, tmp_path, page.as_uri(), "--dump-dom")
    assert js_errors(console)


def test_png_screenshot_of_a_figure_has_its_size_and_content(chromium, tmp_path):
    """experiments.png renders the README's PNGs without kaleido: the figure's size plus padding."""
    import pandas as pd

    import figures
    from experiments.png import screenshot

    fig = figures.rope_distance(pd.DataFrame(dict(m=[3, 10, 20], n=[0, 7, 17], distance=3, score=[1.0, 1.0, 1.0])))
    path = screenshot(fig, tmp_path / "docs" / "rope.png", pad=16)
    pixels = read_png(path)
    assert pixels.shape[:2] == (int(fig.layout.height) + 32, int(fig.layout.width) + 32)
    assert 0.01 < ink(pixels) < 0.5


GRAPH_PROBE = """<script>window.addEventListener('load', () => setTimeout(() => {
  const box = e => { const r = e.getBoundingClientRect(); return {l: r.left, r: r.right, t: r.top, b: r.bottom}; };
  const nodes = [...document.querySelectorAll('g.node')].filter(g => g.style.display !== 'none').map(g => (
    {id: g.dataset.id, text: g.querySelector('text').textContent, label: box(g.querySelector('text')),
     rect: box(g.querySelector('rect'))}));
  const edges = [...document.querySelectorAll('path.edge')].map(p => (
    {i: +p.dataset.index, sw: +p.getAttribute('stroke-width'), shown: p.style.display !== 'none', d: p.getAttribute('d')}));
  const D = window.graphData, last = D.steps.length - 1;
  const target = D.edges.length ? D.edges[D.edges.length - 1].t : 0;
  window.graphShow(target);
  const panel = document.getElementById('panel').textContent;
  window.graphPrune(last);
  const pruned = [...document.querySelectorAll('path.edge')].filter(p => p.style.display !== 'none').length;
  document.body.setAttribute('data-probe', JSON.stringify({nodes, edges, panel, pruned, target,
    bold: document.querySelectorAll('b, img').length, page: document.documentElement.scrollWidth, window: window.innerWidth}));
}, 300));</script></body>"""


def graph_probe(chromium, tmp_path, page):
    """Open a graph page at 1400 px with GRAPH_PROBE appended; returns (what it saw, the page's own data)."""
    probed = tmp_path / f"probe_{page.name}"
    text = page.read_text(encoding="utf-8")
    probed.write_text(text.replace("</body>", GRAPH_PROBE), encoding="utf-8")
    dom, console = browse(chromium, tmp_path, probed.as_uri(), "--dump-dom", width=1400, height=1000)
    assert not js_errors(console), console
    found = re.search(r'data-probe="([^"]*)"', dom)
    assert found, "the probe script did not run"
    seen = json.loads(html.unescape(found.group(1)))
    data = json.loads(re.search(r'id="graph-data">(.*?)</script>', text, re.S).group(1))
    return seen, data


def crowded_page(tmp_path):
    """An attribution-like page: 24 positions, several features a cell, a hostile token, at 1400 px."""
    from figures.graph import graph_page
    from tests.figures.test_graph_figure import crowded

    nodes, edges = crowded(n_pos=24)
    page = tmp_path / "crowded.html"
    group = nodes[nodes.kind == "feature"].id.tolist()[:2]
    page.write_text(graph_page(nodes, edges, "crowded", scores={"replacement score": 0.9}, supernodes=[("group", group)]),
                    encoding="utf-8")
    return page


@pytest.mark.parametrize("which", ["planted circuit", "crowded graph"])
def test_a_graph_page_draws_its_nodes_widths_and_labels_without_overlap(chromium, results, tmp_path, which):
    """The SVG holds every node with its label, inside its box, no two labels meeting at 1400 px; each edge
    as wide as the data says; the slider's last step leaves the strongest edges; a click lists edges."""
    out, _ = results
    page = out / "graphs" / "circuit_planted_induction.html" if which == "planted circuit" else crowded_page(tmp_path)
    seen, data = graph_probe(chromium, tmp_path, page)
    linked = {e[k] for e in data["edges"] for k in ("s", "t")}
    expected = {n["id"] for i, n in enumerate(data["nodes"]) if n["kind"] in data["always"] or i in linked}
    assert {n["id"] for n in seen["nodes"]} == expected and len(seen["nodes"]) == len(expected)
    texts = {n["id"]: n["text"] for n in data["nodes"]}
    assert all(n["text"] == texts[n["id"]] for n in seen["nodes"])
    labels = [n["label"] for n in seen["nodes"]]
    assert all(b["r"] - b["l"] > 0 for b in labels)
    for n in seen["nodes"]:  # the text is drawn inside its box
        a, r = n["label"], n["rect"]
        assert r["l"] - 1 <= a["l"] and a["r"] <= r["r"] + 1 and r["t"] - 1 <= a["t"] and a["b"] <= r["b"] + 1, n
    clash = [(x["id"], y["id"]) for i, x in enumerate(seen["nodes"]) for y in seen["nodes"][i + 1:]
             if x["label"]["l"] < y["label"]["r"] and y["label"]["l"] < x["label"]["r"]
             and x["label"]["t"] < y["label"]["b"] and y["label"]["t"] < x["label"]["b"]]
    assert clash == []
    assert [e["sw"] for e in sorted(seen["edges"], key=lambda e: e["i"])] == [e["sw"] for e in data["edges"]]
    assert all(e["shown"] and e["d"].startswith("M") for e in seen["edges"])
    assert seen["pruned"] == sum(e["a"] >= data["steps"][-1] for e in data["edges"]) >= 1
    n_in = sum(e["t"] == seen["target"] for e in data["edges"])
    assert f"incoming ({n_in})" in seen["panel"] and data["nodes"][seen["target"]]["label"] in seen["panel"]
    assert seen["bold"] == 0 and seen["page"] <= seen["window"]
