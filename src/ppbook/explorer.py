"""The interactive schedule explorer of the site: precomputed simulations and the page that shows them.

Introduced in the explorer page (``book/explorer.md``), after chapter 5 ("The schedules").

The site is static and works offline, so nothing simulates in the reader's browser. The build
runs :func:`ppbook.simulate.simulate` on torch's own orders (:func:`ppbook.simulate.torch_order`)
for every combination of a small grid (the seven schedules, p, m, v and the F/I/W costs) and
embeds the results as JSON in the page; a small script (``explorer.js``, next to this file)
only looks up the chosen entry and draws it as SVG. The bubble, step time and peak microbatches
per stage are computed here, by the package's own functions, never in JavaScript.
"""

from __future__ import annotations

import html
import itertools
import json
from importlib import resources

from ppbook import simulate, stages, timeline

# The grid: small enough that the page stays light (about 0.25 MB, 60 orders, 464 simulations)
# and the build fast (about half a minute, mostly torch building its orders).
GRID = {
    "schedule": list(stages.TORCH_SCHEDULES),
    "p": [2, 3, 4],
    "m": [4, 8],
    "v": [2, 3],      # stages per rank of the looped schedules (V-shaped ones always hold 2)
    "F": [1.0, 2.0],  # cost of a rank's whole share of the model: forward,
    "I": [1.0, 2.0],  # input-gradient backward,
    "W": [0.5, 1.0],  # and weight-gradient backward (a full backward B costs I + W)
}
QUANTUM = 12  # times are stored as integers in 1/12 of a cost unit (exact for this grid's costs)


def costs(name: str, v: int, f: float, i: float, w: float) -> dict[str, float]:
    """Per-action costs: a stage is 1/v of its rank's share of the model (chapter 5's convention)."""
    k = stages.stages_per_rank(name, v)
    return {"F": f / k, "I": i / k, "W": w / k, "B": (i + w) / k}


def order_key(name: str, p: int, m: int, v: int) -> str:
    """The order of a combination; ``v`` is 1 or 2 where the schedule fixes it."""
    v = {"single": 1, "v": 2}.get(stages.placement(name), v)
    return f"{name}|{p}|{m}|{v}"


def key(name: str, p: int, m: int, v: int, f: float, i: float, w: float) -> str:
    """The entry of a combination in :func:`grid`."""
    return f"{order_key(name, p, m, v)}|{f:g}|{i:g}|{w:g}"


def order_entry(name: str, p: int, m: int, v: int) -> tuple[dict, simulate.Order | None]:
    """Each rank's actions, in torch's order, as ``[rank, stage, kind, microbatch]`` rows, with
    the peak microbatches each stage holds; or ``{"error": ...}`` in torch's or the book's
    words when the schedule cannot run the combination."""
    problem = stages.schedule_problem(name, p, m, v)
    order = None
    if problem is None:
        try:
            order = simulate.torch_order(name, p, m, v)
        except ValueError as exc:
            problem = str(exc)
    if problem is not None:
        return {"error": problem}, None
    rows = [[r, a.stage, a.kind, a.microbatch] for r, acts in order.items() for a in acts]
    return {"actions": rows, "peak": simulate.peak_in_flight(order), "stages": stages.stages_per_rank(name, v) * p}, order


def entry(name: str, order: simulate.Order, v: int, f: float, i: float, w: float) -> dict:
    """One cost triple on one order: each action's simulated start (in the order's row order,
    in 1/QUANTUM of a cost unit), its duration per kind, the step time and the bubble."""
    cost = costs(name, v, f, i, w)
    events = {(e.rank, e.stage, e.kind, e.microbatch): e for e in simulate.simulate(order, cost)}
    start, end = timeline.span(list(events.values()))
    busy = timeline.busy_fractions(list(events.values()))
    return {
        "start": [round(events[(r, a.stage, a.kind, a.microbatch)].start * QUANTUM)
                  for r, acts in order.items() for a in acts],
        "duration": {kind: round(c * QUANTUM) for kind, c in cost.items()},
        "step": round(end - start, 4),
        "bubble": round(1 - sum(busy.values()) / len(busy), 4),
    }


def grid() -> dict:
    """Every combination of :data:`GRID`: torch builds each order once, the simulator runs it
    with every cost triple."""
    orders, entries = {}, {}
    for name, p, m, v in itertools.product(*(GRID[k] for k in ("schedule", "p", "m", "v"))):
        okey = order_key(name, p, m, v)
        if okey in orders:
            continue
        orders[okey], order = order_entry(name, p, m, v)
        if order is None:
            continue
        for f, i, w in itertools.product(GRID["F"], GRID["I"], GRID["W"]):
            entries[key(name, p, m, v, f, i, w)] = entry(name, order, v, f, i, w)
    return {"grid": GRID, "quantum": QUANTUM, "colours": timeline.KIND_COLOURS,
            "placement": {n: stages.placement(n) for n in stages.TORCH_SCHEDULES}, "orders": orders, "entries": entries}


def page(data: dict | None = None) -> str:
    """The explorer as one self-contained HTML fragment: controls, the data, and the drawing script."""
    data = grid() if data is None else data
    script = resources.files("ppbook").joinpath("explorer.js").read_text()
    payload = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    controls = ['<label>schedule <select id="ppx-schedule">'
                + "".join(f'<option value="{html.escape(n)}">{html.escape(n)}</option>' for n in GRID["schedule"])
                + "</select></label>"]
    for name in ("p", "m", "v", "F", "I", "W"):
        controls.append(f'<label>{name} <input type="range" id="ppx-{name}" min="0" max="{len(GRID[name]) - 1}" '
                        f'step="1" value="{1 if name == "m" else 0}"> <output id="ppx-{name}-value"></output></label>')
    return (f'<div id="ppx" class="ppx">\n<div class="ppx-controls">{" ".join(controls)}</div>\n'
            '<p class="ppx-stats" id="ppx-stats"></p>\n<div id="ppx-chart"></div>\n</div>\n'
            f'<script type="application/json" id="ppx-data">{payload}</script>\n<script>\n{script}\n</script>')


def show():
    """Display the explorer in a notebook cell (the page's only output)."""
    from IPython.display import HTML, display

    display(HTML(page()))
