"""Rules of ../shared/STYLE.md that a machine can check."""

import ast
import re
import subprocess

import pytest

from conftest import ROOT

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
