"""The planner against the record: published large-model runs, asked again.

Introduced in "Choosing a pipeline". ``data/published/runs.json`` holds runs whose authors
published their layout and their throughput (and, for torchtitan, their peak memory), each
with its source and the line it quotes; under ``moe_runs``, mixtures of experts with their
expert parallelism (chapters "Mixture of experts" and "Choosing a pipeline"), and under
``fp8_runs`` dense runs in FP8, each with its ``precision`` and the options its framework ran
(``options``: dispatcher, optimizer, memory recipe); rows that share a ``sweep`` measured several
layouts of one model on one cluster (:func:`sweeps`, :func:`sweep_correlation`). For each run
:func:`compare` poses the planner the
same question (model, GPUs, links, global batch, sequence length), restricted to what the run's
framework could do at the time (its schedules, sharding modes and kernels) and to the choices
its authors state they fixed (recomputation, microbatch size, and for a benchmark of schedules the
tensor and pipeline sizes), and reports:

- the published layout's predicted memory and throughput, against the published ones;
- the planner's own choice, and whether the published layout is that choice or within
  :data:`AGREE` of its predicted step time (a row measured as the alternative to another of its
  table, ``alternative_of``, is compared but is no choice of its authors);
- what the planner would choose with everything torch 2.13 offers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from ppbook.planner import hardware, search, shapes

RUNS_FILE = Path(__file__).resolve().parents[3] / "data" / "published" / "runs.json"
AGREE = 0.05       # a published layout within 5% of the planner's choice agrees with it
THROUGHPUT = 0.25  # predicted throughput within 25% of the published
MEMORY = 0.15      # predicted peak memory within 15% of the published
GiB = 2 ** 30


def load() -> dict:
    return json.loads(RUNS_FILE.read_text())


def gpu_of(row: dict, data: dict) -> hardware.GPU:
    spec = row["gpu"]
    if "preset" in spec:
        return hardware.GPUS[spec["preset"]]
    return hardware.GPU(spec["name"], spec["memory_gb"], spec["bf16_tflops"], spec["hbm_tb_s"], spec["nvlink"],
                        spec["source"])


def request(row: dict, data: dict, constrained: bool = True) -> search.Request:
    """The run's question: its model, GPUs and batch; with ``constrained``, only the options its
    framework had and the choices its authors fixed."""
    options = row.get("options", {})
    req = search.Request(shapes.PRESETS[row["model"]], gpu_of(row, data), row["gpus"], row["gpus_per_node"],
                         row["global_batch"], row["seq_len"], hardware.LINKS[row["intra"]], hardware.LINKS[row["inter"]],
                         max_p=max(32, row["layout"]["pp"]), precision=row.get("precision", "bf16"),
                         dispatcher=options.get("dispatcher", "alltoall"), optimizer=options.get("optimizer", "adamw"),
                         recipe=options.get("recipe", "bf16"),
                         cps=(row["layout"]["cp"],) if row["layout"].get("cp", 1) > 1 else ())
    if not constrained:
        return req
    fw = data["frameworks"][row["framework"]]
    c = row.get("constraints", {})
    return replace(req, schedules=tuple(fw["schedules"]), shardings=tuple(fw["shardings"]), kernels=fw["kernels"],
                   sequence_parallel=fw["sequence_parallel"], stage_io=fw["stage_io"],
                   fsdp_reshard=fw.get("fsdp_reshard", "default"), overlap_f_b=fw.get("overlap_f_b", False),
                   balances=(c["balance"],) if "balance" in c else tuple(fw["balances"]),
                   recomputes=(c["recompute"],) if "recompute" in c else tuple(fw.get("recomputes", search.memory.RECOMPUTE)),
                   microbatch_sizes=(c["microbatch"],) if "microbatch" in c else (),
                   tps=(c["tp"],) if "tp" in c else (), pps=(c["pp"],) if "pp" in c else ())


def published_layouts(row: dict, req: search.Request) -> list[search.Layout]:
    """The layouts the publication describes: its tp, pp, dp, schedule, stages per rank (where
    given) and sharding, with every value of what it leaves open (microbatch size, stages per
    rank) that the request allows."""
    lay = row["layout"]
    schedule = lay["schedule"] or search.NO_PIPELINE
    out = []
    wide = replace(req, tps=(lay["tp"],), eps=(lay.get("ep", 1),), shardings=(lay["sharding"],),
                   max_v=max(req.max_v, lay.get("v", 1)), etps=(lay.get("etp", 1),) if req.model.moe else ())
    for c in search.candidates(wide):
        if (c.p, c.dp, c.schedule, c.etp) == (lay["pp"], lay["dp"], schedule, lay.get("etp", 1)) \
                and c.v == lay.get("v", c.v) and not search.constraint_problem(c, req):
            out.append(c)
    return out


def published_tokens_per_s(row: dict) -> float | None:
    """The published throughput in tokens per second per GPU, converting TFLOPs/GPU with the
    convention of the source: Megatron-LM's formula, which counts the recomputation
    (``96 s l h^2 (1 + s / 6h + V / 16 l h)`` per sequence, Narayanan et al. 2021, eq. 3), or
    model FLOPs (:func:`ppbook.planner.search.model_flops_per_token`)."""
    t = row["throughput"]
    if t is None:
        return None
    if t["unit"] == "tokens/s/GPU":
        return t["value"]
    if t["unit"] == "s/step":  # the step time of the run's global batch
        return row["global_batch"] * row["seq_len"] / (t["value"] * row["gpus"])
    if t["unit"] == "GPU hours per trillion tokens":
        return 1e12 / (t["value"] * 3600)
    shape, s = shapes.PRESETS[row["model"]], row["seq_len"]
    if t.get("convention") == "megatron":
        lyr, h, v = shape.layers, shape.hidden, shape.vocab
        per_token = 96 * lyr * h * h * (1 + s / (6 * h) + v / (16 * lyr * h))
    else:
        per_token = search.model_flops_per_token(shape, s)
    return t["value"] * 1e12 / per_token


@dataclass
class Comparison:
    row: dict
    published: search.Prediction       # the best of the published layouts, as predicted
    choice: search.Prediction | None   # the planner's choice under the run's constraints
    unconstrained: search.Prediction | None  # ... with everything torch 2.13 offers
    published_tps: float | None      # None: not published, or not comparable
    weighed: int = 0                 # layouts the run's constraints leave the planner to choose among
    sizes_weighed: int = 0           # ... of as many (tp, pp, dp) sizes
    completions: int = 1             # layouts that match what was published (it left b or v open: more than one)
    slowest_fit_step_s: float | None = None  # the slowest of them that fits, as predicted

    @property
    def left_open(self) -> bool:
        """Whether the source leaves the microbatch size or the stages per rank open, so that
        ``published`` is the fastest of several completions (:func:`compare`)."""
        return self.completions > 1

    @property
    def agrees_at_every_completion(self) -> bool:
        """Whether even the slowest completion that fits agrees: agreement that does not depend
        on how the open values are completed."""
        if not self.agrees:
            return False
        return self.slowest_fit_step_s <= self.choice.step_s * (1 + AGREE)

    @property
    def is_choice(self) -> bool:
        """Whether the row is its authors' choice of layout (not the alternative a table measured
        beside it, ``alternative_of``): only choices count towards agreement."""
        return "alternative_of" not in self.row

    @property
    def agrees(self) -> bool:
        """The published layout is the planner's choice, or predicted within AGREE of it."""
        if self.choice is None or self.published.why_not:
            return False
        return self.published.step_s <= self.choice.step_s * (1 + AGREE)

    @property
    def throughput_error(self) -> float | None:
        if self.published_tps is None:
            return None
        return self.published.tokens_per_s_per_gpu / self.published_tps - 1

    @property
    def memory_error(self) -> float | None:
        pm = self.row.get("peak_memory")
        return None if not pm else self.published.peak_bytes / GiB / pm["value"] - 1

    @property
    def throughput_comparable(self) -> bool:
        """Published throughput is comparable unless there is none or the run's recipe is one the
        planner does not time (``throughput.comparable`` false, with its reason). A GPU whose peak
        was not published (torchtitan's 500 W H100s) is compared all the same, at the peak that
        stands in for it: where it misses, the chapter says so."""
        return self.incomparable_because is None

    @property
    def incomparable_because(self) -> str | None:
        """Why the published throughput cannot be compared with the prediction; ``None`` if it can."""
        t = self.row["throughput"]
        if self.published_tps is None:
            return "no throughput published"
        if not t.get("comparable", True):
            return t["why"]
        return None

    @property
    def throughput_reading(self) -> str:
        """``within`` :data:`THROUGHPUT` of the published, ``over`` or ``under`` it, or ``not timed``."""
        if not self.throughput_comparable:
            return "not timed"
        if abs(self.throughput_error) <= THROUGHPUT:
            return "within"
        return "over" if self.throughput_error > 0 else "under"

    @property
    def memory_reading(self) -> str | None:
        """``within`` :data:`MEMORY` of the published peak, ``above`` or ``below`` it; ``None``
        where no peak was published."""
        if self.memory_error is None:
            return None
        if abs(self.memory_error) <= MEMORY:
            return "within"
        return "above" if self.memory_error > 0 else "below"


def published_predictions(row: dict, data: dict, req: search.Request | None = None) -> list[search.Prediction]:
    """Every completion of the published layout, predicted (and timed even where it does not
    fit; ``why_not`` says why it does not)."""
    req = req or request(row, data)
    preds = []
    for layout in published_layouts(row, req):
        reason = search.predict(layout, req).why_not
        pred = search.predict(layout, req, check_memory=False)  # timed even if it does not fit
        pred.why_not = reason
        preds.append(pred)
    if not preds:
        raise ValueError(f"{row['id']}: no layout matches the published one; check runs.json")
    return preds


def best_completion(preds: list[search.Prediction]) -> search.Prediction:
    """Where the source leaves the microbatch size or the stages per rank open, its authors are
    granted the completion predicted fastest among those that fit (they tuned it; the chapter
    reports what the slowest would give)."""
    return min(preds, key=lambda o: (o.why_not is not None, o.step_s))


def published_prediction(row: dict, data: dict | None = None) -> search.Prediction:
    """The published layout as predicted (:func:`best_completion`), without searching."""
    data = data or load()
    return best_completion(published_predictions(row, data))


def compare(row: dict, data: dict | None = None, unconstrained: bool = False) -> Comparison:
    """The run asked again (see the module docstring); with ``unconstrained``, also what the
    planner would choose with every option (slower: a much larger search)."""
    data = data or load()
    req = request(row, data)
    preds = published_predictions(row, data, req)
    best = best_completion(preds)
    fit = [o.step_s for o in preds if o.why_not is None]
    ranked, _ = search.plan(req)
    free = search.plan(request(row, data, constrained=False))[0] if unconstrained else []
    weighed = [c for c in search.candidates(req) if search.constraint_problem(c, req) is None]
    return Comparison(row, best, ranked[0] if ranked else None, free[0] if free else None,
                      published_tokens_per_s(row), len(weighed), len({(c.tp, c.p, c.dp) for c in weighed}),
                      len(preds), max(fit) if fit else None)


# --- mixtures of experts and FP8 (issue 52): the published layout's rank, sweeps ---------------------------------------

def published_rank(c: Comparison, data: dict | None = None) -> int | None:
    """Where the published layout (as predicted, :func:`best_completion`) falls in the planner's own
    order of the layouts the run's constraints allow: 1 + how many of them it predicts faster
    (``None`` where the published layout does not fit). The search lists every layout within a
    slack of its winner; the slack here reaches the published layout's time, so every faster
    layout is listed (:func:`ppbook.planner.search.plan`)."""
    if c.published.why_not or c.choice is None:
        return None
    req = request(c.row, data or load())
    slack = max(search.SLACK, c.published.step_s / c.choice.step_s - 1 + 1e-9)
    ranked, _ = search.plan(req, slack=slack)
    return 1 + sum(1 for o in ranked if o.step_s < c.published.step_s * (1 - 1e-12))


def ranks(values: list[float]) -> list[float]:
    """Ranks of ``values`` (1 for the smallest), ties given their mean rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman's rank correlation of two lists of the same length (at least two): Pearson's
    correlation of their ranks (:func:`ranks`), 1 when both order the items alike, -1 when reversed."""
    if len(xs) != len(ys) or len(xs) < 2:
        raise ValueError("spearman needs two lists of the same length, at least two items")
    rx, ry = ranks(xs), ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx, syy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    return sxy / (sxx * syy) ** 0.5


def sweeps(data: dict | None = None) -> dict[str, list[dict]]:
    """The runs that measured several layouts of one model on one cluster, by sweep: each sweep's
    rows in ``moe_runs`` and ``fp8_runs`` share a ``sweep`` name."""
    data = data or load()
    out: dict[str, list[dict]] = {}
    for row in data.get("moe_runs", []) + data.get("fp8_runs", []):
        if "sweep" in row:
            out.setdefault(row["sweep"], []).append(row)
    return out


def sweep_correlation(comparisons: list[Comparison]) -> float:
    """Spearman's correlation of the planner's predicted throughput with the published one over the
    timed layouts of one sweep (a row the planner cannot cut, ``not_cut``, is left out)."""
    timed = [c for c in comparisons if c.published_tps is not None and "not_cut" not in c.row]
    return spearman([c.published.tokens_per_s_per_gpu for c in timed], [c.published_tps for c in timed])
