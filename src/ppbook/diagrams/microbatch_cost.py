"""What a microbatch costs on a GPU, drawn from a recorded run: why the number of microbatches m
has an optimum, and where it lies.

Introduced in chapter 11 ("On real GPUs"), which gives the full treatment; chapter 3 calls
:func:`draw` (or :func:`fit`, the numbers alone) for its short version.

More microbatches shrink the bubble, (p - 1) / (m + p - 1) of the step. But every microbatch is
a pass of its own: its matrix products are smaller, and a GPU computes a small product further
from its peak (the left panel: one Llama-3 8B block's forward rate against tokens per microbatch,
from the record's ``costs.json``); and the host must issue the pass's kernels one by one, which
takes about the same time whatever the microbatch's size. Once a microbatch's GPU work is shorter
than the host's time to issue it, the GPU waits for the host, and cutting the batch further only
adds passes. With W the GPU time of the whole batch's forward and backward on one device (the
record's whole-batch loop) and h the host's time per microbatch (the record's one-stage pipeline
at m microbatches, m times h when the host bounds it), a stage of p equal ones spends
``max(W / m, h) / p`` per microbatch, and a step of GPipe or 1F1B takes

    step(m, p) = (m + p - 1) / p * max(W / m, h),

falling with m while W / m > h (the bubble shrinks) and rising after (every added microbatch costs
h): at p > 1 the shortest step is at m* = W / h whatever p, where a microbatch's GPU work just
covers the host's; at one stage, with no bubble to shrink, every m up to m* takes the whole
batch's time W (the right panel, with the record's measured one-stage steps).

    >>> from ppbook.diagrams import microbatch_cost
    >>> numbers = microbatch_cost.draw()     # two panels; returns what they show
    >>> numbers["m_star"]                     # W / h
"""

from __future__ import annotations

import json
import statistics

from ppbook.launch import repo_root

RECORD = "h200-2026-11-28"  # the first GPU record (one H200, torch 2.11, bfloat16)


def _read(record: str, name: str):
    return json.loads((repo_root() / "data" / "gpu" / record / name).read_text())


def forward_flops(row: dict) -> float:
    """FLOPs of one block's forward on a costs row's microbatch, counted as MFU counts them: 2 per
    parameter per token for the matrix products, plus 4 T d per token for attention's two products
    over the T tokens of its sequence (the causal half not subtracted)."""
    tokens = row["microbatch"] * row["seq_len"]
    return 2 * row["params"] * tokens + 4 * tokens * row["seq_len"] * row["dim"]


def forward_tflops(record: str = RECORD, model: str = "llama3-8b") -> dict[tuple[int, int], float]:
    """{(sequence length, sequences per microbatch): the block's forward rate in TFLOP/s}."""
    rows = [r for r in _read(record, "costs.json")["rows"]
            if r["part"] == "block" and r["model"] == model and "F_ms" in r]
    return {(r["seq_len"], r["microbatch"]): forward_flops(r) / (r["F_ms"] / 1e3) / 1e12
            for r in sorted(rows, key=lambda r: (r["seq_len"], r["microbatch"]))}


def _flag(argv: list[str], name: str, default: str) -> str:
    return argv[argv.index(name) + 1] if name in argv else default


def one_stage_steps(record: str = RECORD) -> dict:
    """The record's measured steps at one stage of its benchmark model: {"whole": seconds (the
    plain whole-batch loop), "pipeline": {m: seconds} (06_train.py's median step after the first,
    from the benchmark and from the memory runs of the same shape and schedule)}."""
    whole_file = _read(record, "bench.json")
    bench = whole_file.get("benchmark", whole_file)  # the H200 record's layout, or make gpu-check's
    loops = bench.get("loops") or {"pipeline": bench["pipeline"], "whole": bench["plain"]}
    args = bench["args"]
    pipeline = {int(_flag(args, "--microbatches", "1")): [loops["pipeline"]["median_step_seconds"]]}
    mem = _read(record, "mem.json")
    for row in (mem.get("rows", []) if isinstance(mem, dict) else mem):
        same = all(_flag(row["argv"], f, "") == _flag(args, f, "") for f in ("--layers", "--dim", "--seq-len",
                                                                            "--batch-size"))
        if same and _flag(row["argv"], "--schedule", "gpipe") == "gpipe" and len(row.get("step_seconds", [])) > 1:
            pipeline.setdefault(int(_flag(row["argv"], "--microbatches", "1")), []).append(
                statistics.median(row["step_seconds"][1:]))
    return {"whole": loops["whole"]["median_step_seconds"], "pipeline": dict(sorted(pipeline.items())),
            "sequences": int(_flag(args, "--batch-size", "1")), "seq_len": int(_flag(args, "--seq-len", "1")),
            "gpu": whole_file["meta"].get("gpu")}


def step_seconds(m: float, p: int, whole: float, host: float) -> float:
    """(m + p - 1) / p * max(W / m, h): GPipe or 1F1B over p equal stages, free hand-offs."""
    return (m + p - 1) / p * max(whole / m, host)


def fit(record: str = RECORD) -> dict:
    """W, h and m* = W / h from the record (h from its largest one-stage m, where the host bounds
    the pass), with the measured steps and what the model says of each."""
    measured = one_stage_steps(record)
    m_max = max(measured["pipeline"])
    whole = measured["whole"]
    host = statistics.median(measured["pipeline"][m_max]) / m_max
    predicted = {m: step_seconds(m, 1, whole, host) for m in measured["pipeline"]}
    return {**measured, "whole": whole, "host": host, "m_star": whole / host, "m_fitted": m_max,
            "predicted": predicted}


def draw(axes=None, record: str = RECORD, ps: tuple[int, ...] = (1, 4, 8)) -> dict:
    """Left: one 8B block's forward rate against tokens per microbatch, a line per sequence
    length. Right: the record's one-stage steps against m (dots) and the model's step at each p in
    ``ps``, its shortest marked. Returns :func:`fit`'s numbers with ``tflops`` and ``steps``
    {p: {m: seconds}}."""
    import matplotlib.pyplot as plt

    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    left, right = axes
    tflops = forward_tflops(record)
    for length in sorted({s for s, _ in tflops}):
        pts = sorted((b * length, v) for (s, b), v in tflops.items() if s == length)
        left.plot(*zip(*pts), marker="o", label=f"sequences of {length:,}")
    left.set_xscale("log", base=2)
    left.set_xlabel("tokens per microbatch")
    left.set_ylabel("forward TFLOP/s")
    left.set_title("one Llama-3 8B block")
    left.legend(fontsize=8)
    f = fit(record)
    ms = list(range(1, f["sequences"] + 1))  # whole sequences per microbatch
    steps = {p: {m: step_seconds(m, p, f["whole"], f["host"]) for m in ms} for p in ps}
    for p in ps:
        line, = right.plot(ms, [steps[p][m] for m in ms], label=f"model, p = {p}")
        best = min(steps[p], key=steps[p].get)
        right.plot([best], [steps[p][best]], marker="*", markersize=13, color=line.get_color())
    right.plot([1], [f["whole"]], "ks", label="measured: whole-batch loop")
    for m, secs in f["pipeline"].items():
        right.plot([m] * len(secs), secs, "kx", markersize=8)
    right.plot([], [], "kx", label="measured: pipeline, one stage")
    right.axvline(f["m_star"], color="grey", linestyle=":", linewidth=1)
    right.set_xscale("log", base=2)
    right.set_xlabel(f"microbatches m (a batch of {f['sequences']} sequences)")
    right.set_ylabel("step (s)")
    right.set_title("step against m (star: shortest; dotted: m* = W / h)")
    right.legend(fontsize=7)
    return {**f, "tflops": tflops, "steps": steps}
