"""Splitting a model into stages: balancing policies, per-part profiling, meta-device stages.

Introduced in chapter 4 ("Splitting a model"); the training chapters build their stages with it.

A model of the book is a chain of *units*: the embedding, each transformer layer, and the head
(final norm and output projection). A split gives each stage a contiguous run of units, so the
embedding is always on the first stage and the head on the last. The policies differ only in
the cost they give each unit:

* ``"layers"``: every layer costs one and the embedding and head nothing (what
  :func:`ppbook.stages.assign_layers` does, and what ``balance=[...]`` layer counts mean);
* ``"params"``: a unit costs its parameter count;
* ``"time"``: a unit costs its measured forward + backward time (:func:`profile_units`).

Then :func:`partition` finds the contiguous split whose most expensive stage is cheapest.
Everything here but :func:`peak_build_memory` runs without processes.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import time
from statistics import median
from typing import Callable

import torch
import torch.nn as nn

from ppbook.models import GPT, GPTConfig, Llama, LlamaConfig, init_weights, rope_tables
from ppbook.stages import assign_layers, keep_parts, stage_module

POLICIES = ("layers", "params", "time")


# ---------------------------------------------------------------------------------------------
# Units and their costs
# ---------------------------------------------------------------------------------------------
def unit_names(n_layers: int) -> list[str]:
    """``["embedding", "layers.0", ..., "layers.{n-1}", "head"]``: the chain a split cuts."""
    return ["embedding", *(f"layers.{i}" for i in range(n_layers)), "head"]


def _unit_parts(unit: int, n_layers: int) -> tuple[list[int], bool, bool]:
    """(layers, keep embedding, keep head) of unit number ``unit``."""
    if unit == 0:
        return [], True, False
    if unit == n_layers + 1:
        return [], False, True
    return [unit - 1], False, False


def unit_params(model: nn.Module) -> list[int]:
    """Parameter count of each unit (embedding, layers, head), in chain order."""
    head = sum(p.numel() for part in (model.norm, model.output) for p in part.parameters())
    layers = [sum(p.numel() for p in layer.parameters()) for layer in model.layers.values()]
    return [sum(p.numel() for p in model.tok_embeddings.parameters()), *layers, head]


def _unit_view(model: nn.Module, unit: int) -> nn.Module:
    """A shell of ``model`` holding only one unit, sharing its parameters (no copy of weights)."""
    shell = copy.copy(model)
    shell._modules = dict(model._modules)
    shell._modules["layers"] = nn.ModuleDict(dict(model.layers.items()))
    layers, embedding, head = _unit_parts(unit, len(model.layers))
    return keep_parts(shell, layers, embedding, head)


def profile_units(model: nn.Module, tokens: torch.Tensor, targets: torch.Tensor,
                  loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                  repeats: int = 5, warmup: int = 2) -> list[float]:
    """Median forward + backward seconds of each unit on one microbatch ``tokens`` (B, T).

    Each unit runs through the model's own ``forward`` with the other parts removed, on the
    activation it would receive; the head includes the loss. Gradients it leaves are cleared.
    """
    n = len(model.layers)
    with torch.no_grad():  # the input each unit sees in the full model
        h = _unit_view(model, 0)(tokens)  # (B, T, C)
    seconds = []
    for unit in range(n + 2):
        view = _unit_view(model, unit)
        x = tokens if unit == 0 else h.detach().clone().requires_grad_()

        def fwd_bwd():
            out = view(x)
            if unit == n + 1:
                loss_fn(out, targets).backward()
            else:
                out.backward(torch.ones_like(out))

        times = []
        for i in range(warmup + repeats):
            t0 = time.perf_counter()
            fwd_bwd()
            if i >= warmup:
                times.append(time.perf_counter() - t0)
        seconds.append(median(times))
        if 0 < unit <= n:  # the next layer's input: this one's output
            with torch.no_grad():
                h = view(h)
    model.zero_grad(set_to_none=True)
    return seconds


# ---------------------------------------------------------------------------------------------
# Splitting a chain of costs
# ---------------------------------------------------------------------------------------------
def partition(costs: list[float], num_stages: int) -> list[list[int]]:
    """Cut ``costs`` (one per unit, in order) into ``num_stages`` contiguous non-empty runs of
    unit indices so that the largest run total is as small as possible (dynamic programming,
    exact). Among equally good splits it picks the one with the earliest cuts.

    >>> partition([1, 1, 1, 1, 4], 2)
    [[0, 1, 2, 3], [4]]
    """
    n = len(costs)
    if num_stages < 1:
        raise ValueError(f"num_stages must be at least 1, got {num_stages}")
    if n < num_stages:
        raise ValueError(f"cannot cut {n} units into {num_stages} non-empty stages; use at most {n} stages")
    if any(c < 0 for c in costs):
        raise ValueError(f"costs must be non-negative, got {costs}")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    # best[s][i]: the smallest possible largest stage total when the first i units form s stages
    best = [[inf] * (n + 1) for _ in range(num_stages + 1)]
    cut = [[0] * (n + 1) for _ in range(num_stages + 1)]
    best[0][0] = 0.0
    for s in range(1, num_stages + 1):
        for i in range(s, n - (num_stages - s) + 1):
            for j in range(s - 1, i):  # the last stage holds units j .. i-1
                value = max(best[s - 1][j], prefix[i] - prefix[j])
                if value < best[s][i] - 1e-15:
                    best[s][i], cut[s][i] = value, j
    runs, i = [], n
    for s in range(num_stages, 0, -1):
        j = cut[s][i]
        runs.append(list(range(j, i)))
        i = j
    return runs[::-1]


def layers_of(runs: list[list[int]], n_layers: int) -> list[list[int]]:
    """The transformer layers (not units) each stage of a unit split owns."""
    return [[u - 1 for u in run if 1 <= u <= n_layers] for run in runs]


def balance(policy: str, n_layers: int, num_stages: int, params: list[int] | None = None,
            seconds: list[float] | None = None) -> list[list[int]]:
    """Layers per stage under ``policy`` (one of :data:`POLICIES`).

    ``"layers"`` is :func:`ppbook.stages.assign_layers`: equal layer counts, the earlier
    stages taking the extra ones. The others cut the unit chain (embedding, layers, head) by
    parameter count or by measured seconds with :func:`partition`.
    """
    if policy == "layers":
        return assign_layers(n_layers, num_stages)
    costs = {"params": params, "time": seconds}.get(policy, ...)
    if costs is ...:
        raise ValueError(f"unknown balancing policy {policy!r}; choose one of {', '.join(POLICIES)}")
    if costs is None or len(costs) != n_layers + 2:
        raise ValueError(f"policy {policy!r} needs one cost per unit ({n_layers + 2}: embedding, "
                         f"{n_layers} layers, head), got {None if costs is None else len(costs)}")
    return layers_of(partition(list(costs), num_stages), n_layers)


def stage_costs(layers: list[list[int]], costs: list[float]) -> list[float]:
    """Total cost of each stage's units (embedding on the first, head on the last)."""
    out = [sum(costs[1 + i] for i in run) for run in layers]
    out[0] += costs[0]
    out[-1] += costs[-1]
    return out


# ---------------------------------------------------------------------------------------------
# Building a stage without building the model
# ---------------------------------------------------------------------------------------------
def _empty_model(cfg: GPTConfig | LlamaConfig) -> nn.Module:
    return GPT(cfg) if isinstance(cfg, GPTConfig) else Llama(cfg)


@torch.no_grad()
def init_buffers(model: nn.Module) -> nn.Module:
    """Recompute the buffers that ``to_empty`` left uninitialised (the rotary tables of Llama)."""
    if isinstance(model, Llama):
        cfg = model.cfg
        cos, sin = rope_tables(cfg.dim // cfg.n_heads, cfg.max_seq_len, cfg.rope_theta)
        model.rope_cos.copy_(cos)
        model.rope_sin.copy_(sin)
    return model


def build_stage_on_meta(
    cfg: GPTConfig | LlamaConfig,
    seed: int,
    stage_index: int,
    num_stages: int,
    layers: list[int] | None = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> nn.Module:
    """Stage ``stage_index`` with exactly the weights of
    ``build_model(cfg, seed)``'s same parts, without ever holding the
    full model: built on the meta device (shapes, no storage), cut, then
    given storage with ``to_empty`` and initialised by parameter name."""
    with torch.device("meta"):
        model = _empty_model(cfg)  # no memory: every tensor is a shape
    stage_module(model, stage_index, num_stages, layers)
    model.to_empty(device="cpu")  # storage for this stage only, uninitialised
    # each parameter from (seed, its name): the full model's values
    init_weights(model, seed)
    init_buffers(model)  # to_empty does not restore buffers either
    return model.to(dtype).to(device)


def _vm_hwm() -> int:
    """This process's peak resident memory in bytes since the last :func:`_reset_peak` (Linux)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def _reset_peak() -> None:
    """Set the peak resident memory to the current one (Linux >= 4.0: ``5 > clear_refs``), so the
    transient peak of ``import torch`` does not hide what comes after."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _measure_build(method: str, cfg_kind: str, cfg_kwargs: dict, stage_index: int, num_stages: int) -> dict:
    """In a fresh process: build one stage by ``method`` and report its peak resident memory."""
    from ppbook.models import build_model

    if method not in ("meta", "full"):
        raise ValueError(f"method must be 'meta' or 'full', got {method!r}")
    cls = GPTConfig if cfg_kind == "gpt" else LlamaConfig
    cfg, tiny = cls(**cfg_kwargs), cls(n_layers=num_stages)

    def build(c):
        return build_stage_on_meta(c, 0, stage_index, num_stages) if method == "meta" else \
            stage_module(build_model(c, 0), stage_index, num_stages)

    # Warm-up on a tiny model: the first meta-device construction in a process imports torch's
    # Python meta kernels (hundreds of modules, on nn.Embedding's normal_); that one-time cost
    # is reported apart.
    _reset_peak()
    before, t0 = _vm_hwm(), time.perf_counter()
    build(tiny)
    warmup = {"seconds": time.perf_counter() - t0, "peak_increase": _vm_hwm() - before}
    _reset_peak()
    before, t0 = _vm_hwm(), time.perf_counter()
    stage = build(cfg)
    seconds = time.perf_counter() - t0
    return {"method": method, "stage_bytes": sum(p.numel() * p.element_size() for p in stage.parameters()),
            "peak_increase": _vm_hwm() - before, "seconds": seconds, "warmup": warmup}


def peak_build_memory(cfg: GPTConfig | LlamaConfig, stage_index: int, num_stages: int,
                      methods: tuple[str, ...] = ("full", "meta"), timeout: float = 120.0) -> dict[str, dict]:
    """Peak resident memory added by building one stage by each method: ``"full"`` (the full
    model first, then cut) and ``"meta"`` (:func:`build_stage_on_meta`). Each is measured in a
    fresh Python process of its own, so the peaks cannot mix; the processes run side by side."""
    kind = "gpt" if isinstance(cfg, GPTConfig) else "llama"
    code = ("import json, sys; from ppbook.split import _measure_build; "
            "print(json.dumps(_measure_build(*json.loads(sys.argv[1]))))")
    procs = {m: subprocess.Popen([sys.executable, "-c", code, json.dumps([m, kind, cfg.__dict__, stage_index, num_stages])],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for m in methods}
    out = {}
    try:
        for method, proc in procs.items():
            stdout, stderr = proc.communicate(timeout=timeout)
            if proc.returncode != 0:
                raise RuntimeError(f"measuring the {method!r} build failed:\n{stderr[-2000:]}")
            out[method] = json.loads(stdout.strip().splitlines()[-1])
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return out
