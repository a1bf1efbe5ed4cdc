"""Every tutorial runs as written on the shipped demos (and the pages' other examples that say they run)."""
import pytest

from tests.docs.pages import DOCS, blocks, missing_need, run_page

PAGES = sorted(DOCS.glob("tutorials/*.md")) + [DOCS / "getting-started.md", DOCS / "features.md"]


def test_each_tutorial_has_code_to_run():
    assert {p.stem for p in DOCS.glob("tutorials/*.md")} >= {"lens", "heads", "patching", "dictionaries", "graphs", "training"}
    for page in PAGES:
        assert any(language == "python" for language, _ in blocks(page)), page


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(DOCS)))
def test_the_page_runs_as_written(page, tmp_path, monkeypatch):
    need = missing_need(page)
    if need:
        pytest.skip(f"{page.name} needs {need}, which this checkout does not have yet")
    monkeypatch.chdir(tmp_path)  # what a page writes (a text file, a run folder) lands here
    run_page(page)
