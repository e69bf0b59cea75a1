"""Rules of ../shared/STYLE.md that a machine can check."""

import ast
import re
import subprocess

import pytest

from conftest import ROOT
from long_listings import WIDTH, long_lines  # the one resolver of shown lines
import visible_words  # tools/: the core path and its reading budget

# chapters (NN_slug) and appendices (aN_slug), with their companion scripts
CHAPTERS = sorted((ROOT / "book").glob("[0-9][0-9]_*.md")) + sorted((ROOT / "book").glob("a[0-9]_*.md"))
SCRIPTS = sorted((ROOT / "scripts").glob("[0-9][0-9]_*.py")) + sorted((ROOT / "scripts").glob("a[0-9]_*.py"))


def test_no_notebook_committed_under_book():
    tracked = subprocess.run(["git", "ls-files", "book"], cwd=ROOT, capture_output=True, text=True).stdout
    assert not [f for f in tracked.split() if f.endswith(".ipynb")]


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.name)
def test_chapter_shape(chapter):
    text = chapter.read_text()
    assert text.startswith("---\njupytext:") and "format_name: myst" in text
    assert re.search(r"^\(\S+\)=\n# ", text, re.M), "a label and an H1"
    assert "## Summary" in text and "## Exercises" in text
    assert not re.search(r"^\s*!\s*(torchrun|python)", text, re.M), "launch scripts with ppbook.launch, not !torchrun"
    assert "allow_errors" not in text


def test_config_never_allows_errors():
    assert not re.search(r"allow_errors:\s*true", (ROOT / "_config.yml").read_text())


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_shape(script):
    tree = ast.parse(script.read_text())
    doc = ast.get_docstring(tree)
    assert doc and "torchrun --standalone --nproc-per-node" in doc
    names = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert {"parse_args", "main"} <= names
    # no module-level work: only imports, constants, defs and the __main__ guard
    for node in tree.body:
        assert isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef, ast.Assign,
                                 ast.AnnAssign, ast.If, ast.Expr)), ast.dump(node)[:80]
    # chapter and script numbers match
    assert any(c.name[:2] == script.name[:2] for c in CHAPTERS)


def check_listings_fit(root) -> None:
    """Every line a chapter under ``root`` shows with ``{literalinclude}`` fits the page's code
    width; otherwise the reader sees it cut off behind a scroll bar."""
    rows = long_lines(WIDTH, root)
    assert not rows, (f"{len(rows)} shown lines over {WIDTH} characters (re-wrap them; "
                      f"PYTHONPATH=src python tools/long_listings.py lists them): "
                      + ", ".join(f"{path}:{number} ({length})" for path, number, length in rows[:10]))


def test_listings_fit_the_page():
    check_listings_fit(ROOT)


def test_listings_fit_fails_on_a_long_shown_line(tmp_path):
    """The check fails on a shown line over the width, and only on a shown one."""
    (tmp_path / "book").mkdir()
    (tmp_path / "book" / "01_x.md").write_text("```{literalinclude} ../s.py\n:pyobject: f\n```\n")
    script = tmp_path / "s.py"
    script.write_text("def f():\n    return 1\n\n\ndef g():\n    return '" + "y" * 100 + "'\n")
    check_listings_fit(tmp_path)  # g's long line is not shown
    code = "    return 1  # "
    script.write_text("def f():\n" + code + "c" * (WIDTH - len(code)) + "\n")
    check_listings_fit(tmp_path)  # exactly WIDTH characters still fit
    script.write_text("def f():\n" + code + "c" * (WIDTH + 1 - len(code)) + "\n")
    with pytest.raises(AssertionError, match=r"s\.py:2 \(" + str(WIDTH + 1) + r"\)"):
        check_listings_fit(tmp_path)


# The core path a newcomer reads first holds its paragraphs to a few numbers each (STYLE.md, 2b);
# the numbers stay glued, in tables or in collapsed blocks ("How this was checked"). The same pages
# hold a budget of visible words on the built site (tests/test_core_budget.py).
CORE_PATH = [f"{name}.md" for name in visible_words.CORE_PATH]


@pytest.mark.parametrize("page", CORE_PATH)
def test_core_path_paragraphs_carry_few_numbers(page):
    from prose_numbers import LIMIT, over_limit

    over = over_limit((ROOT / "book" / page).read_text())
    assert not over, (f"{len(over)} paragraph(s) of {page} carry more than {LIMIT} glued values; move the rest "
                      "into a table or a collapsed block: "
                      + "; ".join(f"line {line} ({n}): {par[:80]}..." for line, n, par in over))


def test_prose_numbers_counts_only_the_open_main_line():
    """The counter sees prose and open admonitions, and skips code cells, tables and collapsed blocks."""
    from prose_numbers import glued_numbers, paragraphs

    g = "{glue:text}`a` "
    page = "\n".join([
        "---", "jupytext: {}", "---", "(label)=", "# Title", "",
        "One " + g * 2, "goes on " + g, "",  # one paragraph over two lines: 3
        "| a | " + g * 5 + "|",  # a table row
        "```{code-cell} ipython3", "x = " + g * 5, "```",
        ":::{note}", "Open " + g * 4, ":::",  # an open admonition counts: 4
        "::::{admonition} How this was checked", ":class: dropdown", "", "Hidden " + g * 6, "::::",
        "````{dropdown} Why these CPU numbers differ", "```python", g, "```", g * 7, "````",
        "- item " + g * 2, "- other " + g,
    ])
    counts = [glued_numbers(p) for _, p in paragraphs(page)]
    assert counts == [3, 4, 2, 1], counts


# Every launch a chapter makes shows the command a reader would type (issue 38): a code cell that
# calls launch.torchrun / launch.python, or a function of the page that wraps them, prints the
# launch's ``reader_command`` in that cell or the next one (itself, or through a function of the
# page that prints it).
LAUNCHERS = {"torchrun", "python"}


def code_cells(text: str) -> list[tuple[int, str]]:
    """(first line, source) of every ``{code-cell}`` of a MyST page, without its metadata lines."""
    cells, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        opening = re.match(r"^(`{3,})\{code-cell\}", lines[i])
        i += 1
        if not opening:
            continue
        start, body = i, []
        while i < len(lines) and lines[i].strip() != opening[1]:
            body.append(lines[i])
            i += 1
        i += 1
        if body[:1] == ["---"]:  # a YAML metadata block
            body = body[body.index("---", 1) + 1:] if "---" in body[1:] else body
        while body and body[0].startswith(":"):  # :tags: [...] lines
            body = body[1:]
        source = "\n".join("pass" if line.lstrip().startswith(("%", "!")) else line for line in body)
        cells.append((start, source))
    return cells


def _launch_calls(node, wrappers) -> list[ast.Call]:
    """The launches in ``node``, leaving out those inside a function it defines."""
    calls = []
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(child, ast.Call):
            f = child.func
            if ((isinstance(f, ast.Attribute) and f.attr in LAUNCHERS and isinstance(f.value, ast.Name)
                 and f.value.id == "launch") or (isinstance(f, ast.Name) and f.id in wrappers)):
                calls.append(child)
        calls += _launch_calls(child, wrappers)
    return calls


def _calls_any(tree, names) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in names for n in ast.walk(tree))


def launches_without_command(text: str) -> list[int]:
    """The first lines of the code cells of ``text`` that launch a script and print no reader's command."""
    cells = [(line, ast.parse(source), source) for line, source in code_cells(text)]
    functions = [f for _, tree, _ in cells for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)]
    wrappers, printers = set(), {f.name for f in functions if "reader_command" in ast.unparse(f)}
    while True:  # a function that launches, directly or through another wrapper, is a wrapper
        more = {f.name for f in functions if any(_launch_calls(s, wrappers) for s in f.body)} - wrappers
        if not more:
            break
        wrappers |= more

    def prints(i):
        return i < len(cells) and ("reader_command" in cells[i][2] or _calls_any(cells[i][1], printers))

    return [line for i, (line, tree, _) in enumerate(cells)
            if _launch_calls(tree, wrappers) and not (prints(i) or prints(i + 1))]


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.name)
def test_every_launch_shows_the_readers_command(chapter):
    missing = launches_without_command(chapter.read_text())
    assert not missing, (f"{chapter.name}: the code cells at lines {missing} launch a script but print no "
                         "reader's command; add print(\"$\", result.reader_command) to the cell")


def test_launch_checker_fails_on_a_silent_launch():
    """The checker finds a launch that prints nothing, also through a page's wrapper, and accepts
    a print in the cell, in the next cell, or through a page's printing function."""
    def page(*cells):
        return "\n".join(f"```{{code-cell}} ipython3\n{c}\n```\n\nText.\n" for c in cells)

    silent = "r = launch.torchrun('x.py', [], nproc=2).data\nprint(r)"
    assert launches_without_command(page("import os", silent)) == [7]  # the line of the cell's fence
    assert launches_without_command(page(silent, "print('$', r.reader_command)")) == []
    assert launches_without_command(page(":tags: [remove-cell]\n" + silent.replace("torchrun", "python"))) == [1]
    wrapper = "def go(n):\n    return launch.python('x.py', [n])"
    assert launches_without_command(page(wrapper, "a = go(1)", "b = 2", "c = 3")) == [8]
    shower = "def show(run):\n    print(run.reader_command)"
    assert launches_without_command(page(wrapper, shower, "a = go(1)\nshow(a)")) == []
    assert launches_without_command(page("print(launch.torchrun('x.py').reader_command)")) == []


@pytest.mark.parametrize("page", sorted((ROOT / "book").glob("*.md")), ids=lambda p: p.name)
def test_collapsed_blocks_are_admonitions(page):
    """A collapsed block is an admonition with ``:class: dropdown``: sphinx-design's ``{dropdown}``
    renders on the site but stops `make pdf`'s single-page build ("unknown node type:
    dropdown_title")."""
    found = re.findall(r"^\s*(?:`{3,}|:{3,})\{dropdown\}", page.read_text(), re.M)
    assert not found, f"{page.name}: write {{admonition}} Title with :class: dropdown instead of {{dropdown}}"
