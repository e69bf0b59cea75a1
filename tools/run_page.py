"""Execute one or more pages of the book on their own, for an author iterating on a chapter.

``make book`` executes every page and renders the site; while writing one chapter that is minutes
of other pages. This executes just the pages named, each as the build does (the same notebook
read from the MyST file, the same working folder, timeout and error policy from ``_config.yml``,
launches forked from one launch server), prints each page's seconds and the first failing cell's
traceback, and checks what rendering would reject first: a ``{glue}`` key the prose names that no
cell glued. With ``--out DIR`` the executed notebooks are written there, outputs included, to read.

    python tools/run_page.py book/01_first_pipeline.md
    python tools/run_page.py book/03_gpipe.md book/05_schedules.md --out /tmp/pages

It does not render (cross-references and MyST warnings show only in ``make book``) and does not
touch the build's cache.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from build_book import execute, servers  # noqa: E402  (the build's own page executor)

GLUE_KEY = re.compile(r"\{glue(?::[a-z]+)?\}`([^`:]+)")


def glued_keys(notebook) -> set[str]:
    """The names every ``glue`` call of the executed notebook stored."""
    keys = set()
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            name = output.get("metadata", {}).get("scrapbook", {}).get("name")
            if name:
                keys.add(name)
    return keys


def missing_glue(page: Path, notebook) -> list[str]:
    """Keys the page's prose names that the executed notebook did not glue."""
    named = set(GLUE_KEY.findall(page.read_text("utf8")))
    return sorted(named - glued_keys(notebook))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="run_page.py", description=__doc__.split("\n")[0])
    p.add_argument("pages", nargs="+", type=Path, help="book/NN_slug.md files")
    p.add_argument("--out", type=Path, default=None, help="write each executed notebook to DIR/<page>.ipynb")
    args = p.parse_args(argv)
    for page in args.pages:
        if not page.is_file() or page.suffix != ".md":
            p.error(f"{page} is not a page of the book (a book/*.md file)")
    cfg = yaml.safe_load((ROOT / "_config.yml").read_text()).get("execute", {})
    timeout, allow_errors = int(cfg.get("timeout", 30)), bool(cfg.get("allow_errors", False))

    logs = Path(tempfile.mkdtemp(prefix="ppbook-run-page-"))  # the servers' logs (build_book.servers)
    status = 0
    with servers(logs):
        for page in args.pages:
            notebook, seconds, error = execute(page.resolve(), timeout, allow_errors)
            if error is not None:
                print(f"{page}: FAILED after {seconds:.1f} s\n{error}", file=sys.stderr)
                status = 1
                continue
            missing = missing_glue(page, notebook)
            if missing:
                print(f"{page}: executed in {seconds:.1f} s, but the prose names keys no cell glued: "
                      + ", ".join(missing), file=sys.stderr)
                status = 1
            else:
                print(f"{page}: executed in {seconds:.1f} s, every glued key present")
            if args.out:
                import nbformat

                args.out.mkdir(parents=True, exist_ok=True)
                nbformat.write(notebook, args.out / page.with_suffix(".ipynb").name)
    return status


if __name__ == "__main__":
    sys.exit(main())
