"""Generate a plain .ipynb of every notebook page of the book, for Colab and for download.

The chapters are MyST markdown notebooks (jupytext). JupyterLab opens them as notebooks once
jupytext is installed and set as their viewer (`jupytext-config set-default-viewer markdown myst`,
as Binder's `postBuild` does), but Colab opens only .ipynb files, and readers without jupytext
want a notebook too. This writes one, without outputs, for every page of `_toc.yml` that has a
kernel, into the built site (default `_build/html/_notebooks/`), so they are never committed
under `book/`:

    python tools/make_notebooks.py                 # after jupyter-book build
    python tools/make_notebooks.py --out DIR       # anywhere else
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jupytext
import yaml

ROOT = Path(__file__).resolve().parents[1]


def notebook_pages(root: Path = ROOT) -> list[Path]:
    """The `.md` pages of the table of contents that are notebooks (they have a kernelspec)."""
    toc = yaml.safe_load((root / "_toc.yml").read_text())
    files = [toc["root"]] + [c["file"] for part in toc.get("parts", []) for c in part["chapters"]]
    pages = [root / f"{f}.md" for f in files]
    return [p for p in pages if p.is_file() and "kernelspec:" in p.read_text().split("\n---", 1)[0]]


def write_notebooks(out: Path, root: Path = ROOT) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for page in notebook_pages(root):
        notebook = jupytext.read(page)
        target = out / f"{page.stem}.ipynb"
        jupytext.write(notebook, target, fmt="ipynb")
        written.append(target)
    return written


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "_build" / "html" / "_notebooks",
                   help="folder to write the .ipynb files to (created if missing)")
    args = p.parse_args(argv)
    written = write_notebooks(args.out)
    print(f"wrote {len(written)} notebooks to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
