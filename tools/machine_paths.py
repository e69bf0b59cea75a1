"""Paths of the machine that built the book, kept off its pages.

A traceback or a warning that a page shows names files by their absolute paths: the build
machine's repository folder, its virtual environment, its home directory. They say nothing to a
reader and differ on every machine. The build (``build_book.execute``, which ``run_page.py`` uses
too) passes every executed notebook's outputs through :func:`hide_in_notebook`, which writes each
such prefix as a reader would: ``site-packages/torch/...`` for an installed package,
``lib/python3.11/...`` for the standard library, ``src/ppbook/...`` for a file of the repository,
``~`` for the home directory, and the file IPython runs a cell from (``/tmp/ipykernel_123/456.py``)
as ``<notebook cell>``. No other path under the temporary folder is hidden: pages write their
files under ``_build`` in the repository and name them from its root, as their printed commands do
(``--save-dir _build/ch7/p2``, ``--dump-dir _build/a3/flight``), so any path under the temporary
folder that a built page shows is the build's own (:func:`temp_paths` finds them). Code cells are
left alone (the execution cache keys on them).

    python tools/machine_paths.py _build/html     # list the build paths left on built pages
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import sysconfig
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def machine_paths(root: Path = ROOT) -> list[tuple[str, str]]:
    """``(absolute path, what a page shows instead)`` for this machine, longest path first, so a
    package inside the virtual environment inside the repository is named by the innermost."""
    paths = sysconfig.get_paths()
    pairs = [(paths["purelib"], "site-packages"), (paths["platlib"], "site-packages"),
             (paths["stdlib"], f"lib/python{sys.version_info.major}.{sys.version_info.minor}"),
             (paths["platstdlib"], f"lib/python{sys.version_info.major}.{sys.version_info.minor}"),
             (sys.prefix, ".venv"), (str(root), "."), (str(Path.home()), "~")]
    out: dict[str, str] = {}
    for path, shown in pairs:
        for variant in {path, os.path.realpath(path)}:
            variant = variant.rstrip("/")
            if variant.count("/") >= 2 or (variant.count("/") == 1 and len(variant) > 4):  # never "/" or "/tmp"
                out.setdefault(variant, shown)
    return sorted(out.items(), key=lambda kv: -len(kv[0]))


def _pattern(paths: list[tuple[str, str]]) -> re.Pattern:
    # a prefix counts only as a whole path component: /work/main, not /work/mainline
    return re.compile("|".join(rf"{re.escape(p)}(?![\w.-])" for p, _ in paths))


def _temp_pattern() -> re.Pattern:
    """A path under the temporary folder (``/tmp`` or ``$TMPDIR``), its first folder in group 1."""
    roots = {"/tmp", tempfile.gettempdir().rstrip("/"), os.path.realpath(tempfile.gettempdir()).rstrip("/")}
    alternatives = "|".join(re.escape(r) for r in sorted(roots, key=len, reverse=True) if r.count("/") >= 1)
    return re.compile(rf"(?<![\w./~-])(?:{alternatives})/([^\s/'\"`<>:,;)\]\\&]+)")  # a name stops at JSON's \\n and HTML's &quot;


def _hide_cell_files(text: str) -> str:
    """IPython's cell files (``/tmp/ipykernel_123/456.py``) as ``<notebook cell>``."""
    temp = _temp_pattern()
    return re.sub(temp.pattern + r"/\d+\.py", lambda m: "<notebook cell>" if m[1].startswith("ipykernel_") else m[0],
                  text)


def hide(text: str, paths: list[tuple[str, str]] | None = None) -> str:
    """``text`` with every machine path written as a reader would (``ROOT/src/x.py`` -> ``./src/x.py``,
    ``/tmp/ipykernel_123/456.py`` -> ``<notebook cell>``); any other path under the temporary folder
    as it is, for :func:`temp_paths` to report."""
    paths = machine_paths() if paths is None else paths
    if paths:
        shown = dict(paths)
        text = _pattern(paths).sub(lambda m: shown[m.group(0)], text)
    return _hide_cell_files(text)


def temp_paths(text: str) -> list[str]:
    """The paths under the temporary folder that ``text`` shows: every one is the build machine's
    (a folder with tempfile's random characters, tempfile's unnamed ``tmp`` folders, IPython's cell
    files, the build's output folder), since no page writes a file there. Each once, in order of
    appearance."""
    return list(dict.fromkeys(m[0] for m in _temp_pattern().finditer(text)))


def found(text: str, paths: list[tuple[str, str]] | None = None) -> list[str]:
    """The machine paths ``text`` contains (each once, in order of appearance)."""
    paths = machine_paths() if paths is None else paths
    return list(dict.fromkeys(_pattern(paths).findall(text))) if paths else []


def _hide_value(value, paths):
    if isinstance(value, str):
        return hide(value, paths)
    if isinstance(value, list):
        return [_hide_value(v, paths) for v in value]
    if isinstance(value, dict):
        return {k: _hide_value(v, paths) for k, v in value.items()}
    return value


def hide_in_notebook(notebook, paths: list[tuple[str, str]] | None = None):
    """Every output of ``notebook`` (streams, tracebacks, displayed text, glued values) with the
    machine paths hidden, in place; images are left as they are. Returns the notebook."""
    paths = machine_paths() if paths is None else paths
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            for key in ("text", "traceback", "evalue"):
                if key in output:
                    output[key] = _hide_value(output[key], paths)
            data = output.get("data", {})
            for mime in list(data):
                if not mime.startswith("image/"):
                    data[mime] = _hide_value(data[mime], paths)
    return notebook


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="machine_paths.py", description=__doc__.split("\n")[0])
    p.add_argument("html", type=Path, help="a built site's folder, such as _build/html")
    args = p.parse_args(argv)
    bad = 0
    for page in sorted(args.html.rglob("*.html")):
        text = page.read_text("utf8", errors="replace")
        hits = found(text) + temp_paths(text)
        if hits:
            bad += 1
            print(f"{page.relative_to(args.html)}: {', '.join(hits)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
