"""Seconds per pipeline action: measured on a GPU where the book has measurements, estimated
from floating-point operations everywhere else, and labelled as one or the other.

Introduced in "Choosing a pipeline". The book measured Llama-3-shaped blocks and the output head
with its loss on two GPUs (chapter 11): on an H100 (``data/gpu/h100_llama3_costs.json``: the 8B,
70B and 405B blocks at 4096 and 8192 tokens a sequence, one or two sequences a microbatch) and
on an H200 (``data/gpu/h200-2026-11-28/costs.json``: the 8B and 70B blocks at 2048 to 16384
tokens a sequence, one, two or four sequences a microbatch): the forward ``F``, the
input-gradient pass ``I``, the weight-gradient pass ``W`` and the full backward ``B``. A request
for exactly such a block on that GPU uses those times (:data:`MEASURED`).

Any other model, sequence length, microbatch size or GPU gets an estimate: the pass's FLOPs over
the GPU's dense bf16 peak times an efficiency, the fraction of peak the measured passes reached.
The efficiency of a pass of ``F`` FLOPs on ``n`` tokens (one microbatch of one layer, or of the
head) at hidden size ``h`` is (:func:`efficiency`)

    (a + b log2(h / 4096) + c log2(n / 8192)) * F / (F + F0)

- the line: wider layers reach more of the peak in ``F`` and ``I`` (their products are larger)
  and less in ``W``; ``c`` is the small drift with the tokens of a microbatch that the
  measurements show (``W`` and the head lose a little as microbatches grow). ``n`` is held to the
  range of tokens measured, the line to :data:`EFFICIENCY_RANGE`;
- the factor ``F / (F + F0)``: a pass costs as if it had ``F0`` more FLOPs to do, a fixed cost
  per pass (launches, the tail of products too small to fill the GPU) that only small passes
  feel. It is what makes a microbatch of 2048 tokens of an 8B block reach 45% of the peak where
  four such sequences reach 57%, and what makes many small microbatches cost more than a few
  large ones with the same tokens.

:func:`calibrate` fits ``a, b, c`` and ``F0`` of each pass, by least squares of the relative
error of the predicted efficiency, to every measured row of both GPUs (:data:`EFFICIENCY`;
``tests/test_plan.py`` checks the constants and that the fit stays within 10% of every measured
pass: the worst is 9.2% on the H100, 9.9% on the H200). Both GPUs have the same tensor cores and
peak (989.4 TFLOP/s), and the H200's forwards and input gradients ran 1% to 16% faster than the
H100's at the same shapes (its memory is 43% faster; most in the head with its loss), its weight
passes about as fast: one fit for both splits the difference. Other GPUs get the same fraction of their own peak,
an assumption stated in the planner's output. The efficiency is that of a whole layer's pass for
one microbatch on one GPU; tensor and context parallelism then divide the pass's time by their
sizes without a further loss (an assumption the measurements do not cover).

A mixture of experts' layer is timed as each GPU runs it (:func:`moe_dense_costs`,
:func:`expert_costs`): the experts' grouped products at the rows each expert gets, which
DeepGEMM's published grouped-GEMM throughput says reach less of the GPU below 4,096 rows
(:func:`expert_rows_factor`). Under an FP8 recipe the blocks' linear layers run at the speed-ups
Transformer Engine's GEMM benchmark published (:data:`FP8_GEMM_MS`, quantization included),
attention's score and value products, the router and the head at bf16's (:func:`fp8_factors`).

FLOPs of one layer for ``N`` tokens of sequences of length ``s`` (causal attention computes half
of the score matrix):

- forward: ``2 N P_mm`` for the matrix products (``P_mm`` the layer's matrix parameters a token
  uses) plus ``N s (H d_qk + H d_v)`` for attention: the scores ``Q K^T`` and the product with
  ``V``, both at the width of the ``H`` query heads (grouped-query attention shares a key/value
  head among several query heads, which shrinks the key and value projections, not these
  products);
- input gradient ``I``: the products again (their input gradients) plus attention's backward,
  ``2.5`` times its forward (FlashAttention's backward recomputes the scores);
- weight gradient ``W``: the products again.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from ppbook.planner import memory
from ppbook.planner.hardware import GPU
from ppbook.planner.shapes import ModelShape, PRESETS, attention_parameters, mlp_parameters

GPU_DATA = Path(__file__).resolve().parents[3] / "data" / "gpu"
# each GPU preset the book measured, and its file of per-action costs
MEASURED = {"h100-sxm": GPU_DATA / "h100_llama3_costs.json",
            "h200": GPU_DATA / "h200-2026-11-28" / "costs.json"}
MEASURED_ON = {"h100-sxm": "an H100", "h200": "an H200"}  # how the planner's output names them
ATTENTION_BACKWARD = 2.5  # FlashAttention's backward: about 2.5 times its forward's FLOPs


class Line(NamedTuple):
    """One pass's efficiency: ``(a + b log2(h / 4096) + c log2(n / 8192)) * F / (F + flops0)``,
    ``n`` held to ``[tokens_lo, tokens_hi]``, the tokens per microbatch the fit saw."""
    a: float
    b: float
    c: float
    flops0: float
    tokens_lo: int
    tokens_hi: int


# The fraction of the dense bf16 peak each pass reached in the book's H100 and H200 measurements of
# Llama-3-shaped blocks and heads, fitted by calibrate() (the tests check these values)
EFFICIENCY = {"F": Line(0.6003, 0.0415, -0.0052, 300e9, 2048, 65536),
              "I": Line(0.4919, 0.0600, -0.0036, 190e9, 2048, 65536),
              "W": Line(0.7911, -0.0514, -0.0200, 60e9, 2048, 65536),
              "head_F": Line(0.4335, 0.0914, -0.0146, 0.0, 2048, 16384),
              "head_I": Line(0.4489, 0.0842, -0.0020, 0.0, 2048, 16384),
              "head_W": Line(0.8224, -0.0653, -0.0393, 310e9, 2048, 16384)}
EFFICIENCY_RANGE = (0.2, 0.85)  # where the line is held
FLOPS0_STEP = 10e9  # calibrate() tries F0 in steps of 10 GFLOP


def efficiency(kind: str, hidden: int, tokens: int, flops: float) -> float:
    """The fraction of peak a pass of ``kind`` reaches at this hidden size, on a microbatch of
    ``tokens`` tokens whose pass does ``flops`` FLOPs: a layer's ``F``, ``I``, ``W``, or the
    head's (with its loss, whose softmax over the vocabulary is bound by memory bandwidth rather
    than arithmetic) ``head_F``, ``head_I``, ``head_W``."""
    e = EFFICIENCY[kind]
    n = min(e.tokens_hi, max(e.tokens_lo, tokens))
    lo, hi = EFFICIENCY_RANGE
    line = min(hi, max(lo, e.a + e.b * math.log2(hidden / 4096) + e.c * math.log2(n / 8192)))
    return line * flops / (flops + e.flops0)


@dataclass(frozen=True)
class PassCosts:
    """Seconds of each pass of one unit (a layer, or the head with its loss) for one microbatch."""
    F: float
    I: float
    W: float
    measured: bool

    @property
    def B(self) -> float:
        return self.I + self.W


def layer_flops(shape: ModelShape, tokens: int, seq_len: int, moe_layer: bool = False) -> dict[str, float]:
    """FLOPs of one layer's passes for ``tokens`` tokens in sequences of ``seq_len``."""
    q, _, _, out = memory.attention_widths(shape)  # the query heads' widths: scores (d_qk) and values (d_v)
    mm = attention_parameters(shape)
    if moe_layer:
        mm += (shape.top_k + shape.shared_experts) * mlp_parameters(shape, shape.expert_ffn) \
            + shape.hidden * shape.experts
    else:
        mm += mlp_parameters(shape, shape.ffn)
    products = 2.0 * tokens * mm
    attention = float(tokens) * seq_len * (q + out)  # causal: each token's query meets s/2 keys on average
    return {"F": products + attention, "I": products + ATTENTION_BACKWARD * attention, "W": products}


def head_flops(shape: ModelShape, tokens: int) -> dict[str, float]:
    """FLOPs of the output head (and its loss, whose arithmetic is small) for ``tokens`` tokens."""
    products = 2.0 * tokens * shape.hidden * shape.vocab
    return {"F": products, "I": products, "W": products}


@functools.lru_cache(maxsize=1)
def _rows() -> tuple[dict, ...]:
    out = []
    for gpu_name, path in MEASURED.items():
        if path.is_file():
            out += [{**r, "gpu": gpu_name} for r in json.loads(path.read_text())["rows"]]
    return tuple(out)


def measured_rows(gpu_name: str | None = None) -> list[dict]:
    """The measured rows, each with the ``gpu`` preset it was measured on (of one GPU where named)."""
    return [r for r in _rows() if gpu_name is None or r["gpu"] == gpu_name]


def _measured(shape: ModelShape, part: str, seq_len: int, b: int, gpu_name: str) -> PassCosts | None:
    for r in measured_rows(gpu_name):
        preset = PRESETS.get(r["model"])
        if (preset is not None and _same_block(preset, shape) and r["part"] == part and r["seq_len"] == seq_len
                and r["microbatch"] == b and (part == "block" or preset.vocab == shape.vocab)):
            return PassCosts(r["F_ms"] / 1e3, r["I_ms"] / 1e3, r["W_ms_est"] / 1e3, True)
    return None


def _same_block(a: ModelShape, b: ModelShape) -> bool:
    keys = ("hidden", "heads", "kv_heads", "ffn", "mlp", "norm", "experts", "kv_lora_rank")
    return all(getattr(a, k) == getattr(b, k) for k in keys)


def _estimate(flops: dict[str, float], prefix: str, hidden: int, tokens: int, gpu: GPU) -> PassCosts:
    peak = gpu.bf16_tflops * 1e12
    return PassCosts(*(flops[k] / (peak * efficiency(prefix + k, hidden, tokens, flops[k])) for k in ("F", "I", "W")),
                     measured=False)


@functools.lru_cache(maxsize=4096)
def layer_costs(shape: ModelShape, gpu: GPU, b: int, seq_len: int, moe_layer: bool = False,
                measured_ok: bool = True) -> PassCosts:
    """Seconds of one layer's F, I and W for a microbatch of ``b`` sequences."""
    if measured_ok and gpu.name in MEASURED and not moe_layer:
        hit = _measured(shape, "block", seq_len, b, gpu.name)
        if hit:
            return hit
    return _estimate(layer_flops(shape, b * seq_len, seq_len, moe_layer), "", shape.hidden, b * seq_len, gpu)


@functools.lru_cache(maxsize=4096)
def head_costs(shape: ModelShape, gpu: GPU, b: int, seq_len: int, measured_ok: bool = True) -> PassCosts:
    """Seconds of the output head and its loss for a microbatch of ``b`` sequences."""
    if measured_ok and gpu.name in MEASURED:
        hit = _measured(shape, "head+loss", seq_len, b, gpu.name)
        if hit:
            return hit
    return _estimate(head_flops(shape, b * seq_len), "head_", shape.hidden, b * seq_len, gpu)


def pass_efficiencies(shape: ModelShape, b: int, seq_len: int, moe_layer: bool = False) -> dict[str, float]:
    """The fraction of peak each estimated pass reaches for a microbatch of ``b`` sequences of
    ``seq_len`` tokens: a layer's ``F``, ``I``, ``W`` and the head's ``head_F``, ...."""
    tokens = b * seq_len
    layer, head = layer_flops(shape, tokens, seq_len, moe_layer), head_flops(shape, tokens)
    return {prefix + k: efficiency(prefix + k, shape.hidden, tokens, f[k])
            for prefix, f in (("", layer), ("head_", head)) for k in ("F", "I", "W")}


def measured_points() -> dict[str, list[tuple[float, int, float, float]]]:
    """Per pass kind, every measured pass as ``(log2(hidden / 4096), tokens, FLOPs, efficiency)``:
    the FLOPs the planner counts over the measured seconds, as a fraction of the GPU's peak."""
    from ppbook.planner.hardware import GPUS

    points: dict[str, list[tuple[float, int, float, float]]] = {k: [] for k in EFFICIENCY}
    for r in measured_rows():
        shape, peak = PRESETS[r["model"]], GPUS[r["gpu"]].bf16_tflops * 1e12
        tokens, block = r["microbatch"] * r["seq_len"], r["part"] == "block"
        f = layer_flops(shape, tokens, r["seq_len"]) if block else head_flops(shape, tokens)
        for k, key in (("F", "F_ms"), ("I", "I_ms"), ("W", "W_ms_est")):
            points[k if block else "head_" + k].append(
                (math.log2(shape.hidden / 4096), tokens, f[k], f[k] / (r[key] / 1e3) / peak))
    return points


def _solve(m: list[list[float]], v: list[float]) -> list[float]:
    """``m x = v`` for a small symmetric positive-definite ``m`` (Gaussian elimination)."""
    n = len(v)
    a = [row[:] + [v[i]] for i, row in enumerate(m)]
    for i in range(n):
        for r in range(i + 1, n):
            f = a[r][i] / a[i][i]
            a[r] = [x - f * y for x, y in zip(a[r], a[i])]
    x = [0.0] * n
    for i in reversed(range(n)):
        x[i] = (a[i][n] - sum(a[i][j] * x[j] for j in range(i + 1, n))) / a[i][i]
    return x


def calibrate(max_flops0: float = 1000e9) -> dict[str, Line]:
    """The lines of :data:`EFFICIENCY`, fitted to the measured rows of every GPU: for each pass,
    ``F0`` in steps of :data:`FLOPS0_STEP` up to ``max_flops0``, for each the ``a, b, c`` that
    minimise the squared relative error of the predicted efficiency (predicted / measured - 1,
    linear in ``a, b, c``: ordinary least squares), and the ``F0`` whose fit errs least."""
    fits = {}
    for kind, pts in measured_points().items():
        lo, hi = min(p[1] for p in pts), max(p[1] for p in pts)
        best = None
        for step in range(int(round(max_flops0 / FLOPS0_STEP)) + 1):
            flops0 = step * FLOPS0_STEP
            # predicted / measured = (a + b x + c y) * r / e: one row (r / e, x r / e, y r / e) per pass
            rows = []
            for x, n, f, e in pts:
                w = f / (f + flops0) / e
                rows.append((w, x * w, math.log2(min(hi, max(lo, n)) / 8192) * w))
            m = [[sum(u[i] * u[j] for u in rows) for j in range(3)] for i in range(3)]
            abc = _solve(m, [sum(u[i] for u in rows) for i in range(3)])
            err = sum((sum(p * q for p, q in zip(abc, u)) - 1) ** 2 for u in rows)
            if best is None or err < best[0] - 1e-15:
                best = (err, Line(*abc, flops0, lo, hi))
        fits[kind] = best[1]
    return fits


# --- FP8 and the experts' products (issue 52) ------------------------------------------------------------------------

# Transformer Engine's GEMM benchmark (benchmarks/gemm/benchmark_gemm.py), as its documentation publishes it: the
# twelve matrix products of one layer of a 5B model (hidden 4096, MLP 16384, 15,872 tokens: 31 sequences of 512),
# in "autocast" mode, which includes quantizing the inputs and computing their scales; milliseconds per layer of
# the forward products (Fprop: the planner's F), the input gradients (Dgrad: I) and the weight gradients (Wgrad: W).
# NVIDIA/TransformerEngine docs/examples/gemm_profiling/gemm_profiling.rst @ 1609c890 (2026-06-01): "Per-Layer
# GEMM Time" of "GEMM Benchmark (Model Config Mode) on NVIDIA H200 NVL" and "... on NVIDIA B300 SXM6 AC".
FP8_GEMM_MS: dict[str, dict[str, tuple[float, float, float]]] = {
    "hopper": {"bf16": (10.653, 10.813, 10.548), "fp8-current": (6.503, 6.795, 6.987),
               "fp8-delayed": (6.188, 6.306, 6.484), "fp8-blockwise": (7.425, 7.636, 7.821)},
    "blackwell": {"bf16": (4.196, 4.290, 4.272), "fp8-current": (2.879, 3.063, 3.205),
                  "fp8-delayed": (2.486, 2.621, 2.695), "mxfp8": (2.847, 3.045, 3.092)},
}
FP8_SOURCE = ("Transformer Engine's GEMM benchmark, a 5B model's layer (hidden 4096, MLP 16384, 15,872 tokens), "
              "quantization included: NVIDIA/TransformerEngine docs/examples/gemm_profiling/gemm_profiling.rst "
              "@ 1609c890 (H200 NVL for Hopper, B300 for Blackwell)")
# which GPUs have which FP8 tensor cores, by the start of their name (Hopper: H100, H800, H200; Blackwell: B200);
# MXFP8 is Blackwell's
FP8_FAMILY = {"h100": "hopper", "h800": "hopper", "h200": "hopper", "b200": "blackwell"}


def fp8_family(gpu_name: str) -> str | None:
    """The FP8 tensor cores of a GPU (a preset, modified or not, or a published run's H100 variant),
    ``None`` without."""
    return next((f for prefix, f in FP8_FAMILY.items() if gpu_name.startswith(prefix)), None)


def fp8_speedup(precision: str, gpu_name: str) -> tuple[float, float, float] | None:
    """How many times faster the F, I and W matrix products run under ``precision`` than in bf16 on
    this GPU (:data:`FP8_GEMM_MS`: bf16 time over FP8 time, quantization included); ``None`` where
    it was not measured (no FP8 tensor cores, or a recipe the GPU does not run)."""
    family = FP8_GEMM_MS.get(fp8_family(gpu_name) or "", {})
    if precision not in family:
        return None
    return tuple(b / f for b, f in zip(family["bf16"], family[precision]))


def precision_problem(precision: str, gpu_name: str) -> str | None:
    """Why ``precision`` cannot be timed on this GPU, in one line with the fix; ``None`` if it can."""
    if precision == "bf16":
        return None
    family = fp8_family(gpu_name)
    if family is None:
        return (f"--precision fp8 (recipe {precision}): the planner has no FP8 GEMM measurement on the {gpu_name} (it "
                f"times FP8 on Hopper and Blackwell GPUs: {', '.join(FP8_FAMILY)}); use bf16")
    if precision not in FP8_GEMM_MS[family]:
        runs = [p for p in FP8_GEMM_MS[family] if p != "bf16"]
        return (f"--fp8-recipe {precision} does not run on {family.capitalize()} ({gpu_name}) as measured: use "
                f"--fp8-recipe {' or '.join(runs)}" + (" (MXFP8 needs Blackwell's tensor cores)" if precision == "mxfp8" else ""))
    return None


def fp8_factors(flops: dict[str, float], fp8_products: float, speedup: tuple[float, float, float]) -> dict[str, float]:
    """The factor a pass's time takes when ``fp8_products`` of each pass's FLOPs (the matrix products
    of FP8 linear layers; the same in F, I and W) run ``speedup`` times faster and the rest (attention's
    score and value products, the router) at bf16's: the time of each part is taken proportional to
    its FLOPs, so the factor is ``1 - share + share / speedup``."""
    out = {}
    for k, s in zip(("F", "I", "W"), speedup):
        share = min(1.0, fp8_products / flops[k]) if flops[k] else 0.0
        out[k] = 1 - share + share / s
    return out


def _scaled(c: PassCosts, factor: dict[str, float]) -> PassCosts:
    return PassCosts(c.F * factor["F"], c.I * factor["I"], c.W * factor["W"], c.measured)


def layer_costs_at(shape: ModelShape, gpu: GPU, b: int, seq_len: int, precision: str = "bf16",
                   measured_ok: bool = True) -> PassCosts:
    """A dense layer's passes (:func:`layer_costs`) under ``precision``: its matrix products FP8, its
    attention bf16. bf16 is :func:`layer_costs` itself."""
    base = layer_costs(shape, gpu, b, seq_len, False, measured_ok)
    speedup = None if precision == "bf16" else fp8_speedup(precision, gpu.name)
    if speedup is None:
        return base
    tokens = b * seq_len
    products = 2.0 * tokens * (attention_parameters(shape) + mlp_parameters(shape, shape.ffn))
    return _scaled(base, fp8_factors(layer_flops(shape, tokens, seq_len), products, speedup))


def moe_dense_flops(shape: ModelShape, tokens: int, seq_len: int) -> tuple[dict[str, float], float]:
    """FLOPs of an MoE layer's passes without its routed experts (attention, router, shared experts)
    for ``tokens`` tokens, and the FLOPs of its FP8-capable products (all but the router)."""
    q, _, _, out = memory.attention_widths(shape)
    fp8 = 2.0 * tokens * (attention_parameters(shape) + shape.shared_experts * mlp_parameters(shape, shape.expert_ffn))
    products = fp8 + 2.0 * tokens * shape.hidden * shape.experts
    attention = float(tokens) * seq_len * (q + out)
    return {"F": products + attention, "I": products + ATTENTION_BACKWARD * attention, "W": products}, fp8


@functools.lru_cache(maxsize=4096)
def moe_dense_costs(shape: ModelShape, gpu: GPU, b: int, seq_len: int, precision: str = "bf16",
                    split: int = 1) -> PassCosts:
    """Seconds of one GPU's share of an MoE layer's attention, router and shared experts for a
    microbatch of ``b`` sequences (estimated: the book measured no MoE layer), split over ``split``
    GPUs (tensor x context parallelism): timed as the pass each GPU runs, ``split`` times fewer
    FLOPs with a whole pass's fixed cost (:func:`efficiency`), where a dense layer's pass is timed
    whole and divided without loss. The MoE layer is timed as each GPU runs it, its experts too
    (:func:`expert_costs`)."""
    tokens = b * seq_len
    whole, fp8 = moe_dense_flops(shape, tokens, seq_len)
    flops = {k: f / split for k, f in whole.items()}
    c = _estimate(flops, "", shape.hidden, tokens, gpu)
    speedup = None if precision == "bf16" else fp8_speedup(precision, gpu.name)
    return c if speedup is None else _scaled(c, fp8_factors(flops, fp8 / split, speedup))


# DeepGEMM's grouped GEMMs for MoE (FP8, H800), as its README published them (deepseek-ai/DeepGEMM README.md @ 327ec92f,
# 2025-04-09, "Grouped GEMMs for MoE models", masked layout below 4,096 rows per group, contiguous at 4,096): rows
# per expert (M per group) and TFLOPS for the two shapes of a DeepSeek-V3 expert (N 4096, K 7168; N 7168, K 2048)
EXPERT_GEMM_TFLOPS = ((256, 932, 815), (512, 1040, 916), (1024, 1233, 925), (4096, 1346, 1214))


def expert_rows_factor(rows: float) -> float:
    """The share of a large grouped GEMM's throughput an expert's products reach with ``rows`` tokens
    each (:data:`EXPERT_GEMM_TFLOPS`: each shape's throughput over its throughput at 4,096 rows,
    averaged over the two shapes, interpolated in log2 of the rows; 1 from 4,096 rows on, held at
    256 rows' below). Small experts' products fill fewer of the GPU's tiles: at 512 rows a
    DeepSeek-V3 expert reached about three quarters of its large-batch throughput. The
    measurement is FP8 on an H800; the planner applies the same shares to bf16 experts (an
    assumption: the shares come from tiles left empty, the same in both)."""
    pts = [(math.log2(n), (a / EXPERT_GEMM_TFLOPS[-1][1] + b / EXPERT_GEMM_TFLOPS[-1][2]) / 2)
           for n, a, b in EXPERT_GEMM_TFLOPS]
    x = math.log2(max(rows, EXPERT_GEMM_TFLOPS[0][0]))
    if x >= pts[-1][0]:
        return 1.0
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return 1.0


@functools.lru_cache(maxsize=4096)
def expert_costs(shape: ModelShape, gpu: GPU, copies: float, per_expert: float, etp: int,
                 precision: str = "bf16") -> PassCosts:
    """Seconds of one GPU's routed experts in one MoE layer: ``copies`` token copies (a token routed to
    ``top_k`` experts is ``top_k`` copies) through its experts, each expert a matrix ``etp`` times
    narrower than the model's, ``per_expert`` copies to each. The experts' products of a GPU run as
    one grouped pass (Megatron-LM's and torchtitan's grouped GEMMs), timed at the efficiency of a pass
    of that many FLOPs (its fixed cost once) on the tokens each expert gets: the microbatch's tokens
    in :func:`efficiency` are the expert's rows, and :func:`expert_rows_factor` the share of a large
    grouped GEMM's throughput that experts of so few rows reach. Under FP8 every expert product
    runs in FP8."""
    products = 2.0 * copies * mlp_parameters(shape, shape.expert_ffn) / etp
    flops = {"F": products, "I": products, "W": products}
    rows = expert_rows_factor(per_expert)
    c = _estimate(flops, "", shape.hidden, per_expert, gpu)
    c = PassCosts(c.F / rows, c.I / rows, c.W / rows, False)
    speedup = None if precision == "bf16" else fp8_speedup(precision, gpu.name)
    return c if speedup is None else _scaled(c, fp8_factors(flops, products, speedup))
