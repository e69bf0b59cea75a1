"""The planner page of the site: the book's planner, running in the reader's browser.

Introduced in the planner page (``book/explorer.md``), after chapter 10 ("Choosing a layout").

The site is static and works offline (from ``file://`` too), so the page cannot call Python.
It runs ``planner/planner.js``, a port of the torch-free planner core (:mod:`ppbook.planner`)
that ``tests/test_explorer.py`` proves equal to the Python on a grid of several hundred
requests, layouts and schedule orders. Everything the port starts from (model presets, GPUs,
links, the H100 measurements, the fitted efficiencies) is exported here, by :func:`planner_data`,
from the Python package itself, so no number is typed twice. ``explorer.js`` draws the page:
the request form, the ranked table, memory per rank and the timeline of one step, and the
schedules with abstract costs (the teaching view of chapter 5).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from importlib import resources

from ppbook import timeline
from ppbook.planner import costs, hardware, memory, schedules, search, shapes

# What the page asks first: a model most readers know, on four nodes, with a batch small enough
# that the first timeline can be read (a few dozen actions per rank, not hundreds).
DEFAULT_REQUEST = {"model": "llama3-70b", "gpu": "h100-sxm", "gpus": 32, "gpus_per_node": 8,
                   "global_batch": 48, "seq_len": 4096}
MEASURED_KEYS = ("model", "part", "seq_len", "microbatch", "F_ms", "I_ms", "W_ms_est")


def planner_data() -> dict:
    """Everything ``planner.js`` and the page need, from the Python package: presets, GPUs,
    links, the measured H100 rows and the efficiency lines fitted to them, and the defaults."""
    return {
        "measured_rows": [{k: r[k] for k in MEASURED_KEYS} for r in costs.measured_rows()],
        "efficiency": {k: list(v) for k, v in costs.EFFICIENCY.items()},
        "efficiency_range": list(costs.EFFICIENCY_RANGE),
        "measured_gpu": costs.MEASURED_GPU,
        "attention_backward": costs.ATTENTION_BACKWARD,
        "presets": {k: asdict(v) for k, v in shapes.PRESETS.items()},
        "gpus": {k: asdict(v) for k, v in hardware.GPUS.items()},
        "links": {k: asdict(v) for k, v in hardware.LINKS.items()},
        "inter_default": hardware.INTER_DEFAULT,
        "request": DEFAULT_REQUEST,
        "request_defaults": search.request_defaults(),
        "slack": search.SLACK,
        "choices": {"schedules": list(schedules.TORCH_SCHEDULES), "sharding": list(memory.SHARDING),
                    "recompute": list(memory.RECOMPUTE), "balance": list(search.BALANCES),
                    "recipe": list(memory.RECIPES), "kernels": list(memory.KERNELS)},
        "colours": timeline.KIND_COLOURS,
    }


def script(name: str) -> str:
    """A file shipped with the package: ``planner.js`` (the port), ``explorer.js`` (the page) or
    ``explorer.css`` (its style)."""
    folder = resources.files("ppbook").joinpath("planner") if name == "planner.js" else resources.files("ppbook")
    return folder.joinpath(name).read_text()


def page(data: dict | None = None) -> str:
    """The planner as one self-contained HTML fragment: the form, the data, the port and the
    drawing script (the script builds the controls from the data)."""
    data = planner_data() if data is None else data
    payload = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    code = (script("planner.js") + "\n" + script("explorer.js")).replace("</script", "<\\/script")
    return (f'<style>\n{script("explorer.css")}</style>\n'
            '<div id="ppx" class="ppx"><noscript>The planner needs JavaScript.</noscript></div>\n'
            f'<script type="application/json" id="ppx-data">{payload}</script>\n<script>\n{code}\n</script>')


def source_digest(data: dict | None = None) -> str:
    """A digest of everything the page is made of: its template, the port, the drawing, its style
    and the data it embeds (presets, GPUs, links, the H100 rows, the fitted efficiencies, the
    opening request), that is :func:`page` itself. The screenshot in the page carries the digest
    it was taken with, and a test says when the page changed since, code or numbers."""
    import hashlib

    return hashlib.sha256(page(data).encode()).hexdigest()[:16]


def weight(data: dict | None = None) -> int:
    """Bytes the planner adds to its page."""
    return len(page(data).encode())


def show():
    """Display the planner in a notebook cell (the page's only output)."""
    from IPython.display import HTML, display

    display(HTML(page()))


__all__ = ["DEFAULT_REQUEST", "page", "planner_data", "script", "show", "source_digest", "weight"]
