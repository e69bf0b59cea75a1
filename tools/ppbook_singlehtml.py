"""Sphinx extension: myst-nb's hidden-input cells in the single-page HTML build of `make pdf`.

myst-nb registers how to write its `HideCodeCellNode` (a `hide-input` cell) for the `html`
builder only, so `jupyter-book build --builder singlehtml` warns "unknown node type" on every
such cell, and `-W` fails. The single page is the same HTML: reuse myst-nb's own writers.
Loaded through `sphinx.local_extensions` in `_config.yml`.
"""

from __future__ import annotations


def setup(app):
    from myst_nb.sphinx_ import HideCodeCellNode, depart_HideCellInput, visit_HideCellInput

    app.add_node(HideCodeCellNode, override=True, html=(visit_HideCellInput, depart_HideCellInput),
                 singlehtml=(visit_HideCellInput, depart_HideCellInput))
    return {"parallel_read_safe": True, "parallel_write_safe": True}
