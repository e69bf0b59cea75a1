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
