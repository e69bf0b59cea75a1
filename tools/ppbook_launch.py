"""Sphinx extension: the repository and launch buttons, from one setting, opening the generated notebooks.

``ppbook_repository`` (``_config.yml``, sphinx.config) is the book's GitHub repository, filled
in by whoever publishes the book. Set, every page gets the theme's repository, issue and edit
buttons and its Colab and Binder buttons; empty (as in a fresh clone), none of them, so that no
button leads to a repository that does not exist, and the download buttons stay.

sphinx-book-theme points Colab and Binder at `book/NN_slug.md` on the configured branch. Colab
opens only `.ipynb` files, and the `.md` page is raw MyST outside the site, so both buttons are
pointed at the readable notebook that `tools/make_notebooks.py` writes and `make
publish-notebooks` pushes to the branch named by `ppbook_notebooks_branch` (see README.md,
"Publishing"). Loaded through `sphinx.local_extensions` in `_config.yml`.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from sphinx.errors import ConfigError

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_notebooks import check_repository, launch_urls  # noqa: E402


# The launch buttons of a published book (Colab, Binder): _point_at_notebooks aims them at the
# generated notebooks.
LAUNCH_BUTTONS = {"notebook_interface": "jupyterlab", "binderhub_url": "https://mybinder.org",
                  "colab_url": "https://colab.research.google.com"}


def _repository_buttons(app, config) -> None:
    """With ``ppbook_repository`` set: the theme's repository options and its three buttons."""
    try:
        url = check_repository(config.ppbook_repository)
    except ValueError as e:
        raise ConfigError(f"_config.yml: {e}") from None
    if url is None:
        return
    options = dict(config.html_theme_options)
    options.update(repository_url=url, repository_branch=config.ppbook_repository_branch, path_to_docs="",
                   use_repository_button=True, use_issues_button=True, use_edit_page_button=True,
                   launch_buttons=LAUNCH_BUTTONS)
    config.html_theme_options = options


def _offer_the_notebook(app, pagename, templatename, context, doctree) -> None:
    """Without launch buttons the theme offers no notebook to download (it copies the executed
    notebook to ``_sources`` only when a launch provider is set): copy it here, as the theme
    would, so the download button's ``.ipynb`` stays (``tools/make_notebooks.py`` then writes the
    readable copy over it)."""
    if app.config.html_theme_options.get("repository_url"):
        return  # a published book has launch buttons: the theme does it
    executed = Path(app.outdir).parent / "jupyter_execute" / f"{pagename}.ipynb"
    if not executed.is_file():
        return
    target = Path(app.outdir) / "_sources" / f"{pagename}.ipynb"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(executed, target)
    context["ipynb_source"] = f"{pagename}.ipynb"


def _point_at_notebooks(app, pagename, templatename, context, doctree) -> None:
    repo_url = app.config.html_theme_options.get("repository_url", "")
    if not repo_url:
        return
    urls = launch_urls(repo_url, app.config.ppbook_notebooks_branch, pagename)
    for group in context.get("header_buttons", []):
        for button in group.get("buttons", []) if group.get("label") == "launch-buttons" else []:
            if button.get("text") in urls:
                button["url"] = urls[button["text"]]


def setup(app):
    app.add_config_value("ppbook_repository", "", "html")
    app.add_config_value("ppbook_repository_branch", "main", "html")
    app.add_config_value("ppbook_notebooks_branch", "notebooks", "html")
    app.connect("config-inited", _repository_buttons)
    # before sphinx-book-theme's header buttons (priority 501) read ipynb_source
    app.connect("html-page-context", _offer_the_notebook, priority=500)
    # after sphinx-book-theme's add_launch_buttons (priority 501), before the page is written
    app.connect("html-page-context", _point_at_notebooks, priority=502)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
