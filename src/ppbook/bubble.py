"""Closed-form bubble arithmetic, with its two conventions kept apart.

Introduced in chapter 3 ("GPipe and the bubble"). With p stages of equal cost and m microbatches,
a GPipe or 1F1B step lasts (m + p - 1) slots of (forward + backward) per microbatch, of which each
rank computes in m (Huang et al. 2019; Narayanan et al. 2021).

* :func:`bubble_fraction` -- idle share of the step time: (p - 1) / (m + p - 1).
* :func:`bubble_overhead` -- idle time relative to the ideal (bubble-free) time: (p - 1) / m.
  This is the measure Megatron-LM reports.

At p = 4, m = 8 they are 27.3% and 37.5%: always say which one a number is.
"""

from __future__ import annotations

from ppbook.planner.simulate import Costs, simulate
from ppbook.planner.schedules import Order


def _check(p: int, m: int) -> None:
    if p < 1 or m < 1:
        raise ValueError(f"need p >= 1 stages and m >= 1 microbatches, got p={p}, m={m}")


def bubble_fraction(p: int, m: int) -> float:
    """Idle fraction of each rank's step time: (p - 1) / (m + p - 1)."""
    _check(p, m)
    return (p - 1) / (m + p - 1)


def bubble_overhead(p: int, m: int) -> float:
    """Idle time as a fraction of the ideal compute time: (p - 1) / m."""
    _check(p, m)
    return (p - 1) / m


def busy_fraction(p: int, m: int) -> float:
    """Share of the step each rank computes: m / (m + p - 1) = 1 - bubble_fraction."""
    return 1.0 - bubble_fraction(p, m)


def speedup_over_naive(p: int, m: int) -> float:
    """Ideal step-time ratio naive (one microbatch through p stages) / GPipe with m microbatches.

    Naive: the whole batch passes the p stages one after another, p * (F + B) of the full batch.
    GPipe: (m + p - 1) slots, each of (F + B) / m of the full batch. Ratio: p * m / (m + p - 1).
    """
    _check(p, m)
    return p * m / (m + p - 1)


def min_microbatches_for_fraction(p: int, target: float) -> int:
    """Smallest m whose bubble fraction is at most ``target`` (0 < target < 1)."""
    if not 0 < target < 1:
        raise ValueError(f"target must be in (0, 1), got {target}")
    m = 1
    while bubble_fraction(p, m) > target:
        m += 1
    return m


# ---------------------------------------------------------------------------------------------
# Chapter 5: the other schedules, as time per rank (not fractions), each in its paper's terms
# ---------------------------------------------------------------------------------------------
def interleaved_overhead(p: int, m: int, v: int) -> float:
    """Interleaved 1F1B with v model chunks per rank (Narayanan et al. 2021): bubble over the
    ideal time, (p - 1) / (v m), at v times the point-to-point messages; m a multiple of p."""
    _check(p, m)
    if v < 1:
        raise ValueError(f"need v >= 1 chunks per rank, got {v}")
    return (p - 1) / (v * m)


def one_f_one_b_bubble(p: int, t_f: float, t_b: float) -> float:
    """Idle time per rank of GPipe or 1F1B with equal stages: (p - 1)(T_F + T_B), T_B the full backward."""
    return (p - 1) * (t_f + t_b)


def zb_h1_bubble(p: int, t_f: float, t_b: float, t_w: float) -> float:
    """ZB-H1 (Qi et al. 2023): (p - 1)(T_F + T_B - T_W), with T_B the input-gradient pass only
    and T_W the weight-gradient pass (so the full backward is T_B + T_W). Same peak activation
    memory as 1F1B. Holds when T_W <= T_F (a W fits where 1F1B's rank waits for a forward)."""
    return (p - 1) * (t_f + t_b - t_w)


def idle_per_rank(order: Order, costs: Costs) -> float:
    """How long each rank idles in a step of ``order`` simulated with ``costs``, without
    communication: the step, first action to last, less the busiest rank's computation. This is
    what the papers' closed forms above give, for any order (introduced in chapter 5, "The
    schedules")."""
    events = simulate(order, costs)
    step = max(e.end for e in events) - min(e.start for e in events)
    return step - max(sum(e.duration for e in events if e.rank == r) for r in order)


def zb_h2_bubble(p: int, t_f: float, t_b: float, t_w: float) -> float:
    """ZB-H2 (Qi et al. 2023): (p - 1)(T_F + T_B - 2 T_W), T_B input-gradient only; it warms up
    with more forwards and needs about 2p - 1 microbatches' activations instead of p."""
    return (p - 1) * (t_f + t_b - 2 * t_w)


def dualpipe_table(pp: int, f: float, b: float, w: float, f_and_b: float | None = None) -> dict[str, dict]:
    """DeepSeek-V3's comparison (DeepSeek-AI 2024, Table 2), in its notation: ``pp`` ranks, F
    forward, **B the full backward**, W the weight-gradient part of it, F&B an overlapped
    forward and backward (``f + b`` when nothing overlaps, as on a CPU). Bubble is idle time per
    rank; parameters and activations are per rank, in units of one stage's parameters and one
    microbatch's activations of one stage."""
    fb = f + b if f_and_b is None else f_and_b
    return {
        "1F1B": {"bubble": (pp - 1) * (f + b), "parameters": 1, "activations": pp},
        "ZB1P": {"bubble": (pp - 1) * (f + b - 2 * w), "parameters": 1, "activations": pp},
        "DualPipe": {"bubble": (pp / 2 - 1) * (fb + b - 3 * w), "parameters": 2, "activations": pp + 1},
    }
