"""The planner's schedules are torch's: placement, constraints and every rank's order of actions,
computed without torch, equal to what torch 2.13's own schedule classes build (on mock stages)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ppbook import torch_orders
from ppbook.planner import schedules as S

GRID = [(name, p, m, v) for name in S.TORCH_SCHEDULES for p in (1, 2, 3, 4, 5, 8)
        for m in range(1, 3 * p + 3) for v in ((2, 3, 4) if S.placement(name) == "loop" else (2,))]


def test_the_planner_imports_no_torch_and_nothing_of_ppbook_outside_it():
    """The planner runs where torch cannot (the site's planner page is its port): importing all
    of it must not import torch, nor any module of ``ppbook`` outside ``ppbook.planner`` (one
    subpackage holds everything it computes with)."""
    code = ("import sys, importlib, pkgutil, ppbook.planner as p\n"
            "for m in pkgutil.iter_modules(p.__path__): importlib.import_module('ppbook.planner.' + m.name)\n"
            "print(sorted(k for k in sys.modules if k == 'torch' or k.startswith('torch.')))\n"
            "print(sorted(k for k in sys.modules if k.startswith('ppbook.') and not k.startswith('ppbook.planner')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120).stdout
    assert out.split("\n")[:2] == ["[]", "[]"], out


def test_placement_is_torchs():
    from torch.distributed.pipelining import schedules
    from torch.distributed.pipelining._utils import generate_stage_to_rank_mapping

    for name in S.TORCH_SCHEDULES:
        single = issubclass(getattr(schedules, f"Schedule{name}"), schedules.PipelineScheduleSingle)
        assert (S.placement(name) == "single") == single, name
        if single:
            continue
        for p in (1, 2, 3, 4, 8):
            for v in ((2, 3, 4) if S.placement(name) == "loop" else (2,)):
                style = "v" if S.placement(name) == "v" else "loop"
                assert S.stage_to_rank(name, p, v) == generate_stage_to_rank_mapping(p, p * v, style=style), (name, p, v)


def _text(order) -> dict[int, list[str]]:
    return {r: [str(a) for a in acts] for r, acts in order.items()}


def test_every_order_and_refusal_is_torchs():
    """Over 1,000 (schedule, p, m, v): the same actions in the same order on every rank, or the
    same refusal (m too small, m not a multiple of the rounds)."""
    for name, p, m, v in GRID:
        try:
            theirs = _text(torch_orders.torch_order(name, p, m, v))
        except ValueError:
            theirs = None
        try:
            ours = _text(S.order(name, p, m, v))
        except ValueError:
            ours = None
        assert ours == theirs, (name, p, m, v)
    assert len(GRID) > 1000


@pytest.mark.parametrize("name", S.TORCH_SCHEDULES)
def test_every_action_of_every_microbatch_once(name):
    p, m, v = 4, 8, 2
    order = S.order(name, p, m, v)
    n = p * S.stages_per_rank(name, v)
    for stage in range(n):
        kinds = sorted(a.kind for acts in order.values() for a in acts if a.stage == stage)
        split = name in S.SPLIT_BACKWARD
        assert kinds.count("F") == m and kinds.count("B") + kinds.count("I") == m
        assert kinds.count("W") == kinds.count("I") and (split or not kinds.count("I"))


def test_deep_interleaving_holds_megatrons_warm_up():
    """What the planner counts in flight under interleaved 1F1B, up to v = 12 stages per rank, is
    Megatron-LM's warm-up (Narayanan et al. 2021): rank r runs 2 (p - r - 1) + (v - 1) p forwards
    of one stage and microbatch before its first backward, and holds one more, at most all m v."""
    from ppbook.planner import search

    for p in (2, 4, 8):
        for v in (2, 3, 5, 12):
            for m in (p, 2 * p, 4 * p):
                held = search.in_flight("Interleaved1F1B", p, m, v)
                for r in range(p):
                    assert sum(c for _, c, _ in held[r]) == min(m * v, 2 * (p - r - 1) + (v - 1) * p + 1), (p, v, m, r)
