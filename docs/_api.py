"""mkdocs hook: one API page per room, generated from the `api_rooms` list in mkdocs.yml.

Each room is a title and the modules whose docstrings make its page (`::: module`, mkdocstrings). The
list in mkdocs.yml is the one place to change when a room moves: the pages, the API index and the
navigation follow it. Runs only inside `mkdocs build` / `mkdocs serve`; nothing imports it.
"""
from __future__ import annotations

import re
from typing import Any

from mkdocs.structure.files import File, Files

API_TITLE = "API"


def _rooms(config: Any) -> list[tuple[str, list[str]]]:
    rooms = config["extra"].get("api_rooms") or {}
    return [(title, [modules] if isinstance(modules, str) else list(modules)) for title, modules in rooms.items()]


def _slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


def _page(title: str, modules: list[str]) -> str:
    """A room's page: each module's docstring and public members; a package's top level only."""
    parts = [f"# {title}\n"]
    for module in modules:
        top_only = module in ("interp", "sprout", "figures")  # their members are documented in the rooms
        options = "\n    options:\n      members: false" if top_only else ""
        parts.append(f"::: {module}{options}\n")
    return "\n".join(parts)


def _index(rooms: list[tuple[str, list[str]]]) -> str:
    lines = ["# API", "", "One page per room, generated from the docstrings (the room list is `api_rooms` in mkdocs.yml).", "",
             "| room | modules |", "|---|---|"]
    lines += [f"| [{title}]({_slug(title)}.md) | {', '.join(f'`{m}`' for m in modules)} |" for title, modules in rooms]
    return "\n".join(lines) + "\n"


def on_config(config: Any) -> Any:
    """Put the rooms into the navigation's API section."""
    entries: list = ["api/index.md"] + [{title: f"api/{_slug(title)}.md"} for title, _ in _rooms(config)]
    nav = config.get("nav") or []
    for i, item in enumerate(nav):
        if isinstance(item, dict) and API_TITLE in item:
            nav[i] = {API_TITLE: entries}
    return config


def on_files(files: Files, config: Any) -> Files:
    """Write the API pages among the site's files."""
    rooms = _rooms(config)
    files.append(File.generated(config, "api/index.md", content=_index(rooms)))
    for title, modules in rooms:
        files.append(File.generated(config, f"api/{_slug(title)}.md", content=_page(title, modules)))
    return files
