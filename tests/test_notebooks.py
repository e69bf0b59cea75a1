"""The downloadable notebooks: readable text (no raw MyST role or directive), a first cell that
sets a page up outside the repository, and launch buttons that open them."""

from __future__ import annotations

import re

import nbformat
import pytest

from conftest import ROOT
import make_notebooks as mn

RAW = re.compile(r"\{[a-z][\w:-]*\}`|^(`{3,}|:{3,})\{|^\([\w-]+\)=", re.M)  # a role, a directive, a target


class AnyGlue(dict):
    """Stands in for the build's glued values where only the text's shape matters."""

    def __contains__(self, key):
        return True

    def __getitem__(self, key):
        return "1"


def raw_markup(notebook) -> list[str]:
    return [m.group(0) for c in notebook.cells if c.cell_type == "markdown" for m in RAW.finditer(c.source)]


@pytest.mark.parametrize("page", mn.notebook_pages(), ids=lambda p: p.stem)
def test_no_raw_role_in_a_generated_notebook(page):
    notebook = mn.readable_notebook(page, glue=AnyGlue())
    assert not raw_markup(notebook), raw_markup(notebook)[:5]
    assert "ppbook-setup" in notebook.cells[0].metadata["tags"]
    # every code cell of the page is there, in order, after the install cell
    code = [c.source for c in notebook.cells[1:] if c.cell_type == "code"]
    assert code == [c.source for c in mn.jupytext.read(page).cells if c.cell_type == "code"]


def test_roles_become_words_links_and_numbers():
    ctx = mn.Context(page="x.md", glue={"speed": "1.23456", "name": "'GPipe'"}, figures={"fig-a": "A plot. More."},
                     labels={"gpipe": ("GPipe", "03_gpipe")}, citations={"huang2019gpipe": "Huang et al., 2019"},
                     page_url=lambda stem: f"https://example/{stem}.ipynb", root=ROOT, page_dir=ROOT / "book")
    text = ("{glue:text}`speed:.1f` x {glue:text}`name` {ref}`gpipe` {ref}`see here <gpipe>` "
            "{numref}`fig-a` {cite:p}`huang2019gpipe` {term}`bubble`")
    assert mn.markdown(ctx, text) == ("1.2 x GPipe [GPipe](https://example/03_gpipe.ipynb) "
                                      "[see here](https://example/03_gpipe.ipynb) Figure “A plot” "
                                      "(Huang et al., 2019) bubble")
    with pytest.raises(KeyError, match="missing"):
        mn.markdown(ctx, "{glue:text}`missing`")
    note = ":::{note}\nA {term}`stage <stage>` of $p$.\n:::"
    assert mn.markdown(ctx, note) == "> **Note**\n>\n> A stage of $p$."


def test_literalinclude_becomes_the_code_it_shows():
    ctx = mn.Context(page="x.md", root=ROOT, page_dir=ROOT / "book")
    text = "```{literalinclude} ../src/ppbook/bubble.py\n:pyobject: bubble_fraction\n:caption: The bubble\n```"
    out = mn.markdown(ctx, text)
    assert out.startswith("*The bubble* (`src/ppbook/bubble.py`):\n\n```python\ndef bubble_fraction(")
    assert "{literalinclude}" not in out


def test_the_install_cell_installs_the_pages_extras():
    plain = mn.install_cell("import torch").source
    assert "torch==2.13.0" in plain and "ray" not in plain and mn.TORCH_CPU_INDEX in plain
    assert "ipykernel" not in plain  # the kernel that runs the cell has one
    assert "ray[train]==" in mn.install_cell('launch.python("09_scaling_out.py", ["--ray-workers", "4"])').source
    compile(plain, "install cell", "exec")


def test_launch_buttons_open_the_generated_notebooks():
    urls = mn.launch_urls("https://github.com/someone/pp-book", "notebooks", "book/03_gpipe")
    assert urls["Colab"] == "https://colab.research.google.com/github/someone/pp-book/blob/notebooks/book/03_gpipe.ipynb"
    assert urls["Binder"].endswith("/someone/pp-book/notebooks?urlpath=lab/tree/book/03_gpipe.ipynb")
    assert mn.config()["sphinx"]["local_extensions"]["ppbook_launch"] == "tools"


def test_without_a_repository_the_install_cell_asks_for_a_local_clone(tmp_path):
    """A build that names no repository (main, until someone publishes it) has nothing to
    download from: its notebooks' first cell says so in one line instead of fetching nowhere."""
    cell = mn.install_cell("import torch", ROOT).source
    if mn.repository() is None:
        assert "set PPBOOK_SOURCE" in cell and "archive/refs/heads" not in cell
    compile(cell, "install cell", "exec")


@pytest.mark.slow
def test_a_generated_notebook_runs_outside_the_repository_from_its_install_cell(tmp_path, monkeypatch):
    """Chapter 11 in a fresh kernel, in a temporary folder outside the clone, with nothing set up
    but what its first cell does: PPBOOK_SOURCE makes it copy this checkout instead of
    downloading, and install with pip --no-index. The chapter launches nothing (a launch from the
    copy's PYTHONPATH would start fresh processes, not forked ones) but reads what a copy must
    carry besides ``ppbook``: the GPU records under ``data/``, the harness in ``tools/`` and a
    script in ``scripts/``; in a few seconds, where chapter 0's planner took half a minute."""
    from nbclient import NotebookClient

    notebook = mn.readable_notebook(ROOT / "book" / "11_on_real_gpus.md", glue=AnyGlue())
    notebook.cells.append(nbformat.v4.new_code_cell(
        "import pathlib, ppbook\n"
        "copy = pathlib.Path.cwd().parent\n"  # the install cell works from <tmp>/<repository>/book
        f"assert copy.name == {mn.clone_folder()!r} and (copy / 'scripts' / '01_first_pipeline.py').is_file()\n"
        "assert pathlib.Path(ppbook.__file__).resolve().is_relative_to(copy.resolve()), ppbook.__file__"))
    monkeypatch.setenv("PPBOOK_SOURCE", str(ROOT))
    monkeypatch.delenv("PYTHONPATH", raising=False)  # ppbook must come from the install cell's copy
    NotebookClient(notebook, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    assert (tmp_path / mn.clone_folder() / "src" / "ppbook").is_dir()
    assert not any((d / "_toc.yml").is_file() for d in (tmp_path, *tmp_path.parents))


@pytest.mark.book
def test_built_notebooks_are_readable_and_the_buttons_open_them(built_book):
    build = built_book.parent
    written = mn.write_notebooks(build)  # fails on a glued value the executed notebook lacks
    assert {p.stem for p in written} == {p.stem for p in mn.notebook_pages()}
    with_outputs = 0
    for path in written:
        notebook = nbformat.read(path, as_version=4)
        nbformat.validate(notebook)
        assert not raw_markup(notebook), (path.name, raw_markup(notebook)[:5])
        assert not any(c.get("outputs") for c in notebook.cells if c.cell_type == "code")
        download = nbformat.read(built_book / "_sources" / "book" / path.name, as_version=4)
        assert not raw_markup(download), path.name
        with_outputs += any(c.get("outputs") for c in download.cells)
    assert with_outputs >= len(written) // 2  # the download copies keep the build's outputs
    assert (build / "notebooks" / "binder" / "requirements.txt").is_file()
    html = (built_book / "book" / "03_gpipe.html").read_text()
    assert "btn-download-notebook-button" in html  # the download button's notebook stays
    if mn.repository() is None:  # main names no repository: no button may lead nowhere
        assert not re.findall(r'href="https://(?:github\.com|colab|mybinder)[^"]*"', html)
        assert "btn-source-repository-button" not in html
    else:
        assert f"{mn.repository()}/blob/notebooks/book/03_gpipe.ipynb".split("github.com/")[1] in html


def test_shown_listing_lines_are_found_with_their_numbers(tmp_path):
    """tools/long_listings.py reads the lines a chapter shows as Sphinx does (for the 88-column rule)."""
    from long_listings import long_lines

    (tmp_path / "book").mkdir()
    (tmp_path / "s.py").write_text("import os\n\n\ndef f():\n    x = 1  # " + "c" * 90 + "\n    return x\n\n\n"
                                   "def g():\n    return '" + "y" * 100 + "'\n")
    (tmp_path / "book" / "p.md").write_text("```{literalinclude} ../s.py\n:pyobject: f\n:caption: f\n```\n")
    assert [(p, n) for p, n, _ in long_lines(88, tmp_path)] == [("s.py", 5)]  # not g's line 10: not shown
