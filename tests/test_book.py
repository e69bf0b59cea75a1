"""The book as a whole: the full build is the integration test of every chapter."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import ROOT
import page_times

pytestmark = pytest.mark.book

CHAPTER_HEADER = """---
jupytext:
  text_representation:
    extension: .md
    format_name: myst
kernelspec:
  display_name: Python 3
  language: python
  name: python3
---
"""


def toc_files() -> list[str]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]]
    for part in toc.get("parts", []):
        files += [c["file"] for c in part["chapters"]]
    return files


def test_full_build_is_clean_and_executes_every_chapter(built_book):
    """Built with -W -n from an empty cache (see conftest): any warning or failing cell fails it."""
    log = (built_book.parents[1] / "build.log").read_text()
    assert "build succeeded" in log
    for f in toc_files():
        assert (built_book / (f + ".html")).is_file(), f
    notebooks = [f for f in toc_files() if "code-cell" in (ROOT / (f + ".md")).read_text()]
    executed = re.findall(r"(\S+\.md): Executed notebook in ([\d.]+) seconds", log)
    assert {Path(p).stem for p, _ in executed} == {Path(f).name for f in notebooks}
    # tools/build_book.py executed the pages; Jupyter Book found every one in the cache and
    # executed none again (a notebook read differently from myst-nb's would miss the cache)
    assert "Executing notebook using" not in log, log[-3000:]
    # the executed notebooks are offered for download next to the sources
    for f in notebooks:
        assert (built_book / "_sources" / (f + ".ipynb")).is_file()


def test_the_build_runs_an_identical_launch_once(built_book):
    """Chapter 3 and the schedules' deeper page make the same launch; the build ran it once and
    answered the second page with that run (ppbook_tools.zygote's memo, its own test in
    tests/test_launch_dist.py)."""
    log = (built_book.parents[1] / "build.log").read_text()
    assert "answered from an identical earlier launch: 03_gpipe.py --check --microbatches 1 2 4 8" in log, log[-3000:]


def test_every_page_records_its_execution_time(built_book):
    """The times that `make page-times` holds against the budget exist for every executed page.
    The budget itself is not asserted here: a test that fails on time fails on a loaded machine."""
    seconds = page_times.page_seconds(built_book)
    notebooks = [f for f in toc_files() if "code-cell" in (ROOT / (f + ".md")).read_text()]
    assert set(seconds) == {Path(f).name for f in notebooks}, seconds
    assert all(s > 0 for s in seconds.values()), seconds
    assert page_times.main(["--path-output", str(built_book.parents[1]), "--budget", "1e9"]) == 0


def test_the_page_report_flags_a_page_over_budget():
    assert page_times.over_budget({"fast": 30.0, "slow": 200.0}, 120.0) == {"slow": 200.0}
    assert page_times.over_budget({"fast": 30.0}, 120.0) == {}


def test_no_glue_or_role_left_unrendered(built_book):
    for page in built_book.rglob("book/*.html"):
        text = page.read_text()
        assert "{glue" not in text and "{numref" not in text and "{cite" not in text, page
        # a dollar sign glued to a math span: `$$...$$` inside a paragraph, parsed as two inline maths
        assert '$<span class="math' not in text, page


def _mini_book(tmp_path: Path, cell: str, prose: str = "Text.", keep_cache: bool = False,
               repository: str | None = None) -> subprocess.CompletedProcess:
    """A one-page book with the real _config.yml, whose only code cell is ``cell``, followed by
    the paragraph ``prose``, built as `make book` builds (``keep_cache``: as `make book-cached`;
    ``repository``: with ``ppbook_repository`` set to it, as whoever publishes the book sets it)."""
    text = (ROOT / "_config.yml").read_text()
    if repository is not None:
        text, n = re.subn(r'(?m)^(\s*ppbook_repository:) .*$', rf'\1 "{repository}"', text)
        assert n == 1, "_config.yml has no ppbook_repository line"
    (tmp_path / "_config.yml").write_text(text)
    shutil.copytree(ROOT / "_vendor", tmp_path / "_vendor", dirs_exist_ok=True)
    shutil.copytree(ROOT / "tools", tmp_path / "tools", dirs_exist_ok=True)  # _config.yml's local Sphinx extension
    (tmp_path / "book").mkdir(exist_ok=True)
    shutil.copy(ROOT / "book" / "references.bib", tmp_path / "book" / "references.bib")
    (tmp_path / "_toc.yml").write_text("format: jb-book\nroot: book/page\n")
    (tmp_path / "book" / "page.md").write_text(
        CHAPTER_HEADER + "\n# A page\n\nText.\n\n```{code-cell} ipython3\n" + cell + "\n```\n\n" + prose + "\n")
    cmd = [sys.executable, str(ROOT / "tools" / "build_book.py"), "--root", str(tmp_path),
           *["--keep-cache"] * keep_cache]
    return subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)


def _outputs(notebook: Path) -> list[str]:
    """The text of every stream output of ``notebook``."""
    import nbformat

    nb = nbformat.read(notebook, as_version=4)
    return [o["text"] for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "stream"]


PUBLISHED = "https://github.com/someone/pp-book"


@pytest.fixture(scope="module")
def published_ok(tmp_path_factory) -> Path:
    """One one-page book that builds, published (``ppbook_repository`` set): the folder. Both tests
    below read it (each of these builds costs a Sphinx start and a kernel)."""
    folder = tmp_path_factory.mktemp("ok")
    ok = _mini_book(folder, "x = 1 / 1\nprint(x)", repository=PUBLISHED)
    assert ok.returncode == 0, ok.stdout[-3000:] + ok.stderr[-3000:]
    return folder


def test_a_failing_cell_fails_the_build(tmp_path, published_ok):
    assert set(page_times.page_seconds(published_ok / "_build" / "html")) == {"page"}  # the budget test's report
    executed = published_ok / "_build" / "jupyter_execute" / "book" / "page.ipynb"
    assert _outputs(executed) == ["1.0\n"]  # what make_notebooks turns into the download copy
    again = _mini_book(published_ok, "x = 1 / 1\nprint(x)", keep_cache=True, repository=PUBLISHED)  # make book-cached
    assert again.returncode == 0 and "Executed notebook" not in again.stdout, again.stdout[-3000:]
    assert _outputs(executed) == ["1.0\n"]  # from the cache, which myst-nb would write without outputs
    bad = _mini_book(tmp_path / "bad", "x = 1 / 0") if (tmp_path / "bad").mkdir() is None else None
    assert bad.returncode != 0
    assert "ZeroDivisionError" in bad.stdout + bad.stderr


def test_a_published_build_has_repository_and_launch_buttons_and_a_bad_address_is_one_line(tmp_path, published_ok):
    """The full build (main's _config.yml) names no repository and has no repository or launch
    button (tests/test_notebooks.py); with the one setting filled in, a page has them all, the
    launch buttons opening the generated notebook; a malformed address fails the build in one line."""
    url = PUBLISHED
    html = (published_ok / "_build" / "html" / "book" / "page.html").read_text()
    for button in ("repository", "issues", "edit"):
        assert f"btn-source-{button}-button" in html, button
    assert f'href="{url}"' in html and f"{url}/edit/main/book/page.md" in html and f"{url}/issues/new" in html
    assert "mybinder.org/v2/gh/someone/pp-book/notebooks?urlpath=lab/tree/book/page.ipynb" in html
    assert "colab.research.google.com/github/someone/pp-book/blob/notebooks/book/page.ipynb" in html
    assert "btn-download-notebook-button" in html
    (tmp_path / "bad").mkdir()
    bad = _mini_book(tmp_path / "bad", "print(1)", repository="github.com/someone")
    out = bad.stdout + bad.stderr
    assert bad.returncode != 0 and "is not a GitHub repository address; use https://github.com/OWNER/REPO" in out, out[-3000:]


def test_a_false_claim_fails_the_build(tmp_path):
    """A page that states a conclusion its numbers contradict does not build, and the build's
    output names the claim (issue 13). The page imports the package the book uses; no torch."""
    cell = ('from ppbook.claims import claim\n'
            'stage_gb = 137.0\n'
            'claim("tiny_stage_fits", stage_gb, stage_gb < 80, why="the stage fits in an 80 GB device")')
    bad = _mini_book(tmp_path, cell, prose="The stage needs {glue:text}`tiny_stage_fits:.0f` GB, so it fits.")
    out = bad.stdout + bad.stderr
    assert bad.returncode != 0, out[-3000:]
    assert "ClaimError" in out and "tiny_stage_fits" in out, out[-3000:]


def test_every_cell_meant_to_raise_raised(built_book):
    """A cell tagged ``raises-exception`` lets the build pass whether or not it raises; the text
    around it says that it fails. If a torch release fixes what the cell shows, the cell runs
    clean and the text is wrong: the executed notebooks must hold an error for every such cell."""
    import nbformat

    tagged = 0
    for path in sorted((built_book.parent / "jupyter_execute" / "book").glob("*.ipynb")):
        for i, cell in enumerate(nbformat.read(path, as_version=4).cells):
            if cell.cell_type == "code" and "raises-exception" in cell.metadata.get("tags", []):
                tagged += 1
                raised = [o.ename for o in cell.outputs if o.output_type == "error"]
                assert raised, f"{path.name} cell {i} is tagged raises-exception but raised nothing:\n{cell.source}"
    assert tagged >= 10, tagged  # the book shows a dozen failures on purpose
