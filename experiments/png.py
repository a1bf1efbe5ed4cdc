"""PNG copies of figures without kaleido: headless Chromium screenshots of their HTML.

`python -m experiments.run_all --docs docs` uses this for the README's images.
"""
from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--virtual-time-budget=10000"]


def chromium() -> str:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    raise FileNotFoundError("no Chromium found (chromium, chromium-browser, google-chrome): "
                            "install it with `apt-get install -y chromium` to render PNGs")


def screenshot(fig, path, pad: int = 16) -> Path:
    """Render a plotly figure to `path` (PNG) at its layout size, without the mode bar."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    width, height = int(fig.layout.width or 900) + 2 * pad, int(fig.layout.height or 500) + 2 * pad
    with tempfile.TemporaryDirectory() as tmp:
        html = Path(tmp) / "figure.html"
        fig.write_html(html, include_plotlyjs="directory", config=dict(displayModeBar=False, responsive=False))
        # the page's body margin is about 8 px; the padding keeps the figure's edge in the shot
        cmd = [chromium(), *FLAGS, f"--user-data-dir={Path(tmp) / 'profile'}", f"--window-size={width},{height}",
               f"--screenshot={path.resolve()}", html.as_uri()]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if not path.is_file():
            raise RuntimeError(f"Chromium wrote no screenshot to {path}: {proc.stderr[-500:]}")
    return path
