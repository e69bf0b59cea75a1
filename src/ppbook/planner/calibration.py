"""How far to trust a predicted time: a correction and a band from the published runs.

Introduced in "Choosing a pipeline". The planner's times come from FLOPs at the efficiency the
book measured on one H100 (:mod:`ppbook.planner.costs`); against the published runs of
``data/published/runs.json`` they come out fast. Each run whose throughput is comparable
(:func:`points`) gives a ratio, predicted / published throughput of its published layout,
computed when the planner first prints a time (never typed: a change to the cost model moves
every factor).

A *family* is the runs of one framework on one GPU generation (torchtitan on H100s, Megatron-LM
on A100s), where the record holds at least :data:`MIN_RUNS` of them from at least
:data:`MIN_SOURCES` campaigns (a campaign: one team's runs of one date, one table or one
benchmark page: ``campaign`` in ``runs.json``); a question falls in the family of the framework
it will run (``Request.framework``) and its GPU's generation, else in every framework's runs on
that generation, else in every run (:func:`family_for`). The correction divides a predicted
throughput by the geometric mean of the family's ratios (:attr:`Band.factor`).

The band is what that correction achieves on runs it has not seen: each run is predicted again
with the factor of the family's other *campaigns* alone (leave one campaign out: runs of one
table share their biases, and leaving one of them out at a time would let its siblings vouch for
it), and the band runs from the largest over-prediction to the largest under-prediction that
remain (:func:`leave_one_out`). With ``g`` campaigns, a run from a further campaign falls
outside the band of the other ``g`` about ``2 / (g + 1)`` of the time, if campaigns are
exchangeable; with three, that is half the time, and the band says so. Where none of the family's
runs was on the question's own GPU (torchtitan's H100 runs were on 500 W parts; a reader's H100
SXM runs at 700 W), the band also takes in the record's runs on that GPU, corrected by the
family's factor: what makes that GPU run differently is not known, and those runs bound it.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

# what a reader can say they will run (--framework); the planner's defaults are torchtitan's runtime
# (torch's PipelineStage, torchtitan's FSDP policy), so it is the default
FRAMEWORKS = ("torchtitan", "megatron")
DEFAULT_FRAMEWORK = "torchtitan"
FRAMEWORK_NAMES = {"torchtitan": "torchtitan", "megatron": "Megatron-LM", "other": "other stacks", None: "every framework"}
# GPU generations: the record's GPUs, and the presets of the same chips (a GPU not listed has none)
GPU_CLASS = {"a100-40gb": "A100", "a100-80gb": "A100", "h100-sxm": "H100", "h100-96gb-500w": "H100"}
MIN_RUNS = 4       # a family needs this many runs ...
MIN_SOURCES = 3    # ... from this many campaigns, so that each run's factor comes from two campaigns or more
STRONG = 0.25      # a family whose uncorrected runs are all more than 25% fast (or slow) gets a caution line
THIN_MARGIN = 0.05  # a layout whose fullest GPU leaves less than this share of the usable memory free is flagged


@dataclass(frozen=True)
class Point:
    """One published run's throughput: predicted for its published layout, and published."""
    run: str
    gpu: str
    gpu_class: str | None   # GPU_CLASS's, or None
    framework: str          # runs.json's frameworks[...]["calibrates_as"]: torchtitan, megatron or other
    campaign: str           # runs of one campaign are left out together
    preset: bool            # whether its GPU is a preset (its peak published)
    predicted: float        # tokens/s/GPU
    published: float

    @property
    def ratio(self) -> float:
        return self.predicted / self.published


@dataclass(frozen=True)
class Band:
    """The correction and band a question's times carry."""
    family: str            # e.g. "torchtitan on H100s"
    factor: float          # predicted / published throughput, geometric mean over the family's runs
    low: float             # the lowest error left (corrected / published - 1): most under-predicted
    high: float            # the highest: most over-predicted
    runs: int
    sources: int           # campaigns
    ratio_low: float       # the family's uncorrected ratios, predicted / published: its measured bias
    ratio_high: float
    widened_by: tuple[str, ...] = ()   # runs on the question's own GPU outside the family, taken into the band
    widened_ratios: tuple[float, ...] = ()

    def throughput(self, tokens_per_s: float) -> tuple[float, float, float]:
        """A predicted throughput corrected, and the band the published runs support (low, high)."""
        centre = tokens_per_s / self.factor
        return centre, centre / (1 + self.high), centre / (1 + self.low)

    def step(self, step_s: float) -> tuple[float, float, float]:
        """A predicted step time corrected, and its band (short, long)."""
        centre = step_s * self.factor
        return centre, centre * (1 + self.low), centre * (1 + self.high)

    @property
    def outside(self) -> float:
        """How often a run from a further campaign falls outside the band, were campaigns exchangeable."""
        return 2 / (self.sources + 1)

    def describe(self) -> str:
        """One line: the family, its measured bias, the factor and the band, and how far the band goes."""
        widened = (f", and the record's {len(self.widened_by)} runs on this GPU itself by other stacks"
                   if self.widened_by else "")
        return (f"calibrated as {self.family}: {self.runs} published runs from {self.sources} campaigns, which "
                f"{_times(self.ratio_low, self.ratio_high)}; predicted throughput divided by "
                f"{self.factor:.2f}; band {100 * self.low:+.0f}% to {100 * self.high:+.0f}% of the time (the extremes "
                f"left when each campaign is predicted with the others' factor{widened}); a run from a further "
                f"campaign falls outside about {100 * self.outside:.0f}% of the time")


def _times(low: float, high: float) -> str:
    """How runs whose ratios (predicted / published throughput) span ``low`` to ``high`` compare
    with the prediction: 'took 1.44 to 1.64 times as long as predicted', 'ran 7% to 12% slower
    than predicted', 'ran from 4% faster to 34% slower than predicted'."""
    slower, faster = (lambda r: round(100 * (r - 1))), (lambda r: round(100 * (1 - r)))
    if low >= 1 + STRONG:
        return f"took {low:.2f} to {high:.2f} times as long as predicted"
    if low >= 1:
        return f"ran {slower(low)}% to {slower(high)}% slower than predicted"
    if high < 1:
        return f"ran {faster(high)}% to {faster(low)}% faster than predicted"
    return f"ran from {faster(low)}% faster to {slower(high)}% slower than predicted"


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
        gpu = published.gpu_of(row, data).name
        out.append(Point(row["id"], gpu, GPU_CLASS.get(gpu), data["frameworks"][row["framework"]]["calibrates_as"],
                         row["campaign"], "preset" in row["gpu"], best.tokens_per_s_per_gpu, published.published_tokens_per_s(row)))
    return out


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def members(family: tuple[str | None, str | None], pts: list[Point]) -> list[Point]:
    """The runs of a family ``(framework, gpu_class)``; ``None`` in either place: any."""
    fw, cls = family
    return [p for p in pts if (fw is None or p.framework == fw) and (cls is None or p.gpu_class == cls)]


def enough(group: list[Point]) -> bool:
    return len(group) >= MIN_RUNS and len({p.campaign for p in group}) >= MIN_SOURCES


def family_for(gpu_name: str, framework: str, pts: list[Point]) -> tuple[str | None, str | None]:
    """The family a question's times are calibrated with: the framework's runs on the GPU's
    generation where they are :func:`enough`, else every framework's runs on it, else every run."""
    cls = GPU_CLASS.get(gpu_name)
    for fam in ((framework, cls), (None, cls)):
        if cls is not None and enough(members(fam, pts)):
            return fam
    return (None, None)


def family_name(family: tuple[str | None, str | None]) -> str:
    fw, cls = family
    if fw is None and cls is None:
        return "every published run"
    return f"{FRAMEWORK_NAMES[fw]} on {cls}s" if cls else FRAMEWORK_NAMES[fw]


def leave_one_out(family: tuple[str | None, str | None], pts: list[Point]) -> list[tuple[Point, float, float]]:
    """Each run of the family with the factor of the family's runs from other campaigns, and the
    error left after correcting by it (corrected / published - 1)."""
    group = members(family, pts)
    out = []
    for p in group:
        factor = _geomean([q.ratio for q in group if q.campaign != p.campaign])
        out.append((p, factor, p.ratio / factor - 1))
    return out


def band_of(family: tuple[str | None, str | None], pts: list[Point], gpu_name: str | None = None) -> Band:
    """The family's band; with ``gpu_name``, widened by the record's runs on that GPU where none of
    the family's was (module docstring)."""
    group = members(family, pts)
    factor = _geomean([p.ratio for p in group])
    errors = [e for _, _, e in leave_one_out(family, pts)]
    extra = []
    if gpu_name is not None and not any(p.gpu == gpu_name for p in group):
        extra = [p for p in pts if p.gpu == gpu_name]
        errors += [p.ratio / factor - 1 for p in extra]
    ratios = [p.ratio for p in group]
    return Band(family_name(family), factor, min(errors), max(errors), len(group), len({p.campaign for p in group}),
                min(ratios), max(ratios), tuple(p.run for p in extra), tuple(p.ratio for p in extra))


@functools.lru_cache(maxsize=1)
def _points() -> tuple[Point, ...]:
    return tuple(points())


def band_for(gpu_name: str, framework: str = DEFAULT_FRAMEWORK, pts: list[Point] | None = None) -> Band:
    """The band a question's times carry, for its GPU and the framework it will run."""
    pts = list(_points()) if pts is None else pts
    return band_of(family_for(gpu_name, framework, pts), pts, gpu_name)


def cautions(gpu_name: str, framework: str = DEFAULT_FRAMEWORK, pts: list[Point] | None = None) -> list[str]:
    """One line for each family like the question (its GPU's generation, any framework) whose
    published runs the uncorrected planner misses by more than :data:`STRONG` every time: how far,
    what is known of why, and what the printed times do about it."""
    pts = list(_points()) if pts is None else pts
    cls = GPU_CLASS.get(gpu_name)
    used = family_for(gpu_name, framework, pts)
    band = band_for(gpu_name, framework, pts)
    lines = []
    for fw in FRAMEWORKS:
        fam = (fw, cls)
        group = members(fam, pts)
        if cls is None or not enough(group):
            continue
        ratios = [p.ratio for p in group]
        fast, slow = min(ratios) > 1 + STRONG, max(ratios) < 1 / (1 + STRONG)
        if not (fast or slow):
            continue
        how = "over-predicts" if fast else "under-predicts"
        gpus = sorted({p.gpu for p in group})
        own = f" (on {', '.join(gpus)})" if gpus != [gpu_name] else ""
        if fam == used:
            done = f"the times printed are corrected by {band.factor:.2f}"
        else:
            done = (f"the times printed are calibrated as {family_name(used)} (÷ {band.factor:.2f}); if you run "
                    f"{FRAMEWORK_NAMES[fw]}, plan with --framework {fw}")
        lines.append(f"caution: uncorrected, the planner {how} {family_name(fam)}{own}: they "
                     f"{_times(min(ratios), max(ratios))}; {done}. {why(fam, pts)}")
    return lines


def why(family: tuple[str, str], pts: list[Point]) -> str:
    """What the record says of why a family is off: how the same framework fares on other GPUs and
    other stacks on the same GPUs (were both close, neither alone explains it), and whether the
    family's GPUs are presets (their peak published). No cause is stated: none was measured."""
    fw, cls = family
    group = members(family, pts)
    parts = []
    same_fw = [p for p in pts if p.framework == fw and p.gpu_class != cls]
    same_gpu = [p for p in pts if p.framework != fw and p.gpu_class == cls]
    for text, others in ((f"{FRAMEWORK_NAMES[fw]} on {', '.join(sorted({str(p.gpu_class) + 's' for p in same_fw}))}",
                          same_fw), (f"other stacks on {cls}s", same_gpu)):
        if others:
            ratios = [p.ratio for p in others]
            parts.append(f"{text} {_times(min(ratios), max(ratios))}")
    unpublished = sorted({p.gpu for p in group if not p.preset})
    gpu = f"; the peak of {', '.join(unpublished)} is not published (the SXM H100's stands in)" if unpublished else ""
    return (f"Why is not known: {', and '.join(parts) or 'no other run compares'}{gpu}; the record cannot tell "
            "power, memory and kernels apart.")


def thin(peak_bytes: float, usable_bytes: float) -> bool:
    """Whether a layout's fullest GPU leaves less than THIN_MARGIN of the usable memory free."""
    return peak_bytes > usable_bytes * (1 - THIN_MARGIN)
