"""The README and the documentation site: short README, links that resolve, a site that builds offline
from one list of API rooms (the build itself, `mkdocs build --strict`, is in the README's test command)."""
import importlib.util
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\]\(([^)#\s]+)(#[^)\s]*)?\)")


class _Loader(yaml.SafeLoader):
    """mkdocs.yml as data (it has no custom tags; a tag would be read as a plain value)."""


def mkdocs_config() -> dict:
    return yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=_Loader)


def test_the_readme_is_one_screen_of_what_a_newcomer_needs():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200
    for heading in ("## Set-up", "## A tour in the REPL", "## What the shipped demo models show"):
        assert heading in text
    assert "<!-- demo-table -->" in text and "minutes" in text.split("## Set-up")[1].split("## A tour")[0]


def test_the_readme_test_command_is_what_ci_runs_and_builds_the_site():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    command = [line for line in readme.splitlines() if "python -m pytest" in line]
    assert len(command) == 1 and "mkdocs build --strict" in command[0]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "mkdocs build --strict" in ci
    steps = [s.strip() for s in command[0].split("&&")]
    for step in steps[steps.index("ruff check ."):]:  # the checks themselves, in the same order
        assert step.replace("mypy", "python3 -m mypy").replace("python -m", "python3 -m").replace("mkdocs", "python3 -m mkdocs") in ci, step


def test_every_relative_link_of_the_readme_and_the_pages_resolves():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    for page in pages:
        for target, _ in LINK.findall(page.read_text(encoding="utf-8")):
            if "://" in target or target.startswith("mailto:"):
                continue
            path = (page.parent / target).resolve()
            # the site's pages may link its generated API pages (docs/_api.py); the README may not
            generated = page != ROOT / "README.md" and path.is_relative_to(ROOT / "docs" / "api")
            assert path.exists() or generated, f"{page.relative_to(ROOT)} links to {target}, which does not exist"


def test_the_site_fetches_nothing_and_its_api_rooms_import():
    config = mkdocs_config()
    assert config["theme"]["font"] is False and config["strict"] is True
    assert not any(str(v).startswith("http") for v in config.get("extra_css", []) + config.get("extra_javascript", []))
    rooms = config["extra"]["api_rooms"]
    assert {"Lens", "Heads", "Patching", "Dictionaries", "Measures"} <= set(rooms)
    for title, modules in rooms.items():
        for module in modules:
            assert importlib.util.find_spec(module) is not None, f"API room {title}: no module {module}"
    nav_pages = re.findall(r":\s+([\w/.-]+\.md)", (ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    assert all((ROOT / "docs" / page).exists() for page in nav_pages), nav_pages


def test_the_api_pages_follow_the_room_list():
    import importlib

    hook = importlib.import_module("docs._api")

    class Config(dict):
        pass

    config = Config(extra={"api_rooms": {"Lens": ["interp.lens"], "interp": ["interp"]}}, nav=[{"API": []}])
    hook.on_config(config)
    assert config["nav"] == [{"API": ["api/index.md", {"Lens": "api/lens.md"}, {"interp": "api/interp.md"}]}]
    assert hook._page("Lens", ["interp.lens"]) == "# Lens\n\n::: interp.lens\n"
    assert "members: false" in hook._page("interp", ["interp"])
    assert "| [Lens](lens.md) | `interp.lens` |" in hook._index(hook._rooms(config))
