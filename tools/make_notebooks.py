"""Generate a readable .ipynb of every notebook page of the book, for download, Colab and Binder.

The chapters are MyST markdown notebooks (jupytext). Outside the built site their text is raw
MyST: `{glue:text}` roles instead of numbers, `{ref}`/`{cite:p}` instead of links, directives
such as `{literalinclude}`. This writes, for every page of `_toc.yml` that has a kernel, a plain
notebook whose Markdown reads as the site does:

- glued values are substituted from the executed build (`_build/jupyter_execute`), formatted as
  the page formats them;
- `{ref}` becomes a link to the page's notebook, `{numref}` the figure's caption, `{cite:p}`
  "(Author et al., year)", `{term}` the plain word;
- `{literalinclude}` becomes the code it shows (read with Sphinx's own reader), admonitions and
  exercises become quotes and bold titles;
- a first cell that, outside a clone of the repository, installs what the page needs (CPU torch
  included) and fetches the scripts and the `ppbook` package, then works from that copy; inside
  a clone it does nothing. `PPBOOK_SOURCE=/path/to/clone` makes it copy a local checkout and
  install with `pip --no-index` instead of downloading (offline, and in the tests).

Two copies are written after `jupyter-book build`:

- `_build/html/_sources/book/NN.ipynb`, with the build's outputs: what the page's download
  button serves;
- `_build/notebooks/`, without outputs, next to `binder/` and a README: the tree published as
  the repository's `notebooks` branch (`make publish-notebooks`), which the Colab and Binder
  buttons open (Colab opens only `.ipynb` files from a GitHub path; see README.md).

    python tools/make_notebooks.py                     # after jupyter-book build
    python tools/make_notebooks.py --build DIR         # a build made with --path-output DIR
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import shutil
import sys
import types
from pathlib import Path

import jupytext
import nbformat
import yaml

ROOT = Path(__file__).resolve().parents[1]
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
ROLE = re.compile(r"\{([a-z][\w:-]*)\}`([^`]*)`")
# a fenced directive, with backticks or (colon_fence) colons: fence, name, argument, options, body
DIRECTIVE = re.compile(r"^(`{3,}|:{3,})\{([\w:-]+)\}[ \t]*([^\n]*)\n((?::[\w-]+:[^\n]*\n)*)(.*?)^\1[ \t]*$",
                       re.M | re.S)
LABEL = re.compile(r"^\(([\w-]+)\)=\s*\n+#+\s+(.+)$", re.M)
# Pages that need more than the reader's environment, found by a word in their code cells.
PAGE_EXTRAS = {"ray": "ray"}  # word in the code -> package name, pinned in requirements.txt


# --- the repository's configuration -------------------------------------------------------

def config(root: Path = ROOT) -> dict:
    return yaml.safe_load((root / "_config.yml").read_text())


def check_repository(url: str) -> str | None:
    """``url`` as a GitHub repository address without a trailing slash, ``None`` when empty;
    a ``ValueError`` naming the fix for anything else."""
    url = (url or "").strip().rstrip("/")
    if not url:
        return None
    if not re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+", url):
        raise ValueError(f"ppbook_repository {url!r} is not a GitHub repository address; use "
                         "https://github.com/OWNER/REPO, or leave it empty for a build without repository buttons")
    return url


def repository(root: Path = ROOT) -> str | None:
    """The book's GitHub repository, as whoever publishes it set it (`_config.yml`: sphinx.config
    ``ppbook_repository``); ``None`` in a build that names none."""
    return check_repository(config(root)["sphinx"]["config"].get("ppbook_repository", ""))


def repository_branch(root: Path = ROOT) -> str:
    return config(root)["sphinx"]["config"].get("ppbook_repository_branch", "main")


def notebooks_branch(root: Path = ROOT) -> str:
    """The branch that holds the generated notebooks (`_config.yml`: sphinx.config)."""
    return config(root)["sphinx"]["config"]["ppbook_notebooks_branch"]


def launch_urls(repo_url: str, branch: str, pagename: str) -> dict[str, str]:
    """Where the Colab and Binder buttons of page ``pagename`` (e.g. ``book/03_gpipe``) lead:
    its generated notebook on the ``branch`` of the GitHub repository ``repo_url``."""
    org, repo = repo_url.rstrip("/").split("github.com/")[1].split("/")[:2]
    return {"Colab": f"https://colab.research.google.com/github/{org}/{repo}/blob/{branch}/{pagename}.ipynb",
            "Binder": f"https://mybinder.org/v2/gh/{org}/{repo}/{branch}?urlpath=lab/tree/{pagename}.ipynb"}


def requirement_pins(path: Path) -> list[str]:
    """The requirements of a pip file, with ``-r other.txt`` expanded and pip options left out."""
    out = []
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line.startswith("-r "):
            out += requirement_pins(path.parent / line.split(None, 1)[1])
        elif line and not line.startswith("-"):
            out.append(line)
    return out


def notebook_pages(root: Path = ROOT) -> list[Path]:
    """The `.md` pages of the table of contents that are notebooks (they have a kernelspec)."""
    toc = yaml.safe_load((root / "_toc.yml").read_text())
    files = [toc["root"]] + [c["file"] for part in toc.get("parts", []) for c in part["chapters"]]
    pages = [root / f"{f}.md" for f in files]
    return [p for p in pages if p.is_file() and "kernelspec:" in p.read_text().split("\n---", 1)[0]]


# --- what the roles point to ----------------------------------------------------------------

def labels(root: Path = ROOT) -> dict[str, tuple[str, str]]:
    """``label -> (title, page stem)`` for every ``(label)=`` heading of the book's pages."""
    found = {}
    for page in sorted((root / "book").glob("*.md")):
        for label, title in LABEL.findall(page.read_text()):
            found[label] = (ROLE.sub(lambda m: m.group(2), title).strip(), page.stem)
    return found


def figure_captions(notebook) -> dict[str, str]:
    """``figure name -> caption`` from the ``mystnb: figure`` metadata of the code cells."""
    out = {}
    for cell in notebook.cells:
        fig = cell.get("metadata", {}).get("mystnb", {}).get("figure", {})
        if "name" in fig:
            out[fig["name"]] = " ".join(str(fig.get("caption", fig["name"])).split())
    return out


def citations(root: Path = ROOT) -> dict[str, str]:
    """``bibtex key -> "Author et al., year"`` (the book's author-year style) from references.bib."""
    from pybtex.database import parse_file

    out = {}
    for key, entry in parse_file(str(root / "book" / "references.bib")).entries.items():
        people = entry.persons.get("author") or entry.persons.get("editor") or []
        names = [" ".join(p.last_names).replace("{", "").replace("}", "") for p in people]
        who = names[0] if len(names) == 1 else f"{names[0]} and {names[1]}" if len(names) == 2 \
            else f"{names[0]} et al." if names else entry.fields.get("title", key)
        out[key] = f"{who}, {entry.fields.get('year', 'n.d.')}"
    return out


def glue_values(executed, glue_json: Path | None = None) -> dict[str, str]:
    """``name -> text/plain`` of every value a page glued: from the ``NN.glue.json`` that myst-nb
    writes next to the executed notebook (it takes the glue outputs out of the notebook), or
    from the notebook's outputs when it was executed outside the build."""
    from myst_nb.ext.glue import extract_glue_data_cell

    if glue_json is not None and glue_json.is_file():
        return {name: bundle["data"]["text/plain"] for name, bundle in json.loads(glue_json.read_text()).items()}
    values = {}
    for cell in executed.cells:
        if cell.cell_type == "code":
            for name, bundle in extract_glue_data_cell(cell):
                values[name] = bundle["data"]["text/plain"]
    return values


# --- MyST to plain Markdown --------------------------------------------------------------------

class Context(types.SimpleNamespace):
    """What a page's roles resolve against: glue values, labels, figures, citations, links."""


def _role(ctx: Context, name: str, text: str) -> str:
    from myst_nb.core.variables import format_plain_text

    explicit = re.fullmatch(r"(.*?)\s*<([^<>]+)>", text, re.S)
    shown, target = (explicit.group(1), explicit.group(2)) if explicit else (None, text)
    if name.startswith("glue"):
        key, spec = target.rsplit(":", 1) if ":" in target else (target, "s")  # as myst-nb splits it
        if key not in ctx.glue:
            raise KeyError(f"{ctx.page}: no glued value {key!r} in the executed notebook; build the book first")
        return format_plain_text(ctx.glue[key], spec)
    if name == "ref":
        title, stem = ctx.labels.get(target, (target, None))
        if stem is None:
            return shown or title
        return f"[{shown or title}]({ctx.page_url(stem)})"
    if name == "numref":
        caption = ctx.figures.get(target, target).split(". ")[0].rstrip(".")
        return (shown or "Figure %s").replace("%s", f"“{caption}”")
    if name.startswith("cite"):
        keys = [k.strip() for k in target.split(",")]
        refs = "; ".join(ctx.citations.get(k, k) for k in keys)
        return f"({refs})" if name in ("cite", "cite:p", "cite:ps") else refs
    if name == "math":
        return f"${target}$"
    return shown or target  # {term}, {doc}, {abbr}, {download}, ...: the words themselves


def directive_options(m: re.Match) -> dict[str, str]:
    """The ``:key: value`` options of a :data:`DIRECTIVE` match (MyST strips quotes around values)."""
    return {k: re.sub(r"""^(["'])(.*)\1$""", r"\2", v.strip()) for k, v in re.findall(r"^:([\w-]+):[ \t]*(.*)$", m.group(4), re.M)}


def included(source: Path, options: dict[str, str]) -> tuple[int, str]:
    """What a ``{literalinclude}`` of ``source`` with ``options`` shows, read by Sphinx's own
    reader (``:pyobject:``, ``:start-after:``, ``:lines:``, ``:dedent:``...): the number of its
    first line in the file, and the text."""
    from sphinx.directives.code import LiteralIncludeReader

    opts = {k: (int(v) if v else None) if k in ("dedent", "lineno-start") else v for k, v in options.items()
            if k not in ("caption", "emphasize-lines", "language", "linenos", "name", "tags")}
    if "lineno-start" not in opts:
        opts["lineno-match"] = True  # so that the reader counts the first line's number in the file
    reader = LiteralIncludeReader(str(source), opts, types.SimpleNamespace(source_encoding="utf-8"))
    code, _ = reader.read()
    return reader.lineno_start, code


def listings(page: Path):
    """``(source file, first line, text)`` of every ``{literalinclude}`` of ``page``."""
    for m in DIRECTIVE.finditer(page.read_text()):
        if m.group(2) == "literalinclude":
            source = (page.parent / m.group(3).strip()).resolve()
            yield (source, *included(source, directive_options(m)))


def _literalinclude(ctx: Context, path: str, options: dict[str, str]) -> str:
    source = (ctx.page_dir / path).resolve()
    _, code = included(source, options)
    caption = options.get("caption") or str(source.relative_to(ctx.root))
    language = options.get("language", "python")
    return f"*{caption}* (`{source.relative_to(ctx.root)}`):\n\n```{language}\n{code.rstrip()}\n```"


def _directive(ctx: Context, m: re.Match) -> str:
    name, argument, body = m.group(2), m.group(3).strip(), m.group(5).strip("\n")
    options = directive_options(m)
    if name == "literalinclude":
        return _literalinclude(ctx, argument, options)
    if name == "solution-end":
        return ""
    if name == "solution-start":
        return "**Solution.**"
    body = markdown(ctx, body)
    if name == "exercise":
        title = f"**Exercise{': ' + argument if argument and not argument.startswith('ex-') else ''}.**"
        return f"{title} {body}"
    title = argument if name == "admonition" else name.replace("-", " ").capitalize()
    quoted = "\n".join(f"> {line}" if line else ">" for line in body.splitlines())
    return f"> **{title}**\n>\n{quoted}"


def markdown(ctx: Context, text: str) -> str:
    """A Markdown cell of a page, as plain Markdown that Jupyter, Colab and GitHub render."""
    text = DIRECTIVE.sub(lambda m: _directive(ctx, m), text)
    text = re.sub(r"^\([\w-]+\)=[ \t]*\n", "", text, flags=re.M)  # targets: nothing to show
    text = re.sub(r"^%.*\n?", "", text, flags=re.M)  # MyST comments
    return ROLE.sub(lambda m: _role(ctx, m.group(1), m.group(2)), text).strip("\n")


# --- the first cell ------------------------------------------------------------------------------

INSTALL_CELL = '''\
# Set-up, for running this notebook outside a clone of the book's repository (Colab, Binder, a
# download): install what this page needs (torch's CPU wheel included), fetch the book's scripts
# and its `ppbook` package, and work from that copy. Inside a clone it does nothing.
# PPBOOK_SOURCE=/path/to/a/clone copies that clone instead and installs with pip --no-index.
{no_archive}import os, pathlib, subprocess, sys
here = pathlib.Path.cwd().resolve()
if not any((d / "_toc.yml").is_file() for d in (here, *here.parents)):
    source, book = os.environ.get("PPBOOK_SOURCE"), here / {folder!r}
    if not (book / "_toc.yml").is_file():
        import shutil, tarfile, tempfile, urllib.request
        if source:
            shutil.copytree(source, book, ignore=shutil.ignore_patterns(".*", "_build", "*.ipynb"))
        elif not {archive!r}:
            raise SystemExit("set PPBOOK_SOURCE to a clone of the book: this copy names no repository to fetch")
        else:
            with tempfile.TemporaryFile() as f:
                with urllib.request.urlopen({archive!r}) as r:
                    shutil.copyfileobj(r, f)
                f.seek(0)
                with tarfile.open(fileobj=f) as tar:
                    top = tar.getnames()[0].split("/")[0]
                    tar.extractall(here)
            (here / top).rename(book)
    pip = [sys.executable, "-m", "pip", "install", "--quiet", *{requirements!r}]
    pip += ["--no-index"] if source else ["--extra-index-url", {index!r}]
    subprocess.run(pip, check=True)
    sys.path.insert(0, str(book / "src"))  # ppbook, here and in the scripts this page launches
    os.environ["PYTHONPATH"] = os.pathsep.join([str(book / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])
    os.chdir(book / "book")'''


def install_cell(code: str, root: Path = ROOT) -> nbformat.NotebookNode:
    """The first cell of a page whose code cells are ``code``: installs the reader's pins plus
    the extras the page uses (e.g. Ray in chapter 9)."""
    repo_url = repository(root)
    # the kernel running the notebook already has its ipykernel; replacing it mid-session breaks Colab
    requirements = [p for p in requirement_pins(root / "requirements-reader.txt") if not p.startswith("ipykernel")]
    developer = {re.split(r"[=\[<>]", p)[0]: p for p in requirement_pins(root / "requirements.txt")}
    requirements += [developer[pkg] for word, pkg in PAGE_EXTRAS.items() if re.search(rf"\b{word}\b", code)]
    archive = f"{repo_url}/archive/refs/heads/{repository_branch(root)}.tar.gz" if repo_url else ""
    no_archive = "" if repo_url else "# This copy was built without a repository address: set PPBOOK_SOURCE.\n"
    source = INSTALL_CELL.format(folder=clone_folder(root), archive=archive, requirements=requirements,
                                 index=TORCH_CPU_INDEX, no_archive=no_archive)
    return nbformat.v4.new_code_cell(source, metadata={"tags": ["ppbook-setup"]})


def clone_folder(root: Path = ROOT) -> str:
    """The folder the install cell puts the book in: the repository's name, or a fixed one."""
    url = repository(root)
    return url.split("/")[-1] if url else "pipeline-parallelism-book"


# --- one page, all pages -----------------------------------------------------------------------

def readable_notebook(page: Path, executed=None, glue: dict | None = None, outputs: bool = False,
                      root: Path = ROOT):
    """``page`` as a plain notebook: readable Markdown, the install cell first. ``executed`` is the
    page's notebook from the build (its glued values and, with ``outputs``, its outputs);
    ``glue`` overrides the glued values (the tests use it without a build)."""
    source = jupytext.read(page)
    notebook = copy.deepcopy(executed) if executed is not None else source
    if len(notebook.cells) != len(source.cells):
        raise ValueError(f"{page.name}: the executed notebook has {len(notebook.cells)} cells, the page "
                         f"{len(source.cells)}: rebuild the book")
    repo_url, branch = repository(root), notebooks_branch(root)
    # links between pages: the published notebooks, or the sibling file of a downloaded one
    page_url = (lambda stem: f"{repo_url}/blob/{branch}/book/{stem}.ipynb") if repo_url else (lambda stem: f"{stem}.ipynb")
    ctx = Context(page=page.name, root=root, page_dir=page.parent, labels=labels(root),
                  figures=figure_captions(source), citations=citations(root),
                  glue=glue if glue is not None else glue_values(executed),
                  page_url=page_url)
    code = "\n".join(c.source for c in source.cells if c.cell_type == "code")
    for cell in notebook.cells:
        if cell.cell_type == "markdown":
            cell.source = markdown(ctx, cell.source)
        elif cell.cell_type == "code" and not outputs:
            cell.outputs, cell.execution_count = [], None
    notebook.cells.insert(0, install_cell(code, root))
    notebook.metadata.pop("jupytext", None)
    notebook.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    for cell in notebook.cells:
        cell.pop("id", None)  # nbformat 4.5 ids from the build are not stable; leave them out
    notebook.nbformat_minor = min(notebook.nbformat_minor, 4)
    return notebook


def write_notebooks(build: Path, root: Path = ROOT) -> list[Path]:
    """Both copies of every page (see the module docstring) from the build in ``build``."""
    executed_dir = build / "jupyter_execute" / "book"
    published = build / "notebooks"
    if published.exists():
        shutil.rmtree(published)
    (published / "book").mkdir(parents=True)
    shutil.copytree(root / "binder", published / "binder")
    (published / "README.md").write_text(
        "# Notebooks of *Pipeline Parallelism in PyTorch*\n\n"
        f"Generated by `make notebooks` from {repository(root) or 'the book'} (branch "
        f"`{repository_branch(root)}`); do not edit. Open one in Colab or Binder "
        "from the book's launch buttons; the first cell of each installs what it needs.\n")
    written = []
    for page in notebook_pages(root):
        executed_path = executed_dir / f"{page.stem}.ipynb"
        if not executed_path.is_file():
            raise FileNotFoundError(f"no executed notebook {executed_path}: run `make book` (or jupyter-book "
                                    f"build) first, or pass --build to the folder the build wrote")
        executed = nbformat.read(executed_path, as_version=4)
        glue = glue_values(executed, executed_path.with_suffix(".glue.json"))
        target = published / "book" / f"{page.stem}.ipynb"
        nbformat.write(readable_notebook(page, executed, glue, root=root), target)
        written.append(target)
        download = build / "html" / "_sources" / "book" / f"{page.stem}.ipynb"
        if download.parent.is_dir():  # the page's download button
            nbformat.write(readable_notebook(page, executed, glue, outputs=True, root=root), download)
    return written


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", type=Path, default=ROOT / "_build",
                   help="the build folder holding jupyter_execute/ (and html/); default _build")
    args = p.parse_args(argv)
    try:
        written = write_notebooks(args.build)
    except (FileNotFoundError, KeyError, ValueError) as exc:
        print(f"make_notebooks.py: error: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return 2
    print(f"wrote {len(written)} notebooks to {args.build / 'notebooks'} (and the download copies)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
