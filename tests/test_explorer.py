"""The schedule explorer's data: every combination of the grid, computed by the package's own
simulator on torch's orders (the page's script only draws it; tests/test_browser.py drives it)."""

from __future__ import annotations

import json
import re

import pytest

from ppbook import bubble, explorer, simulate, stages


@pytest.fixture(scope="module")
def data():
    return explorer.grid()


def test_every_combination_has_an_entry_or_a_reason(data):
    for name, p, m, v, f, i, w in __import__("itertools").product(*explorer.GRID.values()):
        order = data["orders"][explorer.order_key(name, p, m, v)]
        if "error" in order:
            assert stages.schedule_problem(name, p, m, v) or "microbatches" in order["error"]
            continue
        entry = data["entries"][explorer.key(name, p, m, v, f, i, w)]
        assert len(entry["start"]) == len(order["actions"])
        assert 0 <= entry["bubble"] < 1 and entry["step"] > 0


def test_entries_agree_with_the_closed_form_and_the_simulator(data):
    for p in explorer.GRID["p"]:
        for m in explorer.GRID["m"]:
            gpipe = data["entries"][explorer.key("GPipe", p, m, 2, 1.0, 1.0, 1.0)]
            assert gpipe["bubble"] == pytest.approx(bubble.bubble_fraction(p, m), abs=1e-4)
            assert data["orders"][explorer.order_key("GPipe", p, m, 2)]["peak"] == {s: m for s in range(p)}
    # the stored start times are the simulator's, in the quantum the page draws with
    name, p, m, v = "ZBVZeroBubble", 4, 8, 2
    order = simulate.torch_order(name, p, m, v)
    events = simulate.simulate(order, explorer.costs(name, v, 2.0, 1.0, 0.5))
    entry = data["entries"][explorer.key(name, p, m, v, 2.0, 1.0, 0.5)]
    starts = {(e.rank, e.stage, e.kind, e.microbatch): e.start for e in events}
    rows = data["orders"][explorer.order_key(name, p, m, v)]["actions"]
    assert [starts[tuple(r)] * explorer.QUANTUM for r in rows] == pytest.approx(entry["start"])
    assert entry["duration"]["F"] == explorer.costs(name, v, 2.0, 1.0, 0.5)["F"] * explorer.QUANTUM


def test_a_refused_combination_says_why(data):
    assert "microbatches" in data["orders"][explorer.order_key("DualPipeV", 4, 4, 2)]["error"]


def test_the_page_is_self_contained_and_light(data):
    html = explorer.page(data)
    assert len(html.encode()) < 400_000
    assert not re.search(r"""(src|href)=["']?https?:""", html)  # offline: nothing fetched
    payload = re.search(r'<script type="application/json" id="ppx-data">(.*?)</script>', html, re.S).group(1)
    assert json.loads(payload.replace("<\\/", "</")) == json.loads(json.dumps(data))
    for control in ("schedule", "p", "m", "v", "F", "I", "W"):
        assert f'id="ppx-{control}"' in html
