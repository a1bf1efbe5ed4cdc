"""The generated blocks of the README and the documentation pages: the text between `<!-- NAME -->` and
`<!-- /NAME -->`, each written by one experiment's `--readme FILE` (`demo-table`, `english-table`,
`bos-table`, `features`, `circuit:gpt-4`, ...) and all of them by `python -m experiments.ship NAME --only
readme`. Nothing outside a block changes. `HOMES` says which file holds each block: the README keeps the
demo table; the others live on the site's pages (docs/)."""
from __future__ import annotations

from pathlib import Path

from sprout.files import folder_lock, read_bounded, replace_file

# block name (or its prefix, for the circuit blocks) -> the file that holds it, relative to the checkout
HOMES = {
    "demo-table": "README.md",
    "english-table": "docs/results/demos.md",
    "bos-table": "docs/guide/transformerlens.md",
    "features": "docs/guide/features.md",
    "circuit:": "docs/guide/circuits.md",
    "discovery": "docs/results/discovery.md",
    "discovery-summary": "README.md",
    "graph-finding": "docs/results/graph-finding.md",
    "graph-finding-summary": "README.md",
    "frontier": "docs/features.md",
    "shipped-dictionaries": "docs/features.md",
    "interpretability-scores": "docs/features.md",
    "held-out-sources": "docs/features.md",
    "clt": "docs/features.md",
}


def home(name: str, root: Path) -> Path:
    """The file under the checkout `root` that holds the block `name` (HOMES)."""
    for key, path in HOMES.items():
        if name == key or (key.endswith(":") and name.startswith(key)):
            return root / path
    raise ValueError(f"no file holds a block named {name!r}; the blocks are {', '.join(HOMES)}")


def markers(name: str) -> tuple[str, str]:
    return f"<!-- {name} -->", f"<!-- /{name} -->"


def _split(text: str, name: str) -> tuple[str, str, str]:
    start, end = markers(name)
    if text.count(start) != 1 or text.count(end) != 1 or text.index(start) > text.index(end):
        raise ValueError(f"the file needs exactly one {start} ... {end} block; nothing was written")
    head, rest = text.split(start)
    body, tail = rest.split(end)
    return head, body, tail


def block(text: str, name: str) -> str:
    """The body of the block `name` (without the newlines next to its markers)."""
    return _strip(_split(text, name)[1])


def _strip(body: str) -> str:
    body = body[1:] if body.startswith("\n") else body
    return body[:-1] if body.endswith("\n") else body


def replace_block(text: str, name: str, body: str) -> str:
    """`text` with the block `name`'s body replaced by `body` (taken literally)."""
    head, _, tail = _split(text, name)
    start, end = markers(name)
    return f"{head}{start}\n{body}\n{end}{tail}"


def md_table(frame) -> str:
    """A Markdown table of the DataFrame `frame`, floats to 3 decimals."""
    cells = [[f"{v:.3f}" if isinstance(v, float) else str(v) for v in row] for row in frame.itertuples(index=False)]
    head = ["| " + " | ".join(map(str, frame.columns)) + " |", "|" + " --- |" * len(frame.columns)]
    return "\n".join(head + ["| " + " | ".join(r) + " |" for r in cells])


def read(path) -> str:
    return read_bounded(Path(path), "README").decode("utf-8")


def rewrite(path, name: str, body: str) -> Path:
    """Replace the block `name` of the file `path` (atomically; refused, writing nothing, without its markers).
    Writers of one file take turns (its lock), so two experiments rewriting two of its blocks at once both land."""
    with folder_lock(path, what="a writer of its generated blocks"):
        return replace_file(Path(path).resolve(), replace_block(read(path), name, body).encode())


def rewrite_or_print(path, name: str, body: str) -> int:
    """`rewrite` the block `name` of `path`, or print `body` when `path` is None (a table script's `--readme`); 0."""
    if path:
        rewrite(path, name, body)
    else:
        print(body)
    return 0
