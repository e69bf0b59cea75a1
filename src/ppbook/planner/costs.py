"""Seconds per pipeline action: measured on a GPU where the book has measurements, estimated
from floating-point operations everywhere else, and labelled as one or the other.

Introduced in "Choosing a pipeline". The book measured one Llama-3-shaped block and the output
head with its loss on one H100 (``data/gpu/h100_llama3_costs.json``, chapter 11): the forward
``F``, the input-gradient pass ``I``, the weight-gradient pass ``W`` and the full backward ``B``.
A request for exactly such a block on an H100 uses those times. Any other model, sequence length
or GPU gets an estimate: the pass's FLOPs over the GPU's dense bf16 peak times an efficiency, the
fraction of peak that the measured passes reached on the H100. Wider layers reach more of it (the
measured forwards went from about half of the peak at hidden size 4096 to over 60% at 16384), so
the efficiency of each pass is a line in ``log2(hidden / 4096)``, fitted to the measurements by
:func:`calibrate` (:data:`EFFICIENCY`; ``tests/test_plan.py`` checks the constants and
that the fit stays within 7% of every measured pass) and held between 20% and 85%. Other GPUs
get the same fraction of their own peak. That is an assumption, stated in the planner's output.

FLOPs of one layer for ``N`` tokens of sequences of length ``s`` (causal attention computes half
of the score matrix):

- forward: ``2 N P_mm`` for the matrix products (``P_mm`` the layer's matrix parameters a token
  uses) plus ``N s H (d_qk + d_v)`` for attention;
- input gradient ``I``: the products again (their input gradients) plus attention's backward,
  ``2.5`` times its forward (FlashAttention's backward recomputes the scores);
- weight gradient ``W``: the products again.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from ppbook.planner import memory
from ppbook.planner.hardware import GPU
from ppbook.planner.shapes import ModelShape, PRESETS, attention_parameters, mlp_parameters

COSTS_FILE = Path(__file__).resolve().parents[3] / "data" / "gpu" / "h100_llama3_costs.json"
MEASURED_GPU = "h100-sxm"
ATTENTION_BACKWARD = 2.5  # FlashAttention's backward: about 2.5 times its forward's FLOPs
# The fraction of the dense bf16 peak each pass reached in the book's H100 measurements of
# Llama-3-shaped blocks and heads, as (a, b) of a + b log2(hidden / 4096) (calibrate() recomputes
# it; the tests check these values)
EFFICIENCY = {"F": (0.515, 0.077), "I": (0.408, 0.089), "W": (0.774, -0.039),
              "head_F": (0.418, 0.100), "head_I": (0.413, 0.100), "head_W": (0.814, -0.056)}
EFFICIENCY_RANGE = (0.2, 0.85)


def efficiency(kind: str, hidden: int) -> float:
    """The fraction of peak a pass of ``kind`` reaches at this hidden size: a layer's ``F``,
    ``I``, ``W``, or the head's (with its loss, whose softmax over the vocabulary is bound by
    memory bandwidth rather than arithmetic) ``head_F``, ``head_I``, ``head_W``."""
    import math

    a, b = EFFICIENCY[kind]
    lo, hi = EFFICIENCY_RANGE
    return min(hi, max(lo, a + b * math.log2(hidden / 4096)))


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
    q, k, v, out = memory.attention_widths(shape)
    mm = attention_parameters(shape)
    if moe_layer:
        mm += (shape.top_k + shape.shared_experts) * mlp_parameters(shape, shape.expert_ffn) \
            + shape.hidden * shape.experts
    else:
        mm += mlp_parameters(shape, shape.ffn)
    products = 2.0 * tokens * mm
    attention = float(tokens) * seq_len * (q + v)  # causal: each token's query meets s/2 keys on average
    return {"F": products + attention, "I": products + ATTENTION_BACKWARD * attention, "W": products}


def head_flops(shape: ModelShape, tokens: int) -> dict[str, float]:
    """FLOPs of the output head (and its loss, whose arithmetic is small) for ``tokens`` tokens."""
    products = 2.0 * tokens * shape.hidden * shape.vocab
    return {"F": products, "I": products, "W": products}


_ROWS: list[dict] | None = None


def measured_rows() -> list[dict]:
    global _ROWS
    if _ROWS is None:
        _ROWS = json.loads(COSTS_FILE.read_text())["rows"] if COSTS_FILE.is_file() else []
    return _ROWS


def _measured(shape: ModelShape, part: str, seq_len: int, b: int) -> PassCosts | None:
    for r in measured_rows():
        preset = PRESETS.get(r["model"])
        if (preset is not None and _same_block(preset, shape) and r["part"] == part and r["seq_len"] == seq_len
                and r["microbatch"] == b and (part == "block" or preset.vocab == shape.vocab)):
            return PassCosts(r["F_ms"] / 1e3, r["I_ms"] / 1e3, r["W_ms_est"] / 1e3, True)
    return None


def _same_block(a: ModelShape, b: ModelShape) -> bool:
    keys = ("hidden", "heads", "kv_heads", "ffn", "mlp", "norm", "experts", "kv_lora_rank")
    return all(getattr(a, k) == getattr(b, k) for k in keys)


@functools.lru_cache(maxsize=4096)
def layer_costs(shape: ModelShape, gpu: GPU, b: int, seq_len: int, moe_layer: bool = False,
                measured_ok: bool = True) -> PassCosts:
    """Seconds of one layer's F, I and W for a microbatch of ``b`` sequences."""
    if measured_ok and gpu.name == MEASURED_GPU and not moe_layer:
        hit = _measured(shape, "block", seq_len, b)
        if hit:
            return hit
    flops = layer_flops(shape, b * seq_len, seq_len, moe_layer)
    peak = gpu.bf16_tflops * 1e12
    return PassCosts(*(flops[k] / (peak * efficiency(k, shape.hidden)) for k in ("F", "I", "W")), measured=False)


@functools.lru_cache(maxsize=4096)
def head_costs(shape: ModelShape, gpu: GPU, b: int, seq_len: int, measured_ok: bool = True) -> PassCosts:
    """Seconds of the output head and its loss for a microbatch of ``b`` sequences."""
    if measured_ok and gpu.name == MEASURED_GPU:
        hit = _measured(shape, "head+loss", seq_len, b)
        if hit:
            return hit
    flops = head_flops(shape, b * seq_len)
    peak = gpu.bf16_tflops * 1e12
    return PassCosts(*(flops[k] / (peak * efficiency("head_" + k, shape.hidden)) for k in ("F", "I", "W")),
                     measured=False)


def calibrate() -> dict[str, tuple[float, float]]:
    """The lines of :data:`EFFICIENCY`, fitted by least squares to the measured rows: for each
    pass, the efficiency of every measured block (head) against ``log2(hidden / 4096)``."""
    import math

    from ppbook.planner.hardware import GPUS

    peak = GPUS[MEASURED_GPU].bf16_tflops * 1e12
    points: dict[str, list[tuple[float, float]]] = {k: [] for k in EFFICIENCY}
    for r in measured_rows():
        shape = PRESETS[r["model"]]
        tokens, x = r["microbatch"] * r["seq_len"], math.log2(shape.hidden / 4096)
        block = r["part"] == "block"
        f = layer_flops(shape, tokens, r["seq_len"]) if block else head_flops(shape, tokens)
        for k, key in (("F", "F_ms"), ("I", "I_ms"), ("W", "W_ms_est")):
            points[k if block else "head_" + k].append((x, f[k] / (r[key] / 1e3) / peak))
    fits = {}
    for k, pts in points.items():
        n = len(pts)
        mx, my = sum(x for x, _ in pts) / n, sum(y for _, y in pts) / n
        sxx = sum((x - mx) ** 2 for x, _ in pts)
        slope = sum((x - mx) * (y - my) for x, y in pts) / sxx if sxx else 0.0
        fits[k] = (my - slope * mx, slope)
    return fits
