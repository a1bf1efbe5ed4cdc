"""Read the documentation's code blocks and run them as a reader would: each page's blocks in order, in
one namespace, in a fresh folder; `sprout ...` lines of bash blocks through the `sprout` command."""
from __future__ import annotations

import importlib
import re
import shlex
from pathlib import Path

import sprout_cli

DOCS = Path(__file__).resolve().parents[2] / "docs"
BLOCK = re.compile(r"^(?:<!-- needs: ([\w.]+) -->\n)?```(python|bash)\n(.*?)^```", re.S | re.M)
NEEDS = re.compile(r"<!-- needs: ([\w.]+) -->\n\n")  # a page whose code needs a name another branch adds
# (a marker right above a block, with no blank line between, skips only that block)


def blocks(page: Path) -> list[tuple[str, str]]:
    """(language, code) of every python and bash block of a page whose needs are met, in order."""
    found = BLOCK.finditer(page.read_text(encoding="utf-8"))
    return [(m.group(2), m.group(3)) for m in found if not (m.group(1) and missing(m.group(1)))]


def missing(need: str) -> bool:
    """Whether `module.name` is not there (another branch adds it)."""
    module, _, name = need.rpartition(".")
    try:
        return not hasattr(importlib.import_module(module), name)
    except ImportError:
        return True


def missing_need(page: Path) -> str | None:
    """The first page-wide `<!-- needs: module.name -->` that is not there, or None."""
    return next((need for need in NEEDS.findall(page.read_text(encoding="utf-8")) if missing(need)), None)


def run_shell(code: str) -> None:
    """Each `sprout ...` command of a bash block, in process (other lines are shown, not run)."""
    for line in code.replace("\\\n", " ").splitlines():
        line = line.split(" #")[0].strip()
        if line.startswith("sprout "):
            name, *rest = shlex.split(line)[1:]
            # the command's own main: sprout_cli.main would also set this test process's allocator
            run = sprout_cli.COMMANDS[name][0] if name in sprout_cli.COMMANDS else lambda _: sprout_cli.main([name])
            assert (run(rest) or 0) == 0, line


def run_page(page: Path) -> dict:
    namespace: dict = {"__name__": f"docs.{page.stem}"}
    for language, code in blocks(page):
        if language == "python":
            exec(compile(code, str(page), "exec"), namespace)
        else:
            run_shell(code)
    return namespace
