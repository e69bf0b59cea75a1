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
