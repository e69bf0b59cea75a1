"""Sphinx extension: the Colab and Binder buttons open the page's generated notebook.

sphinx-book-theme points both at `book/NN_slug.md` on the configured branch. Colab opens only
`.ipynb` files, and the `.md` page is raw MyST outside the site, so both buttons are pointed at
the readable notebook that `tools/make_notebooks.py` writes and `make publish-notebooks` pushes
to the branch named by `ppbook_notebooks_branch` (see README.md, "Reading the chapters as
notebooks"). Loaded through `sphinx.local_extensions` in `_config.yml`.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_notebooks import launch_urls  # noqa: E402


def _point_at_notebooks(app, pagename, templatename, context, doctree) -> None:
    repo_url = app.config.html_theme_options.get("repository_url", "")
    if "github.com/" not in repo_url:
        return
    urls = launch_urls(repo_url, app.config.ppbook_notebooks_branch, pagename)
    for group in context.get("header_buttons", []):
        for button in group.get("buttons", []) if group.get("label") == "launch-buttons" else []:
            if button.get("text") in urls:
                button["url"] = urls[button["text"]]


def setup(app):
    app.add_config_value("ppbook_notebooks_branch", "notebooks", "html")
    # after sphinx-book-theme's add_launch_buttons (priority 501), before the page is written
    app.connect("html-page-context", _point_at_notebooks, priority=502)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
