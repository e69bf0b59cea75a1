"""No rendered page shows a path of the machine that built it (STYLE.md, companion scripts; issue 38).

Tracebacks and warnings name files by absolute paths: the repository, the virtual environment,
the home directory. The build hides them in every executed notebook's outputs
(``tools/machine_paths.py``, called by ``build_book.execute``); these tests check the hiding on
samples and the whole built site."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest

from conftest import ROOT
import machine_paths

FAKE = [("/home/ann/book/.venv/lib/python3.11/site-packages", "site-packages"), ("/home/ann/book", "."),
        ("/home/ann", "~")]


def test_hide_writes_each_prefix_as_a_reader_would():
    text = ("File /home/ann/book/.venv/lib/python3.11/site-packages/torch/x.py:3, in f\n"
            "File /home/ann/book/src/ppbook/y.py:7\n/home/ann/data.json /home/annex/z /home/ann/booklet")
    assert machine_paths.hide(text, FAKE) == ("File site-packages/torch/x.py:3, in f\nFile ./src/ppbook/y.py:7\n"
                                              "~/data.json /home/annex/z ~/booklet")
    assert machine_paths.found(text, FAKE) == ["/home/ann/book/.venv/lib/python3.11/site-packages",
                                               "/home/ann/book", "/home/ann"]
    assert machine_paths.found(machine_paths.hide(text, FAKE), FAKE) == []


# what pages showed (issue 50): a folder made by tempfile, with its random characters (appendix A3's
# flight records, and chapters 6 and 7 before they worked under _build); a tokenizer in tempfile's
# unnamed folder; the file IPython ran a cell from; folders named by tempfile's prefix, as the
# printed commands once showed them
TEMP = ("wrote /tmp/flight-cy1ucgd3/rank1.json\n"
        "$ python scripts/06_train.py --tokenizer-file /tmp/tmp/tokenizers/bpe-300-da97d5d81942ee1a.json\n"
        "# File: /tmp/ipykernel_16744/1972254578.py:8 in forward\n"
        "--dump-dir /tmp/flight /var/tmp/x ~/tmp/y /tmp/pytest-of-ann/pytest-3/book0/_build/html/a.html\n"
        "saved /tmp/ppbook-ch7/p2/step-000003")


def test_temp_paths_finds_the_builds_temporary_folders():
    assert machine_paths.temp_paths(TEMP) == ["/tmp/flight-cy1ucgd3", "/tmp/tmp", "/tmp/ipykernel_16744", "/tmp/flight",
                                              "/tmp/pytest-of-ann", "/tmp/ppbook-ch7"]


def test_a_path_under_the_temporary_folder_is_a_build_path_whatever_its_name():
    """Pages write their files under _build and name them from the repository root; a folder under
    the temporary folder is the build machine's even when a page chose its name, as A3 did with
    tempfile's prefix="flight-" and chapter 4 does with "ppbook-ch4-hf-"."""
    import tempfile

    mine = f"{tempfile.gettempdir()}/ppbook-ch4-hf-ab12cd34"
    assert machine_paths.temp_paths(f"--dump-dir /tmp/flight and /tmp/flight/rank0.json; {mine}/config.json") == [
        "/tmp/flight", mine]
    # as a notebook's JSON and a page's HTML write them
    assert machine_paths.temp_paths('"# shown as /tmp/flight\\n", &quot;/tmp/ppbook-ch7&quot;') == [
        "/tmp/flight", "/tmp/ppbook-ch7"]
    # what the pages print instead is no build path
    assert machine_paths.temp_paths("--dump-dir _build/a3/flight --save-dir _build/ch7/p2") == []


def test_hide_leaves_a_temporary_folder_as_it_is_for_temp_paths_to_report():
    shown = machine_paths.hide(TEMP, FAKE)
    # tempfile's random characters stay: no folder is named by its prefix any more
    assert "wrote /tmp/flight-cy1ucgd3/rank1.json" in shown and "# File: <notebook cell>:8 in forward" in shown
    assert machine_paths.temp_paths(shown) == ["/tmp/flight-cy1ucgd3", "/tmp/tmp", "/tmp/flight", "/tmp/pytest-of-ann",
                                               "/tmp/ppbook-ch7"]


def test_this_machines_paths_are_known_and_never_the_root_folder():
    paths = dict(machine_paths.machine_paths())
    for path in (str(ROOT), sys.prefix, str(Path.home())):
        assert path.rstrip("/") in paths or len(path.rstrip("/")) <= 4, path
    assert "/" not in paths and "" not in paths and "/tmp" not in paths
    assert machine_paths.hide(f"{ROOT}/src/ppbook/plan.py") == "./src/ppbook/plan.py"


def test_hide_in_notebook_cleans_every_text_output_and_leaves_code_and_images():
    nb = nbformat.v4.new_notebook()
    code = "open('/home/ann/book/x')"
    cell = nbformat.v4.new_code_cell(code)
    cell.outputs = [
        nbformat.v4.new_output("stream", name="stderr", text="/home/ann/book/.venv/lib/python3.11/site-packages/"
                                                              "tqdm/auto.py:21: TqdmWarning\n"),
        nbformat.v4.new_output("error", ename="OSError", evalue="no /home/ann/book/x",
                               traceback=["\x1b[32m/home/ann/book/src/a.py:3\x1b[39m"]),
        nbformat.v4.new_output("display_data", data={"text/plain": "/home/ann/f", "image/png": "/home/ann/AAAA"}),
    ]
    nb.cells.append(cell)
    machine_paths.hide_in_notebook(nb, FAKE)
    out = cell.outputs
    assert out[0]["text"] == "site-packages/tqdm/auto.py:21: TqdmWarning\n"
    assert out[1]["evalue"] == "no ./x" and out[1]["traceback"] == ["\x1b[32m./src/a.py:3\x1b[39m"]
    assert out[2]["data"] == {"text/plain": "~/f", "image/png": "/home/ann/AAAA"}
    assert cell.source == code


@pytest.mark.book  # starts a kernel: not among the pure tests of make test-fast
@pytest.mark.torchrun  # the session's launch server runs: the page's launch forks from it
def test_the_build_executor_hides_paths(tmp_path):
    """``build_book.execute`` (what ``make book`` and ``run_page.py`` run) hides them in a real
    traceback: a failing call into the installed torch, from a page outside the repository.
    The same kernel shows the launch server plugged in: ``ppbook.launch`` never imports it, the
    executor starts each kernel with its IPython extension (issue 53), so a page's launch forks."""
    from build_book import execute
    from ppbook_tools import zygote

    (tmp_path / "probe.py").write_text("import json, sys\njson.dump({}, open(sys.argv[-1], 'w'))\n")
    page = tmp_path / "page.md"
    page.write_text(textwrap.dedent("""\
        ---
        kernelspec:
          display_name: Python 3
          language: python
          name: python3
        ---
        ```{code-cell} ipython3
        import pathlib
        from ppbook import launch
        print("FORKED", launch.python(pathlib.Path("probe.py").resolve(), timeout=60).forked)
        ```
        ```{code-cell} ipython3
        :tags: [raises-exception]
        import torch.distributed as dist
        dist.get_rank(group=object())
        ```
        """))
    notebook, _, error = execute(page, timeout=60, allow_errors=False)
    assert error is None, error
    server = bool(os.environ.get(zygote.ENV)) and os.environ.get(zygote.FORCE_TORCHRUN) != "torchrun"
    assert notebook.cells[0].outputs[0]["text"] == f"FORKED {server}\n"
    shown = nbformat.writes(notebook)
    assert "site-packages/torch/distributed" in shown  # the frame is there, named as a reader would
    assert not machine_paths.found(shown), machine_paths.found(shown)


@pytest.mark.book
def test_no_built_page_shows_a_path_of_the_build_machine(built_book):
    paths = machine_paths.machine_paths()
    bad = {}
    for page in sorted(built_book.rglob("*.html")) + sorted((built_book / "_sources").rglob("*.ipynb")):
        text = page.read_text("utf8", errors="replace")
        hits = machine_paths.found(text, paths) + machine_paths.temp_paths(text)
        if hits:
            bad[str(page.relative_to(built_book))] = hits
    assert not bad, (f"pages showing the build machine's paths (tools/machine_paths.py hides them; write a page's "
                     f"files under _build, named from the repository root as chapters 6 and 7 and appendix A3 "
                     f"do): {bad}")


@pytest.mark.book
@pytest.mark.parametrize("page, folder", [("06_training", "_build/ch6/"), ("07_checkpointing", "_build/ch7/"),
                                          ("a3_troubleshooting", "_build/a3/flight")])
def test_the_pages_that_write_files_show_no_temporary_folder(built_book, page, folder):
    """Chapter 6's tokenizer, chapter 7's checkpoints and Hugging Face folders and appendix A3's
    flight records live under ``_build/ch6``, ``_build/ch7`` and ``_build/a3``, named from the
    repository root, where the scripts run and the printed commands are typed: no path under the
    temporary folder."""
    executed = built_book.parent / "jupyter_execute" / "book" / f"{page}.ipynb"  # build_book.write_executed's
    for shown in (built_book / "book" / f"{page}.html", executed):
        text = shown.read_text("utf8")
        assert not machine_paths.temp_paths(text), machine_paths.temp_paths(text)
        assert folder in text, shown
