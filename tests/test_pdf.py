"""`make pdf`: the book as one PDF, printed offline by Debian's chromium from the single-page HTML
build, which reuses the execution cache instead of executing the book a second time."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from conftest import ROOT, missing_tool


pytestmark = pytest.mark.book


def tool(name: str) -> str:
    exe = shutil.which(name)
    if exe is None:
        missing_tool(name)
    return exe


def titles() -> list[str]:
    """The H1 of every page of the table of contents, as plain words."""
    from make_notebooks import notebook_pages

    toc = (ROOT / "_toc.yml").read_text()
    pages = set(notebook_pages()) | {p for p in ROOT.glob("book/*.md") if f"book/{p.stem}\n" in toc}
    return [re.search(r"^# (.+)$", p.read_text(), re.M).group(1).replace("`", "") for p in sorted(pages)]


def squash(text: str) -> str:
    return re.sub(r"\s+", " ", text.replace("\u00ad", "")).replace("- ", "-")


def test_pdf_reuses_the_executed_cache(built_pdf):
    log = (built_pdf / "singlehtml.log").read_text()
    assert "build succeeded" in log
    assert "Executing notebook" not in log  # every page came from the build's execution cache
    # and from the HTML build's parsed pages (Sphinx's environment in _build/.doctrees): none read again
    assert re.search(r"updating environment: (?:\x1b\[[\d;]*m)?0 added, 0 changed, 0 removed", log), log[-3000:]


def test_pdf_leaves_the_executed_notebooks_their_outputs(built_pdf):
    """A singlehtml build that reads the pages again takes them from the cache, and myst-nb then
    writes ``jupyter_execute/`` without outputs; ``make_pdf`` writes them from the cache whether or
    not it read them, or a later ``make notebooks`` would find no glued values and the download
    copies no outputs."""
    import nbformat

    executed = [nbformat.read(p, as_version=4) for p in sorted((built_pdf.parent / "jupyter_execute" / "book").glob("*.ipynb"))]
    with_outputs = sum(any(c.get("outputs") for c in nb.cells if c.cell_type == "code") for nb in executed)
    assert executed and with_outputs >= len(executed) // 2, (with_outputs, len(executed))


def test_pdf_pages_have_the_text_of_every_chapter(built_pdf):
    text = subprocess.run([tool("pdftotext"), str(built_pdf / "book.pdf"), "-"], capture_output=True, text=True,
                          check=True).stdout
    assert subprocess.run([tool("pdfinfo"), str(built_pdf / "book.pdf")], capture_output=True, text=True,
                          check=True).stdout.count("Pages:") == 1
    flat = squash(text)
    for title in titles():
        assert squash(title)[:30] in flat, title
    assert "{glue" not in flat and "\\frac" not in flat  # numbers filled in, math typeset
    pages = text.count("\f")
    assert pages >= 2 * len(titles()), pages


def test_pdf_pages_have_the_figures(built_pdf):
    listing = subprocess.run([tool("pdfimages"), "-list", str(built_pdf / "book.pdf")], capture_output=True, text=True,
                             check=True).stdout.splitlines()[2:]
    images = [line.split() for line in listing if line.split()]
    # page num type width height color comp bpc enc ...: plots are colour images of some size
    big = [i for i in images if i[2] == "image" and i[5] != "gray" and int(i[3]) >= 200 and int(i[4]) >= 100]
    # and nothing else of size: chromium prints a blurred box-shadow as a grey 300 dpi soft mask
    # (once one per code cell and admonition, half the file); make_pdf's print style removes them
    shadows = [i for i in images if i[5] == "gray" and int(i[3]) >= 200]
    assert not shadows, f"{len(shadows)} grey images (shadows?), e.g. {shadows[:3]}"
    figures = sum(len(re.findall(r"^\s+name: fig-", p.read_text(), re.M)) for p in ROOT.glob("book/*.md"))
    assert len(big) >= figures, (len(big), figures)
    assert len({i[0] for i in big}) >= figures // 2  # spread over the pages, not one page of images
