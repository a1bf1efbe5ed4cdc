"""Figure builders on small hand-built DataFrames with the columns `interp` documents."""
import html
import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest

import figures
from figures.style import CHAR_W, LINE_H, escape_token, label_width, short_label

pytestmark = pytest.mark.filterwarnings("error::FutureWarning")


# ----------------------------------------------------------------------------- helpers

def lens_df(tokens, n_layers, k=3, seed=0):
    """A logit-lens table whose top-1 at (layer, pos) is the next token exactly when layer >= pos % 3."""
    rng = np.random.default_rng(seed)
    rows = []
    for layer in range(n_layers + 1):
        for pos, tok in enumerate(tokens):
            nxt = tokens[pos + 1] if pos + 1 < len(tokens) else None
            hit = nxt is not None and layer >= pos % 3
            top = [nxt if hit else f"w{layer}_{pos}"] + [f"alt{j}" for j in range(k - 1)]
            p = np.sort(rng.dirichlet(np.ones(k + 1)))[::-1][:k]
            rows.append(dict(layer=layer, pos=pos, token=tok, next_token=nxt, top_tokens=top,
                             top_probs=list(p), p_next=p[0] if hit else 0.01, rank_next=0 if hit else 9))
    return pd.DataFrame(rows)


def attn_df(tokens, layer=0, heads=(0,)):
    rows = []
    for h in heads:
        for q in range(len(tokens)):
            w = np.arange(1, q + 2, dtype=float) ** (h + 1)
            w /= w.sum()
            for k in range(q + 1):
                rows.append(dict(layer=layer, head=h, query_pos=q, key_pos=k, query_token=tokens[q],
                                 key_token=tokens[k], weight=w[k]))
    return pd.DataFrame(rows)


def plot_px(fig, axis):
    """Pixels spanned by the plotting area along an axis ("x" or "y")."""
    lay = fig.layout
    m = lay.margin
    if axis == "x":
        return lay.width - (m.l if m.l is not None else 80) - (m.r if m.r is not None else 80)
    return lay.height - (m.t if m.t is not None else 100) - (m.b if m.b is not None else 80)


def assert_ticks_fit(fig, axis):
    """Labels along an axis do not overlap: rotated ones need a line each, flat ones their width."""
    ax = fig.layout.xaxis if axis == "x" else fig.layout.yaxis
    n = len(ax.tickvals)
    span = max(ax.tickvals) - min(ax.tickvals) + 1
    per_tick = plot_px(fig, axis) / span
    rotated = (axis == "x" and ax.tickangle in (-90, 90)) or (axis == "y" and ax.tickangle in (None, 0))
    need = LINE_H if rotated else label_width(ax.ticktext) + 2
    assert n and per_tick >= need * 0.98, (axis, per_tick, need)


TOKENS = ["The", " cat", " sat", "\n", " on", " <b>", " mat", "."]


# ----------------------------------------------------------------------------- escaping

def test_escape_token_shows_whitespace_and_escapes_html():
    assert escape_token(" the\n") == "·the⏎"
    assert escape_token("\t\x01") == "⇥\\x01"
    assert escape_token("<|endoftext|>") == "&lt;|endoftext|&gt;"
    assert escape_token("a&b") == "a&amp;b"
    assert escape_token(None) == "" and escape_token(float("nan")) == ""


# ----------------------------------------------------------------------------- logit lens

def test_logit_lens_grid_cells_frames_and_labels():
    n_layers = 4
    df = lens_df(TOKENS, n_layers)
    fig = figures.logit_lens_grid(df, title="gpt-4")
    (hm,) = fig.data
    assert isinstance(hm, go.Heatmap)
    z = np.array(hm.z)
    assert z.shape == (n_layers + 1, len(TOKENS))
    top1 = df.sort_values(["layer", "pos"])["top_probs"].map(lambda p: p[0]).to_numpy().reshape(z.shape)
    np.testing.assert_allclose(z, top1)
    assert (hm.zmin, hm.zmax) == (0, 1)

    # frames exactly where top-1 == next token: layer >= pos % 3, never at the last position
    expected = {(l, p) for l in range(n_layers + 1) for p in range(len(TOKENS) - 1) if l >= p % 3}
    framed = {(int(round((s.y0 + s.y1) / 2)), int(round((s.x0 + s.x1) / 2))) for s in fig.layout.shapes}
    assert framed == expected and len(fig.layout.shapes) == len(expected)

    # embedding at the top, output at the bottom
    assert fig.layout.yaxis.autorange == "reversed"
    assert fig.layout.yaxis.ticktext[0] == "embedding"
    assert "output" in fig.layout.yaxis.ticktext[-1] and str(n_layers) in fig.layout.yaxis.ticktext[-1]
    # escaped input tokens on the x axis, escaped top-1 text in the cells
    assert list(fig.layout.xaxis.ticktext) == ["The", "·cat", "·sat", "⏎", "·on", "·&lt;b&gt;", "·mat", "."]
    assert np.array(hm.text)[1, 0] == "·cat" and np.array(hm.text)[0, 7] == "w0_7"
    # hover lists every top-k token with its probability, and marks the next token
    hover = np.array(hm.customdata)[2, 1]
    row = df[(df.layer == 2) & (df.pos == 1)].iloc[0]
    for t, p in zip(row.top_tokens, row.top_probs):
        assert escape_token(t) in hover and f"{100 * p:5.1f}%" in hover
    assert "✓" in hover and "→ next ·sat" in hover
    assert fig.layout.xaxis.title.text and fig.layout.yaxis.title.text and "gpt-4" in fig.layout.title.text


def test_logit_lens_grid_64_tokens_fits_the_page_and_no_text_overflows_its_cell():
    from figures.style import MAX_WIDTH

    tokens = [f" tok{i}" if i % 5 else "\n" for i in range(64)]
    fig = figures.logit_lens_grid(lens_df(tokens, 8))
    hm = fig.data[0]
    assert np.array(hm.z).shape == (9, 64)
    assert len(fig.layout.xaxis.tickvals) == 64
    assert fig.layout.width <= MAX_WIDTH  # the whole grid fits a 1400 px window: no panel cut off
    assert_ticks_fit(fig, "x")
    cell_px = plot_px(fig, "x") / 64
    # each cell shows as much of its token as fits (cut with "…"), never more than its cell holds
    cells = [html.unescape(t) for t in np.array(hm.text).ravel()]
    assert hm.texttemplate == "%{text}" and all(len(t) * CHAR_W <= cell_px for t in cells)
    whole = [html.unescape(short_label(t, 6)) for t in lens_df(tokens, 8)["top_tokens"].map(lambda x: x[0])]
    assert all(w.startswith(c.rstrip("…")) for w, c in zip(whole, cells))  # each is the start of its token
    assert all(c == w for w, c in zip(whole, cells) if len(w) * CHAR_W + 6 <= cell_px)  # whole where it fits
    assert any(c for c in cells)  # written in the cells where they fit, not only on hover
    wider = figures.logit_lens_grid(lens_df(tokens[:40], 8)).data[0]  # cells of a few characters: cut with "…"
    cut = [html.unescape(t) for t in np.array(wider.text).ravel() if t.endswith("…")]
    assert cut and all(len(t) >= 2 for t in cut)
    short = figures.logit_lens_grid(lens_df(tokens[:16], 8)).data[0]
    assert short.texttemplate == "%{text}"  # a short text keeps its cell labels


def test_logit_lens_grid_picks_one_sequence_and_labels_mid_block_rows():
    a, b = lens_df(TOKENS, 2).assign(seq=0), lens_df(TOKENS[::-1], 2, seed=1).assign(seq=1)
    fig = figures.logit_lens_grid(pd.concat([a, b]), seq=1)
    assert fig.layout.xaxis.ticktext[0] == "."
    mid = lens_df(TOKENS, 2)
    mid["layer"] = mid["layer"].map({0: 0, 1: 0.5, 2: 1})
    assert list(figures.logit_lens_grid(mid).layout.yaxis.ticktext) == [
        "embedding", "block 1 mid (after attention)", "after block 1 = output"]


def test_logit_lens_grid_rejects_bad_input():
    with pytest.raises(ValueError, match="top_probs"):
        figures.logit_lens_grid(lens_df(TOKENS, 2).drop(columns="top_probs"))
    with pytest.raises(ValueError, match="rows for"):
        figures.logit_lens_grid(lens_df(TOKENS, 2).iloc[:-1])


# ----------------------------------------------------------------------------- residual stream

def rms_df(model, scale):
    """Rows as interp.residual_rms gives them: `layer` is the depth in blocks, `kind` says stream or write."""
    rows = [dict(site="blocks.0.hook_resid_pre", kind="stream", layer=0.0, mean=0.2 * scale)]
    for l in range(2):
        rows += [dict(site=f"blocks.{l}.hook_attn_out", kind="attn_out", layer=l + 0.5, mean=123.0),
                 dict(site=f"blocks.{l}.hook_resid_mid", kind="stream", layer=l + 0.5, mean=rows[-1]["mean"] * 3),
                 dict(site=f"blocks.{l}.hook_resid_post", kind="stream", layer=l + 1.0, mean=rows[-1]["mean"] * 9)]
    df = pd.DataFrame(rows).assign(model=model)
    return df.assign(q05=df["mean"] / 2, q50=df["mean"] * 0.9, q95=df["mean"] * 2, growth=1.0)


def test_residual_rms_bands_and_log_axis():
    df = pd.concat([rms_df("gpt-1", 1), rms_df("gpt-4", 2)])
    fig = figures.residual_rms(df)
    assert fig.layout.yaxis.type == "log"
    assert "RMS" in fig.layout.yaxis.title.text and "depth" in fig.layout.xaxis.title.text
    means = [t for t in fig.data if t.name.endswith(": mean")]
    bands = [t for t in fig.data if t.fill == "toself"]
    assert len(means) == 2 and len(bands) == 2 and len(fig.data) == 6  # + a median line each
    # depth is the frame's `layer`; what a block writes (attention outputs) is not the stream
    assert list(means[0].x) == [0, 0.5, 1, 1.5, 2]
    g = rms_df("gpt-1", 1)
    stream = g[g.kind == "stream"]
    np.testing.assert_allclose(means[0].y, stream["mean"])
    np.testing.assert_allclose(bands[0].y, list(stream.q95) + list(stream.q05)[::-1])
    assert list(fig.layout.xaxis.ticktext) == ["embedding", "block 1", "block 2"]


# ----------------------------------------------------------------------------- heads

def scores_df(n_layers, n_heads, seed):
    rng = np.random.default_rng(seed)
    return pd.DataFrame([dict(layer=l, head=h, score=rng.random()) for l in range(n_layers) for h in range(n_heads)])


def test_head_scores_one_heatmap_per_kind_with_the_scores():
    kinds = {"previous_token": scores_df(4, 3, 0), "induction": scores_df(4, 3, 1)}
    fig = figures.head_scores(kinds, title="gpt-4")
    assert [type(t) for t in fig.data] == [go.Heatmap, go.Heatmap]
    for trace, d in zip(fig.data, kinds.values()):
        z = np.array(trace.z, dtype=float)
        assert z.shape == (4, 3)  # layer x head
        for r in d.itertuples():
            assert z[r.layer, r.head] == pytest.approx(r.score)
        assert (trace.zmin, trace.zmax, trace.colorscale) == (fig.data[0].zmin, fig.data[0].zmax, fig.data[0].colorscale)
        assert "layer" in trace.hovertemplate and "head" in trace.hovertemplate
    assert [a.text for a in fig.layout.annotations] == ["previous-token", "induction"]
    assert sum(t.showscale is not False for t in fig.data) == 1


def test_ablation_bars_sorted_with_labels():
    df = pd.DataFrame(dict(layer=[0, 2, 1, -1], head=[1, 0, 2, -1], label=["L0H1", "L2H0", "L1H2", "L0H1+L2H0+L1H2"],
                           method="zero", loss_clean=[2.0] * 4, loss_ablated=[2.1, 2.9, 2.0, 3.5]))
    df["delta"] = df.loss_ablated - df.loss_clean
    fig = figures.ablation_bars(df)
    (bar,) = fig.data
    assert isinstance(bar, go.Bar)
    assert list(bar.x) == ["L0H1+L2H0+L1H2", "L2H0", "L0H1", "L1H2"]
    np.testing.assert_allclose(bar.y, [1.5, 0.9, 0.1, 0.0], atol=1e-12)
    assert "nats" in fig.layout.yaxis.title.text and "zero ablation" in fig.layout.title.text
    both = figures.ablation_bars(pd.concat([df, df.assign(method="mean", loss_ablated=2.5, delta=0.5)]))
    assert [t.name for t in both.data] == ["zero ablation", "mean ablation"]


# ----------------------------------------------------------------------------- attention

def test_attention_heatmap_tokens_on_both_axes_and_causal_blank():
    df = attn_df(TOKENS, layer=1, heads=(0, 2))
    fig = figures.attention_heatmap(df, layer=1, head=2)
    (hm,) = fig.data
    z = np.array(hm.z, dtype=float)
    assert z.shape == (8, 8)
    assert np.isnan(z[np.triu_indices(8, 1)]).all()
    np.testing.assert_allclose(np.nansum(z, axis=1), 1.0)
    expected = ["The", "·cat", "·sat", "⏎", "·on", "·&lt;b&gt;", "·mat", "."]
    assert list(fig.layout.xaxis.ticktext) == expected and list(fig.layout.yaxis.ticktext) == expected
    assert "head 2" in fig.layout.title.text and "layer 1" in fig.layout.title.text
    with pytest.raises(ValueError, match="one head"):
        figures.attention_heatmap(df)


def test_attention_heatmap_64_tokens_labels_fit():
    tokens = [f" w{i}" for i in range(64)]
    fig = figures.attention_heatmap(attn_df(tokens))
    assert len(fig.layout.xaxis.ticktext) == 64
    assert_ticks_fit(fig, "x")
    assert_ticks_fit(fig, "y")


def test_attention_grid_64_tokens_labels_fit_each_panel():
    fig = figures.attention_grid(attn_df([f" w{i}" for i in range(64)], heads=(0, 1, 2)), cols=3)
    m = fig.layout.margin
    plot_w = fig.layout.width - (m.l if m.l is not None else 80) - (m.r if m.r is not None else 80)
    for ax in (fig.layout.xaxis, fig.layout.xaxis2, fig.layout.xaxis3):
        panel_px = plot_w * (ax.domain[1] - ax.domain[0])
        step = ax.tickvals[1] - ax.tickvals[0]
        assert ax.tickangle == -90 and panel_px / 64 * step >= LINE_H * 0.9, (panel_px, step)


def test_attention_grid_one_panel_per_head():
    df = attn_df(TOKENS, layer=3, heads=(0, 1, 2, 3))
    fig = figures.attention_grid(df, cols=3)
    assert len(fig.data) == 4 and all(isinstance(t, go.Heatmap) for t in fig.data)
    assert [a.text for a in fig.layout.annotations] == ["head 0", "head 1", "head 2", "head 3"]
    assert sum(t.showscale is not False for t in fig.data) == 1
    np.testing.assert_allclose(np.array(fig.data[3].z, dtype=float)[7, :], attn_df(TOKENS, 3, (3,)).weight[-8:])
    assert list(fig.layout.xaxis4.ticktext) == ["The", "·cat", "·sat", "⏎", "·on", "·&lt;b&gt;", "·mat", "."]
    with pytest.raises(ValueError, match="one layer"):
        figures.attention_grid(pd.concat([df, attn_df(TOKENS, layer=0)]))


# ----------------------------------------------------------------------------- induction

def test_induction_table_rows_per_model_and_occurrence():
    probs = {("gpt-1", 1): [0.001, 0.002, 0.0005], ("gpt-1", 2): [0.004, 0.005, 0.001],
             ("gpt-4", 1): [0.001, 0.003, 0.001], ("gpt-4", 2): [0.05, 0.98, 0.93]}
    df = pd.DataFrame([dict(model=m, occurrence=o, token_index=i, token=t, pos=10 * o + i, prob=p[i])
                       for (m, o), p in probs.items() for i, t in enumerate([" Z", "orbin", " Plax"])])
    fig = figures.induction_table(df)
    (hm,) = fig.data
    z = np.array(hm.z, dtype=float)
    assert z.shape == (4, 3)
    np.testing.assert_allclose(z, [probs[k] for k in probs])
    assert list(np.array(hm.text)[3]) == ["5%", "98%", "93%"] and np.array(hm.text)[0, 0] == "<1%"
    assert list(fig.layout.yaxis.ticktext) == ["gpt-1 · 1st time", "gpt-1 · 2nd time", "gpt-4 · 1st time", "gpt-4 · 2nd time"]
    assert list(fig.layout.xaxis.ticktext) == ["·Z", "orbin", "·Plax"]
    # another tokenizer (a character model): columns become pieces, each cell names its token
    chars = pd.DataFrame([dict(model="char", occurrence=o, token_index=i, token=c, prob=0.5)
                          for o in (1, 2) for i, c in enumerate(" Zo")])
    mixed = figures.induction_table(pd.concat([df, chars]))
    assert list(mixed.layout.xaxis.ticktext) == ["piece 1", "piece 2", "piece 3"]
    assert np.array(mixed.data[0].text)[3, 1] == "orbin<br>98%" and np.array(mixed.data[0].text)[5, 0] == "·<br>50%"
    with pytest.raises(ValueError, match="one name per figure"):
        figures.induction_table(pd.concat([df.assign(name="Zorbin Plax"), df.assign(name="Mira")]))
    # interp.induction_stories: aggregated, no token strings
    agg = df.rename(columns={"prob": "mean_prob"}).drop(columns="token")
    agg["occurrence"] = agg["occurrence"].map({1: "first", 2: "later"})
    fig = figures.induction_table(agg, prob="mean_prob")
    assert list(fig.layout.xaxis.ticktext) == ["piece 1", "piece 2", "piece 3"]
    assert fig.layout.yaxis.ticktext[1] == "gpt-1 · later"


def test_induction_over_training_highlights_top_heads():
    rows = []
    for t in [1e5, 1e6, 1e7, 1e8]:
        for l in range(2):
            for h in range(3):
                final = 0.9 if (l, h) == (1, 2) else 0.1 * h
                rows.append(dict(tokens=t, layer=l, head=h, score=final * (t >= 1e7), val_loss=5 - math.log10(t) / 3))
    fig = figures.induction_over_training(pd.DataFrame(rows), top=2)
    heads = [t for t in fig.data if t.name.startswith("L")]
    assert len(heads) == 6 and heads[0].name == "L1H2" and heads[0].showlegend and not heads[2].showlegend
    np.testing.assert_allclose(heads[0].y, [0, 0, 0.9, 0.9])
    assert fig.layout.xaxis.type == "log" and fig.data[-1].yaxis == "y2"


# ----------------------------------------------------------------------------- params and training

def test_param_breakdown_stacks_to_the_total():
    parts = ["embedding", "attention", "ffn"]
    df = pd.DataFrame(dict(config=["gpt-1"] * 4 + ["sprout"] * 4, part=parts + ["total"] + parts + ["total"],
                           count=[1572864, 110592, 294912, 1978368, 3145728, 4719616, 9437184, 17302528]))
    fig = figures.param_breakdown(df)
    assert fig.layout.barmode == "stack" and len(fig.data) == 6  # counts and shares, 3 parts each
    counts, shares = fig.data[0::2], fig.data[1::2]
    np.testing.assert_array_equal(np.sum([np.array(t.y) for t in counts], axis=0), [1978368, 17302528])
    np.testing.assert_allclose(np.sum([np.array(t.y) for t in shares], axis=0), [1, 1])
    np.testing.assert_allclose(shares[0].y, [1572864 / 1978368, 3145728 / 17302528])
    notes = [a.text for a in fig.layout.annotations]
    assert notes[:2] == ["parameters", "share of the parameters"]
    assert notes[2].startswith("1,978,368") and "embedding 80%" in notes[2]
    assert "parameters" in fig.layout.yaxis.title.text
    many = pd.concat([df.assign(config=df.config + f" {i}") for i in range(4)])  # 8 presets
    assert figures.param_breakdown(many).layout.width <= 1200  # fits a 1400-px page


def test_loss_curves_train_and_held_out():
    log = pd.DataFrame(dict(step=range(6), tokens=np.arange(6) * 1000, train_loss=[9, 6, 5, 4, 3.5, 3.0],
                            val_loss=[9.1, None, None, 4.2, None, 3.1], lr=[1e-3] * 6))
    fig = figures.loss_curves(pd.concat([log.assign(model="gpt-1"), log.assign(model="gpt-4")]))
    assert len(fig.data) == 4
    np.testing.assert_allclose(fig.data[1].y, [9.1, 4.2, 3.1])
    with_rep = figures.loss_curves(log.assign(rep_second=[8, None, None, 2, None, 1]))
    assert len(with_rep.data) == 3 and list(with_rep.data[2].y) == [8, 2, 1]
    np.testing.assert_allclose(fig.data[1].x, [0, 3000, 5000])
    assert "nats" in fig.layout.yaxis.title.text and "tokens" in fig.layout.xaxis.title.text
    with pytest.raises(ValueError, match="val_loss"):
        figures.loss_curves(log.drop(columns="val_loss"))


def test_rope_distance_one_flat_line_per_distance():
    df = pd.DataFrame([dict(m=m, n=m - d, distance=d, score=float(d)) for d in (1, 3) for m in range(3, 40, 9)])
    fig = figures.rope_distance(df)
    assert [t.name for t in fig.data] == ["m - n = 1", "m - n = 3"]
    assert list(fig.data[1].y) == [3.0] * 5 and list(fig.data[1].x) == list(range(3, 40, 9))


def test_builders_take_interp_output_unchanged(tiny_cfg):
    """The real DataFrames of `interp` (not hand-made ones) go straight into the builders."""
    import dataclasses

    import torch

    import interp
    from sprout import Sprout
    from sprout.tokenizer import train_bpe

    text = "Once Zorbin Plax met Mira. Then Zorbin Plax left. " * 2
    torch.manual_seed(0)
    tiny_model = Sprout(dataclasses.replace(tiny_cfg, vocab_size=300), tokenizer=train_bpe(text * 4, vocab_size=300)).eval()
    lens = interp.logit_lens(tiny_model, text, k=3)
    n_pos = lens["pos"].nunique()
    fig = figures.logit_lens_grid(lens)
    assert np.array(fig.data[0].z).shape == (3, n_pos)
    assert len(fig.layout.shapes) == int(lens["is_top1"].sum())
    rms = interp.residual_rms(tiny_model, text)
    assert len(figures.residual_rms(rms).data) == 3
    scores = interp.head_scores(tiny_model, "induction", half_len=8, n_seqs=2)
    assert np.array(figures.head_scores(scores).data[0].z).shape == (2, 4)
    top2 = [(int(l), int(h)) for l, h in zip(scores["layer"][:2], scores["head"][:2])]
    abl = interp.ablate_heads(tiny_model, top2, half_len=8, n_seqs=2)
    assert len(figures.ablation_bars(abl).data[0].x) == 3
    att = interp.attention_patterns(tiny_model, text, layer=1)
    assert len(figures.attention_grid(att).data) == 4
    assert np.array(figures.attention_heatmap(att, head=0).data[0].z).shape == (n_pos, n_pos)
    table = interp.induction_table({"tiny": tiny_model}, text, "Zorbin Plax")
    assert len(figures.induction_table(table).layout.yaxis.ticktext) == table["occurrence"].nunique()
    from sprout import SproutConfig
    params = pd.concat([interp.param_table(SproutConfig.preset(p), p) for p in ("gpt-1", "sprout")])
    notes = [a.text for a in figures.param_breakdown(params).layout.annotations]
    assert notes[-1].startswith("17,309,056") and "embedding 18%" in notes[-1]
    assert len(figures.rope_distance(interp.rope_distance_check()).data) == 2
