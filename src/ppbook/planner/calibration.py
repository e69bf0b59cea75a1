"""How far to trust a predicted time: a correction and a band from the published runs.

Introduced in "Choosing a pipeline". The planner's times come from FLOPs at the efficiency the
book measured on one H100 (:mod:`ppbook.planner.costs`); against the published runs of
``data/published/runs.json`` they come out high. Each run whose throughput is comparable
(:func:`points`) gives a ratio, predicted / published throughput of its published layout. A
GPU family with at least :data:`MIN_FAMILY` such runs is calibrated on its own runs; any other
GPU on the runs whose GPU's peak is published (``pooled``). The correction divides a predicted
throughput by the geometric mean of the ratios (:attr:`Band.factor`).

The band is what that correction achieves on runs it has not seen: each run is predicted again
with the factor of the others alone (leave-one-out), and the band runs from the largest
over-prediction to the largest under-prediction that remain (:func:`leave_one_out`). With ``n``
runs, a further run falls outside the band of the other ``n`` about ``2 / (n + 1)`` of the time.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

# GPUs whose runs form a family of their own where they are enough (MIN_FAMILY); every other GPU is
# calibrated on the pooled runs of GPUs whose peak is published
FAMILY = {"a100-40gb": "A100", "a100-80gb": "A100", "h100-96gb-500w": "H100 at 500 W"}
POOLED = "pooled"
MIN_FAMILY = 4
THIN_MARGIN = 0.05  # a layout whose fullest GPU leaves less than this share of the usable memory free is flagged


@dataclass(frozen=True)
class Point:
    """One published run's throughput: predicted for its published layout, and published."""
    run: str
    gpu: str
    family: str | None     # FAMILY's, or None
    peak_published: bool   # whether its GPU's peak is published (a preset)
    predicted: float       # tokens/s/GPU
    published: float

    @property
    def ratio(self) -> float:
        return self.predicted / self.published


@dataclass(frozen=True)
class Band:
    """The correction and band for one family (or the pooled runs)."""
    family: str
    factor: float          # predicted / published throughput, geometric mean over the runs
    low: float             # the lowest leave-one-out error (corrected / published - 1): most under-predicted
    high: float            # the highest: most over-predicted
    runs: int

    def throughput(self, tokens_per_s: float) -> tuple[float, float, float]:
        """A predicted throughput corrected, and the band the published runs support (low, high)."""
        centre = tokens_per_s / self.factor
        return centre, centre / (1 + self.high), centre / (1 + self.low)

    def step(self, step_s: float) -> tuple[float, float, float]:
        """A predicted step time corrected, and its band (short, long)."""
        centre = step_s * self.factor
        return centre, centre * (1 + self.low), centre * (1 + self.high)

    def describe(self) -> str:
        return (f"calibrated on {self.runs} published runs ({self.family}): predicted throughput divided by "
                f"{self.factor:.2f}; band {100 * self.low:+.0f}% to {100 * self.high:+.0f}% of the time, "
                f"the leave-one-out extremes")


def points(data: dict | None = None) -> list[Point]:
    """The published runs whose throughput is comparable, each with the throughput predicted for
    its published layout (where the source leaves the microbatch size or the stages per rank
    open, the completion predicted fastest among those that fit, as :func:`published.compare`)."""
    from ppbook.planner import published

    data = data or published.load()
    out = []
    for row in data["runs"]:
        t = row["throughput"]
        if t is None or not t.get("comparable", True):
            continue
        best = published.published_prediction(row, data)
        out.append(Point(row["id"], published.gpu_of(row, data).name, FAMILY.get(published.gpu_of(row, data).name),
                         "preset" in row["gpu"], best.tokens_per_s_per_gpu, published.published_tokens_per_s(row)))
    return out


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def family_of(gpu_name: str, pts: list[Point]) -> str:
    """The family a GPU is calibrated with: its own where it has MIN_FAMILY runs, else pooled."""
    fam = FAMILY.get(gpu_name)
    if fam is not None and sum(p.family == fam for p in pts) >= MIN_FAMILY:
        return fam
    return POOLED


def members(family: str, pts: list[Point]) -> list[Point]:
    if family == POOLED:
        return [p for p in pts if p.peak_published]
    return [p for p in pts if p.family == family]


def leave_one_out(family: str, pts: list[Point]) -> list[tuple[Point, float, float]]:
    """Each run of the family with the factor of the family's other runs and the error left
    after correcting by it (corrected / published - 1)."""
    group = members(family, pts)
    out = []
    for p in group:
        factor = _geomean([q.ratio for q in group if q is not p])
        out.append((p, factor, p.ratio / factor - 1))
    return out


def band_of(family: str, pts: list[Point]) -> Band:
    group = members(family, pts)
    errors = [e for _, _, e in leave_one_out(family, pts)]
    return Band(family, _geomean([p.ratio for p in group]), min(errors), max(errors), len(group))


@functools.lru_cache(maxsize=1)
def _bands() -> dict[str, Band]:
    pts = points()
    fams = {POOLED} | {family_of(g, pts) for g in FAMILY}
    return {f: band_of(f, pts) for f in sorted(fams)}


def bands() -> dict[str, Band]:
    """Every family's band, from data/published/runs.json (computed once)."""
    return dict(_bands())


def band_for(gpu_name: str) -> Band:
    """The band a GPU's predicted times carry."""
    fam = FAMILY.get(gpu_name)
    b = _bands()
    return b[fam] if fam in b else b[POOLED]


def thin(peak_bytes: float, usable_bytes: float) -> bool:
    """Whether a layout's fullest GPU leaves less than THIN_MARGIN of the usable memory free."""
    return peak_bytes > usable_bytes * (1 - THIN_MARGIN)
