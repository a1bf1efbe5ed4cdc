"""Tuned-lens figures: both grids carry their own frame's cells and frames; curves show means and bands."""
import numpy as np
import pandas as pd
import pytest

import figures
from tests.figures.test_figures import TOKENS, lens_df

pytestmark = pytest.mark.filterwarnings("error::FutureWarning")


def test_side_by_side_holds_each_lens_grid_and_its_frames():
    logit, tuned = lens_df(TOKENS, 3, seed=0), lens_df(TOKENS, 3, seed=1)
    tuned["top_tokens"] = tuned["next_token"].map(lambda t: [t or "end", "a", "b"])  # tuned: always right
    fig = figures.lens_side_by_side(logit, tuned, title="gpt-4")
    a, b = fig.data
    for hm, df in ((a, logit), (b, tuned)):
        top1 = df.sort_values(["layer", "pos"]).top_probs.map(lambda p: p[0]).to_numpy().reshape(4, len(TOKENS))
        np.testing.assert_allclose(np.array(hm.z), top1)
    by_panel = {ref: {(round((s.y0 + s.y1) / 2), round((s.x0 + s.x1) / 2)) for s in fig.layout.shapes if s.yref == ref}
                for ref in ("y", "y2")}
    assert by_panel["y"] == {(l, p) for l in range(4) for p in range(len(TOKENS) - 1) if l >= p % 3}
    assert by_panel["y2"] == {(l, p) for l in range(4) for p in range(len(TOKENS) - 1)}
    assert fig.layout.yaxis2.ticktext[0] == "embedding" and fig.layout.yaxis2.autorange == "reversed"
    assert "gpt-4" in fig.layout.title.text
    with pytest.raises(ValueError, match="different layers or positions"):
        figures.lens_side_by_side(logit, lens_df(TOKENS, 2))


def test_comparison_curves_mean_and_band_per_lens():
    rows = [dict(lens=lens, seq=s, layer=l, kl_to_final=(3 - l) * (2 if lens == "logit" else 1) + s,
                 cross_entropy=5.0 - l + s) for lens in ("logit", "tuned") for s in range(5) for l in range(4)]
    df = pd.DataFrame(rows)
    fig = figures.lens_comparison_curves(df, title="gpt-4")
    lines = {t.name: t for t in fig.data if t.mode == "lines+markers" and t.yaxis == "y"}  # the KL panel
    assert list(lines["logit lens: mean"].y)[:4] == [8.0, 6.0, 4.0, 2.0]
    assert list(lines["tuned lens: mean"].y)[:4] == [5.0, 4.0, 3.0, 2.0]
    band = next(t for t in fig.data if t.fill == "toself" and t.legendgroup == "tuned" and t.yaxis == "y")
    assert list(band.y) == pytest.approx([3 + 3.6, 2 + 3.6, 1 + 3.6, 3.6, 0.4, 1.4, 2.4, 3.4])
    with pytest.raises(ValueError, match="lacks column"):
        figures.lens_comparison_curves(df.drop(columns="seq"))
