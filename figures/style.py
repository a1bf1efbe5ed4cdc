"""What every figure shares: token escaping, the colour scale, axis ticks that stay readable.

Tokens go on numeric axes (their positions) with the strings as tick labels, never on categorical
axes: a text repeats tokens, and a categorical axis would merge the two "the"s into one column.
"""
from __future__ import annotations

import html
import math
from typing import TYPE_CHECKING, Sequence

import pandas as pd

if TYPE_CHECKING:
    import plotly.graph_objects as go

# One sequential scale for every probability, attention weight and head score (all in [0, 1]), so the
# same colour means the same number on every figure; a qualitative palette for models and components.
SCALE = "Viridis"
PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"]
FONT_SIZE = 11  # tick labels and cell text, in px
CHAR_W = 0.62 * FONT_SIZE  # width of one character in px (a conservative average for sans-serif)
LINE_H = 1.35 * FONT_SIZE  # height of one line of text in px
MAX_LABEL = 8  # token labels are cut to this many characters (plus an ellipsis)
MAX_WIDTH = 1340  # px: a figure's designed width at most (a 1400 px window's column is 1353 px); pages shrink it
RESPONSIVE = {"responsive": True}  # plotly's config for pages: the figure follows its container's width
MAX_TITLE = 110  # characters per title line: longer titles are cut off by narrow figures

_VISIBLE = {" ": "·", "\n": "⏎", "\t": "⇥", "\r": "␍"}


def escape_token(token) -> str:
    """A token string as a label: spaces as '·', newlines as '⏎', tabs as '⇥', other control
    characters as \\xNN, and HTML metacharacters escaped (plotly renders labels as HTML).

    >>> escape_token(" the\\n")
    '·the⏎'
    """
    if token is None or (isinstance(token, float) and math.isnan(token)):
        return ""
    out = []
    for ch in str(token):
        if ch in _VISIBLE:
            out.append(_VISIBLE[ch])
        elif ord(ch) < 32 or 0x7F <= ord(ch) < 0xA0:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return html.escape("".join(out), quote=False)


def short_label(token, limit: int = MAX_LABEL) -> str:
    """escape_token, cut to `limit` visible characters so labels fit their cell."""
    raw = escape_token(token)
    text = html.unescape(raw)
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return html.escape(text, quote=False)


def label_width(labels: Sequence[str]) -> float:
    """Pixel width of the longest (escaped) label, for sizing margins and cells."""
    longest = max((len(html.unescape(s)) for s in labels), default=1)
    return longest * CHAR_W


def token_axis(tokens: Sequence, angle: int = -90) -> dict:
    """Layout for an axis whose values are positions 0..n-1 and whose labels are the tokens."""
    return dict(
        tickmode="array",
        tickvals=list(range(len(tokens))),
        ticktext=[short_label(t) for t in tokens],
        tickangle=angle,
        tickfont=dict(size=FONT_SIZE),
        showgrid=False,
        zeroline=False,
    )


def require(df: pd.DataFrame, columns: Sequence[str], what: str) -> None:
    """Raise a clear error when a DataFrame lacks the columns a builder reads."""
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"{what}: expected a pandas DataFrame, got {type(df).__name__}")
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"{what}: DataFrame lacks column(s) {missing}; it has {list(df.columns)}")
    if df.empty:
        raise ValueError(f"{what}: the DataFrame is empty; there is nothing to plot")


def wrap(text: str, limit: int) -> str:
    """Break `text` at spaces into lines of at most `limit` characters, joined by <br>."""
    lines, line = [], ""
    for word in text.split(" "):
        if line and len(line) + 1 + len(html.unescape(word)) > limit:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return "<br>".join(lines + [line])


TITLE_CHAR_W, SUBTITLE_CHAR_W = 9.6, 7.2  # px per character of the title (17 px) and its <sup> line


def base_layout(title: str, subtitle: str = "", **extra) -> dict:
    """Title (with an optional smaller second line), white template and readable fonts.

    With a `width`, the title and subtitle are wrapped to fit it (never cut off at the figure's edge) and
    the top margin grows with their lines."""
    width = extra.get("width")
    if width:
        usable = max(int(width) - 40, 200)
        title = wrap(title, min(MAX_TITLE, int(usable / TITLE_CHAR_W)))
        subtitle = wrap(subtitle, int(usable / SUBTITLE_CHAR_W)) if subtitle else subtitle
        lines = title.count("<br>") + 1
        sub = (subtitle.count("<br>") + 1) if subtitle else 0
        margin = extra.get("margin") or {}
        margin = dict(margin if isinstance(margin, dict) else margin.to_plotly_json())
        top = int(margin.get("t") or 100)
        margin["t"] = max(top, 36 + 24 * lines + 17 * sub)
        if extra.get("height"):  # the plot area keeps its height
            extra["height"] = int(extra["height"]) + margin["t"] - top
        extra["margin"] = margin
    text = title + "".join(f"<br><sup>{line}</sup>" for line in subtitle.split("<br>")) if subtitle else title
    return dict(
        title=dict(text=text, x=0.0, xanchor="left"),
        template="plotly_white",
        font=dict(size=12),
        hoverlabel=dict(font=dict(family="monospace")),
        **extra,
    )


def responsive(fig: "go.Figure") -> "go.Figure":
    """A copy of `fig` for a web page: plotly's `autosize`, so the plot takes its container's width and
    lays itself out again when that changes (with `RESPONSIVE` as the page's config), instead of a fixed
    width clipped by a narrower window. The designed width stays the most it needs: read it from the
    original (`fig.layout.width`) to cap the container; the height is kept.

    >>> import plotly.graph_objects as go
    >>> fig = go.Figure(layout=dict(width=1200, height=400))
    >>> page = responsive(fig)
    >>> page.layout.width, page.layout.autosize, page.layout.height, fig.layout.width
    (None, True, 400, 1200)
    """
    import plotly.graph_objects as go

    page = go.Figure(fig)
    page.layout.width = None
    page.layout.autosize = True
    return page


def cell_text(values, fmt: str = "{:.2f}"):
    """Numbers as cell text, with "" (never "NaN") where a value is missing; keeps the array's shape."""
    import numpy as np

    arr = np.asarray(values, dtype=float)
    return np.vectorize(lambda v: "" if np.isnan(v) else fmt.format(v), otypes=[object])(arr) if arr.size else arr.astype(object)


def head_label(layer, head) -> str:
    """'L2H1' for a head, or the raw value for rows like 'top-3 together'."""
    try:
        return f"L{int(layer)}H{int(head)}"
    except (TypeError, ValueError):
        return str(head) if layer is None or (isinstance(layer, float) and math.isnan(layer)) else f"L{layer} {head}"


def round_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About `n` round tick values spanning [lo, hi]: a step of 1, 2, 2.5 or 5 x 10^k, the first tick at or
    below lo and the last at or above hi, so an axis ranged to them reads 4, 4.5, 5 and never 4.13, 4.817.

    >>> round_ticks(4.13, 5.505)
    [4.0, 4.5, 5.0, 5.5, 6.0]
    >>> round_ticks(-3.42, 0.22)
    [-4.0, -3.0, -2.0, -1.0, 0.0, 1.0]
    """
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError(f"round_ticks needs finite bounds, got {lo}, {hi}")
    lo, hi = min(lo, hi), max(lo, hi)
    if hi - lo < 1e-12:
        lo, hi = lo - 0.5, hi + 0.5
    raw = (hi - lo) / max(n - 1, 1)
    scale = 10 ** math.floor(math.log10(raw))
    step = next(m * scale for m in (1, 2, 2.5, 5, 10) if m * scale >= raw - 1e-12)
    first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
    return [float(round(k * step, 10)) for k in range(first, last + 1)]


def round_axis(values: Sequence[float], n: int = 5) -> dict:
    """Layout of a numeric axis over `values` with round ticks (`round_ticks`) and its range set to them."""
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    ticks = round_ticks(min(vals), max(vals), n) if vals else [0.0, 1.0]
    return dict(tickmode="array", tickvals=ticks, ticktext=[f"{t:g}" for t in ticks], range=[ticks[0], ticks[-1]])
