"""The planner page of the site: the book's planner, running in the reader's browser.

Introduced in the planner page (``book/explorer.md``), after chapter 10 ("Choosing a layout").

The site is static and works offline (from ``file://`` too), so the page cannot call Python.
It runs ``planner/planner.js``, a port of the torch-free planner core (:mod:`ppbook.planner`)
that ``tests/test_explorer.py`` proves equal to the Python on a grid of several hundred
requests, layouts and schedule orders. Everything the port starts from (model presets, GPUs,
links, the H100 and H200 measurements, the fitted efficiencies) is exported here, by
:func:`planner_data`, from the Python package itself, so no number is typed twice. ``explorer.js`` draws the page:
the request form, the ranked table, memory per rank and the timeline of one step, and the
schedules with abstract costs (the teaching view of chapter 5).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from importlib import resources
from pathlib import Path

from ppbook import timeline
from ppbook.planner import calibration, costs, export, hardware, memory, schedules, search, shapes

# What the page asks first: a model most readers know, on four nodes, with a batch small enough
# that the first timeline can be read (a few dozen actions per rank, not hundreds).
DEFAULT_REQUEST = {"model": "llama3-70b", "gpu": "h100-sxm", "gpus": 32, "gpus_per_node": 8,
                   "global_batch": 48, "seq_len": 4096}
MEASURED_KEYS = ("gpu", "model", "part", "seq_len", "microbatch", "F_ms", "I_ms", "W_ms_est")


def planner_data() -> dict:
    """Everything ``planner.js`` and the page need, from the Python package: presets, GPUs,
    links, the measured H100 and H200 rows and the efficiency lines fitted to them, and the defaults."""
    return {
        # the measured rows, their keys once (the page stays light)
        "measured": {"keys": list(MEASURED_KEYS), "rows": [[r[k] for k in MEASURED_KEYS] for r in costs.measured_rows()]},
        "efficiency": {k: list(v) for k, v in costs.EFFICIENCY.items()},
        "efficiency_range": list(costs.EFFICIENCY_RANGE),
        "attention_backward": costs.ATTENTION_BACKWARD,
        "expert_gemm_tflops": [list(r) for r in costs.EXPERT_GEMM_TFLOPS],  # grouped GEMMs by rows per expert
        "presets": {k: asdict(v) for k, v in shapes.PRESETS.items()},
        "gpus": {k: asdict(v) for k, v in hardware.GPUS.items()},
        "links": {k: asdict(v) for k, v in hardware.LINKS.items()},
        "request": DEFAULT_REQUEST,
        "request_defaults": search.request_defaults(),
        "slack": search.SLACK,
        "choices": {"schedules": list(schedules.TORCH_SCHEDULES), "sharding": list(memory.SHARDING),
                    "recompute": list(memory.RECOMPUTE), "balance": list(search.BALANCES),
                    "recipe": list(memory.RECIPES), "kernels": list(memory.KERNELS)},
        "colours": timeline.KIND_COLOURS,
        # what the exports need (ppbook.planner.export, also read by plan.export): the frameworks' options, torchtitan's
        # registry and what it overrides there, Megatron's flags, the placeholders
        "export": {"frameworks": {k: {o: list(v) for o, v in fw.items()} for k, fw in export.FRAMEWORKS.items()},
                   "torchtitan_registry": {k: list(v) for k, v in export.TORCHTITAN_REGISTRY.items()},
                   "torchtitan_version": export.TORCHTITAN_VERSION,
                   "torchtitan_overrides": list(export.TORCHTITAN_OVERRIDES),
                   "torchtitan_loss_chunks": export.TORCHTITAN_LOSS_CHUNKS,
                   "torchtitan_checkpoint_interval": export.TORCHTITAN_CHECKPOINT_INTERVAL,
                   "torchtitan_entry_notes": dict(export.TORCHTITAN_ENTRY_NOTES),
                   "megatron_lm_release": export.MEGATRON_LM_RELEASE,
                   "megatron_sharding": {k: list(v) for k, v in export.MEGATRON_SHARDING.items()},
                   "megatron_overlap": {k: list(v) for k, v in export.MEGATRON_OVERLAP.items()},
                   "megatron_mlp": {k: list(v) for k, v in export.MEGATRON_MLP.items()},
                   "megatron_dispatcher": {k: list(v) for k, v in export.MEGATRON_DISPATCHER.items()},
                   "megatron_precision": {k: list(v) for k, v in export.MEGATRON_PRECISION.items()},
                   "megatron_optimizer": {k: list(v) for k, v in export.MEGATRON_OPTIMIZER.items()},
                   "torchtitan_precision_notes": dict(export.TORCHTITAN_PRECISION_NOTES),
                   "megatron_vocab_divisor": export.MEGATRON_VOCAB_DIVISOR,
                   "placeholders": dict(export.PLACEHOLDERS)},
        # the band every printed time carries (chapter 10), for each framework and GPU preset (other GPUs: "other"),
        # with the lines the command line prints about it
        "calibration": calibration_data(),
        "thin_margin": calibration.THIN_MARGIN,
        "multiples": list(search.MULTIPLES),
    }


def calibration_data() -> dict:
    """Each framework's band on each GPU preset, and on any other GPU ("other"), with the lines
    ``python -m ppbook.plan`` prints about it (:func:`ppbook.planner.calibration.band_for`): the
    distinct bands once (``bands``), and for each framework and GPU the index of its own (``family``)."""
    bands, family = [], {}
    for fw in calibration.FRAMEWORKS:
        family[fw] = {}
        for gpu in [*hardware.GPUS, ""]:
            band = calibration.band_for(gpu, fw)
            entry = {**asdict(band), "describe": band.describe(), "cautions": calibration.cautions(gpu, fw)}
            if entry not in bands:
                bands.append(entry)
            family[fw][gpu or "other"] = bands.index(entry)
    return {"bands": bands, "family": family}


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
    code = (compact(script("planner.js")) + "\n" + script("explorer.js")).replace("</script", "<\\/script")
    return (f'<style>\n{script("explorer.css")}</style>\n'
            '<div id="ppx" class="ppx"><noscript>The planner needs JavaScript.</noscript></div>\n'
            f'<script type="application/json" id="ppx-data">{payload}</script>\n<script>\n{code}\n</script>')


def compact(js: str) -> str:
    """``js`` as the page ships it: without its whole-line ``//`` comments and its indentation, which
    the browser does not need (the port is read in ``planner.js`` itself). Its lines are kept, so an
    error in the page still names a line; the port holds no template literal that spans lines."""
    return "\n".join(line.strip() for line in js.split("\n") if not line.strip().startswith("//"))


def source_digest(data: dict | None = None) -> str:
    """A digest of everything the page is made of: its template, the port, the drawing, its style
    and the data it embeds (presets, GPUs, links, the measured rows, the fitted efficiencies, the
    opening request), that is :func:`page` itself. The screenshot in the page carries the digest
    it was taken with, and a test says when the page changed since, code or numbers."""
    import hashlib

    return hashlib.sha256(page(data).encode()).hexdigest()[:16]


def weight(data: dict | None = None) -> int:
    """Bytes the planner adds to its page."""
    return len(page(data).encode())


def page_weight(root: Path | None = None) -> dict[str, int]:
    """Bytes a browser fetches for the planner's page of the built site, by part, from the files
    the page references: ``planner`` (what :func:`page` puts in it), ``screenshot``
    (``book/images/planner.png``), ``mathjax`` (the script ``_config.yml``'s ``mathjax_path``
    names, in its ``html_static_path``) and ``theme`` (the scripts and style sheets the theme's
    templates name, and the icon fonts those style sheets name). Sphinx's own small scripts and
    the site's search index come on top; ``tests/test_browser.py`` holds the sum close to what
    Chromium fetches for the page. Without the book's build environment (a reader's, where the
    theme is not installed) ``theme`` is 0."""
    import yaml

    from ppbook import launch

    root = launch.repo_root() if root is None else root
    config = yaml.safe_load((root / "_config.yml").read_text())["sphinx"]["config"]
    mathjax = [root / folder / config["mathjax_path"] for folder in config["html_static_path"]]
    return {"planner": weight(), "screenshot": (root / "book" / "images" / "planner.png").stat().st_size,
            "mathjax": next(f for f in mathjax if f.is_file()).stat().st_size,
            "theme": sum(f.stat().st_size for f in theme_assets())}


def theme_assets() -> list[Path]:
    """The files of the book's theme (pydata-sphinx-theme under sphinx-book-theme) that every page
    loads: those its templates' asset macros name, and the fonts their style sheets name."""
    import importlib
    import re

    files = set()
    for package in ("pydata_sphinx_theme", "sphinx_book_theme"):
        try:
            static = Path(importlib.import_module(package).__file__).parent / "theme" / package / "static"
        except ImportError:  # a reader's environment: no book build
            return []
        for macros in static.glob("*webpack-macros.html"):
            files |= {static / name for name in re.findall(r"pathto\('_static/([^']+)'", macros.read_text())}
    fonts = {(css.parent / url).resolve() for css in files if css.suffix == ".css"
             for url in re.findall(r"url\(([^)'\"]+\.woff2)\)", css.read_text())}
    return sorted(files | fonts)


def show():
    """Display the planner in a notebook cell (the page's only output)."""
    from IPython.display import HTML, display

    display(HTML(page()))


__all__ = ["DEFAULT_REQUEST", "page", "page_weight", "planner_data", "script", "show", "source_digest",
           "theme_assets", "weight"]
