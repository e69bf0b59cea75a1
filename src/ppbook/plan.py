"""Choosing a pipeline from the command line: ``python -m ppbook.plan``.

Introduced in "Choosing a pipeline". A thin command line over the torch-free planner
(:mod:`ppbook.planner.search`): it reads the request (a preset model or a Hugging Face
``config.json``, a GPU preset or your own numbers, links, GPUs, batch), prints the ranked layouts,
the winner's memory per GPU by kind and why it wins, and, on request, explains a layout you name
(``--layout``) and writes the winner as a torchtitan 0.3.0 job (``torchrun ... -m torchtitan.train
--module ... --config ...`` and its overrides) or Megatron-LM's ``pretrain_gpt.py`` command
(``--export``); every time it prints is calibrated against the published runs of the framework it
will run on its GPU's generation (``--framework``), says whether its pass times were measured or
estimated, and carries its band (:mod:`ppbook.planner.calibration`); the layouts within the winner's
band are printed as a tie.

    python -m ppbook.plan --model llama3-8b --gpu h100-sxm --gpus 8 --global-batch 64 --seq-len 8192
    python -m ppbook.plan --model llama3-70b --gpus 64 --global-batch 1024 --seq-len 8192 --export torchtitan
    python -m ppbook.plan --model path/to/config.json --gpu a100-80gb --gpus 32 --global-batch 256 --seq-len 4096
    python -m ppbook.plan --model llama3-70b --gpus 64 --global-batch 1024 --seq-len 8192 \\
        --layout "tp=8 pp=8 dp=1 schedule=1F1B b=1 sharding=none recompute=full"

Every bad request gets one line saying what is wrong and how to fix it, and exit status 2; a
request nothing fits gets the closest layout's memory and exit status 1.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from ppbook.planner import calibration, hardware, memory, schedules, search, shapes
from ppbook.planner.export import (FRAMEWORKS, MEGATRON_CORE_VERSION, MEGATRON_DISPATCHER, MEGATRON_LM_RELEASE,
                                   MEGATRON_MLP, MEGATRON_OPTIMIZER, MEGATRON_OVERLAP, MEGATRON_PRECISION,
                                   MEGATRON_SHARDING, MEGATRON_VOCAB_DIVISOR, PLACEHOLDERS,
                                   TORCHTITAN_CHECKPOINT_INTERVAL, TORCHTITAN_ENTRY_NOTES, TORCHTITAN_LOSS_CHUNKS,
                                   TORCHTITAN_OVERRIDES, TORCHTITAN_PRECISION_NOTES, TORCHTITAN_REGISTRY,
                                   TORCHTITAN_VERSION)

GB = memory.GB


# --- the request -------------------------------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    """argparse, but a bad command line gets one line naming the fix (not the whole usage), and
    exit status 2, like every other bad request."""

    def error(self, message: str):
        print(f"ppbook.plan: error: {message}; {_fix(message)}", file=sys.stderr)
        raise SystemExit(2)


def _fix(message: str) -> str:
    """What to do about one of argparse's messages."""
    flag = message.split(":")[0].removeprefix("argument ").split("/")[-1].strip()
    if "invalid int value" in message:
        return f"{flag} takes a whole number, such as {flag} 8"
    if "invalid float value" in message:
        return f"{flag} takes a number, such as 0.1 or 80"
    if "required" in message:
        return f"add {message.split(': ', 1)[1].replace(', ', ' N, ')} N (--help lists every flag)"
    if "invalid choice" in message:
        return "use one of the choices listed"
    if "expected" in message:
        return f"give {flag} its value (--help shows it)"
    return "remove it or fix its spelling (--help lists every flag)"


def parse_args(argv=None) -> argparse.Namespace:
    p = _Parser(prog="python -m ppbook.plan", description=__doc__.split("\n")[0])
    g = p.add_argument_group("model")
    g.add_argument("--model", required=True,
                   help=f"a preset ({', '.join(shapes.PRESETS)}), the path of a Hugging Face config.json, or "
                        "'custom' with the flags below")
    for flag in ("hidden", "layers", "heads", "kv-heads", "ffn", "vocab"):
        g.add_argument(f"--{flag}", type=int, default=None, help="with --model custom (a Llama-style block)")
    g = p.add_argument_group("hardware")
    g.add_argument("--gpu", default="h100-sxm", help=f"a preset ({', '.join(hardware.GPUS)}) or 'custom'")
    g.add_argument("--gpu-memory", type=float, default=None, help="GB per GPU (overrides the preset's)")
    g.add_argument("--gpu-tflops", type=float, default=None, help="dense bf16 peak, TFLOP/s (overrides)")
    g.add_argument("--gpu-bandwidth", type=float, default=None, help="memory bandwidth, TB/s (overrides)")
    g.add_argument("--gpus", type=int, required=True, help="GPUs in all")
    g.add_argument("--gpus-per-node", type=int, default=8)
    g.add_argument("--intra", default=None, help=f"link within a node (default: the GPU's): {', '.join(hardware.LINKS)}")
    g.add_argument("--inter", default=None, help="link between nodes (default: the network of the GPU's usual server, "
                                                  "e.g. ib-hdr200 for A100s, ib-ndr400 for H100s)")
    for side in ("intra", "inter"):
        g.add_argument(f"--{side}-bandwidth", type=float, default=None, help=f"GB/s per GPU each way (overrides --{side})")
        g.add_argument(f"--{side}-latency", type=float, default=None, help="microseconds per message (overrides)")
    g = p.add_argument_group("training")
    g.add_argument("--global-batch", type=int, required=True, help="sequences per optimizer step")
    g.add_argument("--seq-len", type=int, required=True)
    g.add_argument("--recipe", choices=list(memory.RECIPES), default="bf16",
                   help="bf16: bf16 weights, float32 gradients, master and moments (18 bytes/parameter); "
                        "bf16-grads: bf16 gradients (16, ZeRO's count); fp32 (16)")
    g.add_argument("--kernels", choices=memory.KERNELS, default="fused",
                   help="fused (FlashAttention, fused norms and SwiGLU), unfused (attention keeps its scores), "
                        "book (the book's own block)")
    g.add_argument("--no-sequence-parallel", action="store_true", help="tensor parallelism without sequence parallelism")
    g.add_argument("--fsdp-reshard-after-forward", choices=memory.FSDP_RESHARD, default="default",
                   help="under FSDP, free a block's gathered weights after its forward: always, never, or default "
                        "(torchtitan's: yes without a pipeline, no inside one)")
    g.add_argument("--stage-io", choices=memory.STAGE_IO, default="torch",
                   help="the pipeline's runtime. torch: torch's PipelineStage keeps a receive buffer per microbatch "
                        "and each stage's output until its backward, and its split backward (the zero-bubble and "
                        "V schedules) refuses selective checkpointing and recomputes a fully checkpointed block once "
                        "per parameter group; freed: a runtime that frees them once used and does neither "
                        "(Megatron-LM, DeepSpeed)")
    g.add_argument("--overlap-f-b", action="store_true",
                   help="the runtime registers a function for DualPipeV's OVERLAP_F_B actions, hiding each "
                        "pair's all-to-all under computation (torch and torchtitan 0.3.0 register none: the pair's "
                        "halves run one after the other)")
    g.add_argument("--headroom", type=float, default=0.1, help="fraction of each GPU kept free")
    g.add_argument("--precision", choices=PRECISION_FLAGS, default="bf16",
                   help="the blocks' matrix products: bf16, or FP8 with --fp8-recipe (the embedding, head, router, "
                        "norms, attention's softmax products and all communication stay bf16)")
    g.add_argument("--fp8-recipe", choices=FP8_RECIPES, default=None,
                   help="with --precision fp8: per-tensor current (the default) or delayed scaling, blockwise "
                        "(DeepSeek-V3's 1x128 and 128x128 blocks; Hopper), or mxfp8 (Blackwell)")
    g.add_argument("--optimizer", choices=list(memory.OPTIMIZER_STATE), default="adamw",
                   help="its state per parameter: adamw two float32 moments, adamw-bf16 two bf16 moments, muon and "
                        "sgd one momentum buffer, adafactor factored second moments")
    g.add_argument("--dispatcher", choices=list(search.DISPATCHERS), default="alltoall",
                   help="mixture of experts: one all-to-all sends every routed copy (alltoall), or DeepEP sends a "
                        "token once to each other node its experts are on (deepep)")
    g.add_argument("--moe-imbalance", type=float, default=1.0,
                   help="mixture of experts: tokens the busiest expert-parallel rank receives over the mean (1: "
                        "balanced, as published benchmarks force it)")
    g.add_argument("--capacity-factor", type=float, default=0.0,
                   help="mixture of experts: 0 dropless, else each expert takes at most this times its share "
                        "(tokens beyond it dropped), which caps --moe-imbalance")
    g.add_argument("--framework", choices=calibration.FRAMEWORKS, default=calibration.DEFAULT_FRAMEWORK,
                   help="what you will run: its published runs on your GPU's generation calibrate the times printed "
                        "(default torchtitan, whose runtime the planner's defaults model); the search is the same")
    g = p.add_argument_group("what to search (default: everything)")
    g.add_argument("--tp", type=int, nargs="+", default=None, help="tensor-parallel sizes to try")
    g.add_argument("--pp", type=int, nargs="+", default=None, help="pipeline sizes to try (default: every one up to --max-p)")
    g.add_argument("--ep", type=int, nargs="+", default=None,
                   help="expert-parallel sizes to try, for a mixture of experts (default: every one dividing the "
                        "experts whose ep x etp divides tp x cp x dp: Megatron-Core's MoE parallel folding)")
    g.add_argument("--etp", type=int, nargs="+", default=None,
                   help="expert-tensor-parallel sizes to try: each expert split over etp GPUs (default: 1 and the "
                        "layout's tp); ep x etp folds over tp x cp x dp, so ep may exceed dp")
    g.add_argument("--max-p", type=int, default=32, help="largest pipeline size tried")
    g.add_argument("--max-v", type=int, default=4, help="most stages per rank of the looped schedules")
    g.add_argument("--v", type=int, nargs="+", default=None,
                   help="pin the stages per rank: the looped schedules try only these (beyond --max-v), the "
                        "V-shaped ones need 2 among them, the others 1")
    g.add_argument("--dp", type=int, nargs="+", default=None, help="pin the data-parallel sizes tried")
    g.add_argument("--cp", type=int, nargs="+", default=None,
                   help="context-parallel sizes to try: each sequence split over cp GPUs, world = tp x cp x pp x dp "
                        "(default: 1, none; searched only where given)")
    g.add_argument("--microbatch-sizes", type=int, nargs="+", default=None)
    g.add_argument("--max-microbatch-size", type=int, default=8)
    g.add_argument("--schedules", nargs="+", default=list(schedules.TORCH_SCHEDULES))
    g.add_argument("--sharding", nargs="+", default=list(memory.SHARDING))
    g.add_argument("--recompute", nargs="+", default=list(memory.RECOMPUTE))
    g.add_argument("--balance", nargs="+", default=list(search.BALANCES),
                   help="even layers per stage, or ends: the first and last stages give up layers for the "
                        "embedding and the head")
    g.add_argument("--estimate-costs", action="store_true",
                   help="estimate every action from FLOPs, even where the book's H100 measurements match")
    g = p.add_argument_group("output")
    g.add_argument("--top", type=int, default=10, help="rows of the ranked table")
    g.add_argument("--why", action="store_true", help="say why the other layouts were dropped")
    g.add_argument("--layout", default=None,
                   help='explain one layout, e.g. "tp=8 pp=8 dp=1 schedule=1F1B v=1 b=1 sharding=zero1 '
                        'recompute=full balance=even"')
    g.add_argument("--export", choices=["torchtitan", "megatron"], default=None,
                   help="write the winner (or the fastest layout the framework runs) as a torchtitan 0.3.0 job or "
                        "Megatron-LM arguments")
    g.add_argument("--json", default=None, help="write the request and every outcome to this path")
    return p.parse_args(argv)


def _finite(name: str, value: float | None, low: float = 0.0, inclusive: bool = False) -> None:
    if value is None:
        return
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value}")
    if value < low or (value == low and not inclusive):
        raise ValueError(f"{name} must be {'at least' if inclusive else 'more than'} {low:g}, got {value:g}")


def request_from(args: argparse.Namespace) -> search.Request:
    """The planner's request, or a ``ValueError`` naming the first thing wrong and its fix."""
    for name in ("gpus", "gpus_per_node", "global_batch", "seq_len", "max_p", "max_v", "max_microbatch_size", "top"):
        _finite(f"--{name.replace('_', '-')}", getattr(args, name), 1, inclusive=True)
    for name in ("gpu_memory", "gpu_tflops", "gpu_bandwidth", "intra_bandwidth", "inter_bandwidth"):
        _finite(f"--{name.replace('_', '-')}", getattr(args, name))
    for name in ("intra_latency", "inter_latency"):
        _finite(f"--{name.replace('_', '-')}", getattr(args, name), 0.0, inclusive=True)
    if not math.isfinite(args.headroom) or not 0 <= args.headroom < 1:
        raise ValueError(f"--headroom is the fraction of each GPU kept free, in [0, 1); got {args.headroom}")
    if args.model == "custom":
        missing = [f for f in ("hidden", "layers", "heads", "ffn", "vocab") if getattr(args, f.replace("-", "_")) is None]
        if missing:
            raise ValueError(f"--model custom needs --{' --'.join(missing)} (and --kv-heads, default --heads)")
        for f in ("hidden", "layers", "heads", "kv_heads", "ffn", "vocab"):
            _finite(f"--{f.replace('_', '-')}", getattr(args, f), 1, inclusive=True)
        model = shapes.custom("custom", args.vocab, args.hidden, args.layers, args.heads,
                              args.kv_heads or args.heads, args.ffn)
    else:
        model = shapes.load(args.model)
    if args.gpu == "custom":
        if None in (args.gpu_memory, args.gpu_tflops, args.gpu_bandwidth):
            raise ValueError("--gpu custom needs --gpu-memory, --gpu-tflops and --gpu-bandwidth")
        gpu = hardware.custom_gpu(args.gpu_memory, args.gpu_tflops, args.gpu_bandwidth)
    else:
        gpu = hardware.gpu(args.gpu)
        overrides = {k: v for k, v in (("memory_gb", args.gpu_memory), ("bf16_tflops", args.gpu_tflops),
                                        ("hbm_tb_s", args.gpu_bandwidth)) if v is not None}
        if overrides:
            gpu = replace(gpu, name=gpu.name + " (modified)", **overrides)
    links = {}
    for side, default in (("intra", args.intra or gpu.nvlink), ("inter", args.inter or gpu.network)):
        base = hardware.link(default)
        bw, lat = getattr(args, f"{side}_bandwidth"), getattr(args, f"{side}_latency")
        links[side] = base if bw is None and lat is None else hardware.custom_link(
            f"{side} (given)", bw if bw is not None else base.bandwidth / 1e9, lat if lat is not None else base.latency * 1e6)
    if args.gpus > args.gpus_per_node and args.gpus % args.gpus_per_node:
        raise ValueError(f"--gpus {args.gpus} is not a whole number of nodes of {args.gpus_per_node}; use a multiple "
                         f"of {args.gpus_per_node} (or set --gpus-per-node)")
    for flag, values, allowed in (("--schedules", args.schedules, schedules.TORCH_SCHEDULES),
                                  ("--sharding", args.sharding, memory.SHARDING),
                                  ("--recompute", args.recompute, memory.RECOMPUTE),
                                  ("--balance", args.balance, search.BALANCES)):
        bad = [x for x in values if x not in allowed]
        if bad:
            raise ValueError(f"{flag}: unknown {', '.join(map(repr, bad))}; use some of {', '.join(allowed)}")
    for flag, values in (("--tp", args.tp or []), ("--pp", args.pp or []), ("--ep", args.ep or []), ("--etp", args.etp or []),
                         ("--v", args.v or []), ("--dp", args.dp or []), ("--cp", args.cp or []),
                         ("--microbatch-sizes", args.microbatch_sizes or [])):
        for x in values:
            _finite(flag, x, 1, inclusive=True)
    req = search.Request(model, gpu, args.gpus, args.gpus_per_node, args.global_batch, args.seq_len,
                         links["intra"], links["inter"], recipe=args.recipe, kernels=args.kernels,
                         sequence_parallel=not args.no_sequence_parallel, headroom=args.headroom,
                         tps=tuple(args.tp or ()), pps=tuple(args.pp or ()), eps=tuple(args.ep or ()),
                         max_p=max(args.max_p, *(args.pp or [1])), max_v=args.max_v,
                         vs=tuple(args.v or ()), dps=tuple(args.dp or ()), cps=tuple(args.cp or ()),
                         max_microbatch_size=args.max_microbatch_size, microbatch_sizes=tuple(args.microbatch_sizes or ()),
                         schedules=tuple(args.schedules), shardings=tuple(args.sharding),
                         recomputes=tuple(args.recompute), balances=tuple(args.balance),
                         measured_costs=not args.estimate_costs, fsdp_reshard=args.fsdp_reshard_after_forward,
                         stage_io=args.stage_io, overlap_f_b=args.overlap_f_b, framework=args.framework,
                         **moe_fp8_options(args))
    if args.tp and not search.tensor_parallel_sizes(req):
        raise ValueError(f"no --tp of {args.tp} divides the {args.gpus} GPUs, the {model.heads} heads, the "
                         f"{model.kv_heads} key/value heads and the MLP width {model.ffn} within a node of "
                         f"{args.gpus_per_node}; try --tp 1 2 4 8")
    if args.ep and not model.moe and args.ep != [1]:
        raise ValueError(f"--ep: {model.name} has no experts; expert parallelism needs a mixture of experts")
    if args.ep and model.moe and not any(model.experts % e == 0 for e in args.ep):
        raise ValueError(f"--ep: none of {args.ep} divides the {model.experts} experts")
    problem = search.request_problem(req)
    if problem:
        raise ValueError(problem)
    if (args.v or args.dp) and not search.candidates(req):
        raise ValueError(f"no layout has {'v in ' + str(args.v) if args.v else ''}{' and ' if args.v and args.dp else ''}"
                         f"{'dp in ' + str(args.dp) if args.dp else ''} (dp = --gpus / (tp x pp) must divide "
                         f"--global-batch; v 1 is no pipeline or GPipe/1F1B, 2 the V-shaped schedules); "
                         "pin other values or leave --v and --dp out")
    return req


# --- mixtures of experts, FP8, other optimizers (issue 52) --------------------------------------------------------

PRECISION_FLAGS = ("bf16", "fp8")
FP8_RECIPES = ("current", "delayed", "blockwise", "mxfp8")


def precision_name(precision: str, recipe: str) -> str:
    """The planner's precision (:data:`ppbook.planner.memory.PRECISIONS`) for ``--precision`` and
    ``--fp8-recipe``: ``bf16``, ``fp8-current``, ``fp8-delayed``, ``fp8-blockwise`` or ``mxfp8``."""
    if precision == "bf16":
        return "bf16"
    recipe = recipe or "current"
    return "mxfp8" if recipe == "mxfp8" else f"fp8-{recipe}"


def moe_fp8_options(args: argparse.Namespace) -> dict:
    """The request's fields from the flags of issue 52 (precision, optimizer, experts), checked."""
    for name in ("moe_imbalance", "capacity_factor"):
        _finite(f"--{name.replace('_', '-')}", getattr(args, name), 0.0, inclusive=True)
    if args.fp8_recipe and args.precision != "fp8":
        raise ValueError(f"--fp8-recipe {args.fp8_recipe} is an FP8 recipe: add --precision fp8")
    if args.moe_imbalance < 1:
        raise ValueError(f"--moe-imbalance is the busiest expert-parallel rank's tokens over the mean, at least 1; "
                         f"got {args.moe_imbalance:g}")
    return {"precision": precision_name(args.precision, args.fp8_recipe), "optimizer": args.optimizer,
            "dispatcher": args.dispatcher, "moe_imbalance": args.moe_imbalance, "capacity_factor": args.capacity_factor,
            "etps": tuple(args.etp or ())}


def expert_layout_problem(tp: int, cp: int, dp: int, ep: int, etp: int, req: search.Request) -> str | None:
    """Why experts cannot be laid out ``ep x etp`` over a dense part of ``tp x cp x dp`` GPUs
    (:func:`ppbook.planner.search.expert_layouts`); ``None`` if they can. ``ep`` larger than ``dp`` is
    no problem: it folds over the tensor- and context-parallel GPUs too."""
    if not req.model.moe or (ep == 1 and etp == 1):
        return None
    if min(ep, etp) < 1 or req.model.experts % ep:
        return f"ep {ep} must divide the model's {req.model.experts} experts"
    if (tp * cp * dp) % (ep * etp):
        return (f"ep {ep} x etp {etp} = {ep * etp} must divide tp {tp} x cp {cp} x dp {dp} = {tp * cp * dp}, the GPUs "
                "of a pipeline stage the experts fold over (Megatron-Core's MoE parallel folding)")
    if req.model.expert_ffn % etp or etp > req.gpus_per_node:
        return f"etp {etp} must divide the experts' width {req.model.expert_ffn} and fit in a node of {req.gpus_per_node}"
    return None


def experts_problem(layout: search.Layout, kind: str) -> str | None:
    """Why framework ``kind`` cannot lay out ``layout``'s experts; ``None`` if it can. Megatron-Core
    folds any ``ep x etp`` over ``tp x cp x dp``; torchtitan 0.3.0 borrows ``ep`` from
    ``dp_shard x cp x tp`` only (``ParallelDims``: its replicated data parallelism stays outside) and
    has no expert tensor parallelism: its experts are split over the tensor-parallel GPUs when
    ``ep`` is 1 and not at all when ``ep > 1``."""
    if kind != "torchtitan" or (layout.ep == 1 and layout.etp == 1):
        return None
    if layout.ep > 1 and layout.etp > 1:
        return f"torchtitan 0.3.0 has no expert tensor parallelism beside expert parallelism (etp {layout.etp}): use etp 1"
    if layout.ep == 1 and layout.etp not in (1, layout.tp):
        return f"torchtitan 0.3.0 splits the experts over all tp {layout.tp} GPUs or none (etp {layout.etp})"
    shard = layout.dp if layout.sharding == "fsdp" else 1
    if (shard * layout.cp * layout.tp) % layout.ep:
        return (f"torchtitan 0.3.0 borrows ep {layout.ep} from dp_shard x cp x tp = {shard * layout.cp * layout.tp} "
                "(its replicated data parallelism stays outside): use sharding fsdp or a smaller ep")
    return None


def not_modelled(args: argparse.Namespace, req: search.Request) -> list[str]:
    """One line for each part of the request the planner counts in its own way or does not time:
    an optimizer other than Adam, an FP8 recipe (what runs in FP8, its measured speed-up, what stays
    bf16, what it keeps in memory), a mixture of experts' routing, and the layers of a Hugging Face
    config the planner cannot time (:func:`ppbook.planner.shapes.unmodelled_layers`)."""
    lines = []
    if req.optimizer != "adamw":
        state, what = memory.OPTIMIZER_STATE[req.optimizer]
        lines.append(f"optimizer {req.optimizer}: {state} bytes of state a parameter beside the float32 master, {what}")
    if req.precision != "bf16":
        p = memory.PRECISIONS[req.precision]
        f, i, w = search.costs.fp8_speedup(req.precision, req.gpu.name)
        lines.append(f"precision {req.precision}: {p.about}; the blocks' linear layers run their F, I and W products "
                     f"{f:.2f}, {i:.2f} and {w:.2f} times faster than bf16 ({search.costs.FP8_SOURCE}); in bf16: "
                     f"{', '.join(memory.BF16_PARTS)}; memory: FP8 copies of the weights ({p.weight_copy_bytes:.2f} "
                     f"bytes a parameter) beside the bf16 weights and float32 masters, linear layers' inputs kept for "
                     f"the backward in FP8 ({p.saved_input_bytes:.2f} bytes)" + (
                         f", a {p.amax_history}-step history of maxima per FP8 tensor" if p.amax_history else ""))
    if req.model.moe:
        load = search.expert_load(req)
        lines.append(f"mixture of experts: experts laid out over tp x cp x dp (ep up to it, etp apart: Megatron-Core's "
                     f"folding); the busiest expert-parallel rank receives {load:g} times the mean "
                     f"({'balanced' if load == 1 else 'from --moe-imbalance/--capacity-factor'}); dispatcher "
                     f"{req.dispatcher}; node-limited routing, FP8 dispatch and Megatron's 1F1B all-to-all overlap are "
                     "not modelled")
    config = shapes.config_of(args.model)
    if config is not None:
        lines += shapes.unmodelled_layers(config, req.seq_len, Path(args.model).name)
    return lines


class LayoutProblem(ValueError):
    """A well-formed ``--layout`` that cannot run on this request (the batch does not split into it,
    or its schedule refuses its microbatches): reported after the rest of the answer."""


def parse_layout(text: str, req: search.Request) -> search.Layout:
    """A layout from ``key=value`` words (tp, cp, pp, dp, ep, schedule, v, b, m, sharding, recompute,
    balance); what is left out is taken from the request (dp and m from the GPUs and the batch)."""
    fields = {}
    for word in text.replace(",", " ").split():
        if "=" not in word:
            raise ValueError(f"--layout: {word!r} is not key=value (e.g. tp=8 pp=4 schedule=1F1B)")
        k, v = word.split("=", 1)
        fields[k.strip()] = v.strip()
    known = {"tp", "cp", "pp", "dp", "ep", "etp", "schedule", "v", "b", "m", "sharding", "recompute", "balance"}
    unknown = set(fields) - known
    if unknown:
        raise ValueError(f"--layout: unknown key {sorted(unknown)[0]!r}; use {', '.join(sorted(known))}")
    try:
        tp, pp, cp = int(fields.get("tp", 1)), int(fields.get("pp", 1)), int(fields.get("cp", 1))
        b, ep, etp = int(fields.get("b", 1)), int(fields.get("ep", 1)), int(fields.get("etp", 1))
        v = int(fields["v"]) if "v" in fields else None
    except ValueError as e:
        raise ValueError(f"--layout: tp, cp, pp, dp, ep, etp, v, b and m are whole numbers ({e})") from None
    if min(tp, pp, cp, b) < 1 or req.gpus % (tp * cp * pp):
        raise ValueError(f"--layout: tp {tp} x cp {cp} x pp {pp} must divide the {req.gpus} GPUs (and each be at "
                         "least 1)")
    dp = int(fields.get("dp", req.gpus // (tp * cp * pp)))
    if tp * cp * pp * dp != req.gpus:
        raise ValueError(f"--layout: tp {tp} x cp {cp} x pp {pp} x dp {dp} = {tp * cp * pp * dp}, not the {req.gpus} "
                         "GPUs")
    if req.global_batch % (dp * b):
        raise LayoutProblem(f"--layout: the global batch {req.global_batch} does not split into dp {dp} x b {b}; "
                            f"use a b that divides {req.global_batch // math.gcd(req.global_batch, dp)} "
                            f"or a --global-batch that is a multiple of {dp * b}")
    m = int(fields.get("m", req.global_batch // (dp * b)))
    if dp * b * m != req.global_batch:
        raise LayoutProblem(f"--layout: dp {dp} x b {b} x m {m} = {dp * b * m}, not the global batch "
                            f"{req.global_batch}; leave m out (it follows from the batch)")
    schedule = fields.get("schedule", search.NO_PIPELINE if pp == 1 else "1F1B")
    if pp == 1:
        schedule = search.NO_PIPELINE
    elif schedule not in schedules.TORCH_SCHEDULES:
        raise ValueError(f"--layout: unknown schedule {schedule!r}; use one of {', '.join(schedules.TORCH_SCHEDULES)}")
    if v is None:
        v = 1 if pp == 1 else {"single": 1, "loop": 2, "v": 2}[schedules.placement(schedule)]
    sharding, recompute = fields.get("sharding", "none"), fields.get("recompute", "none")
    balance = fields.get("balance", "even")
    for name, value, allowed in (("sharding", sharding, memory.SHARDING), ("recompute", recompute, memory.RECOMPUTE),
                                 ("balance", balance, search.BALANCES)):
        if value not in allowed:
            raise ValueError(f"--layout: {name}={value!r}; use one of {', '.join(allowed)}")
    if (ep > 1 or etp > 1) and not req.model.moe:
        raise ValueError(f"--layout: ep {ep} must divide dp {dp} and the model's experts (none: a dense model)")
    layout_problem = expert_layout_problem(tp, cp, dp, ep, etp, req)
    if layout_problem:
        raise ValueError(f"--layout: {layout_problem}")
    layout = search.Layout(tp, pp, dp, schedule, v, b, m, sharding, recompute, balance, max(1, ep), cp, max(1, etp))
    problem = search.constraint_problem(layout, req)
    if problem:
        raise LayoutProblem(f"--layout: {problem}")
    return layout


# --- what it prints ------------------------------------------------------------------------------------------

def assumptions(args: argparse.Namespace, req: search.Request) -> list[str]:
    """What the request leaves to the planner that it should say it assumed: the links of a GPU
    given by its numbers (``--gpu custom``)."""
    lines = []
    if args.gpu == "custom":
        for side, flag, link in (("within a node", "--intra", req.intra), ("between nodes", "--inter", req.inter)):
            if getattr(args, flag[2:]) is None and getattr(args, f"{flag[2:]}_bandwidth") is None:
                lines.append(f"--gpu custom: assuming {link.name} {side} ({link.bandwidth / 1e9:.0f} GB/s each way, "
                             f"{link.latency * 1e6:.0f} us); give {flag} or {flag}-bandwidth and {flag}-latency for yours")
    return lines


def header(req: search.Request, ranked: list[search.Prediction] | None = None) -> list[str]:
    """What was asked, and where the action times come from: for the ``ranked`` layouts where
    given (a time is measured only for a block and head the book measured at that microbatch
    size), otherwise for one sequence per microbatch."""
    m = req.model
    params = shapes.total_parameters(m)
    active = shapes.active_parameters(m)
    if ranked:
        estimated = sum(o.estimated for o in ranked)
    else:
        estimated = int(not (req.measured_costs and req.gpu.name in search.costs.MEASURED and
                             search.costs.layer_costs(m, req.gpu, 1, req.seq_len, False).measured and
                             search.costs.head_costs(m, req.gpu, 1, req.seq_len).measured))
    estimate = ("estimated from FLOPs at the efficiency the book measured on an H100 and an H200 "
                "(ppbook.planner.costs), scaled to this GPU's peak: " + efficiencies(req))
    source = search.costs.MEASURED.get(req.gpu.name)
    measured = (f"measured on {search.costs.MEASURED_ON[req.gpu.name]} "
                f"({source.relative_to(search.costs.GPU_DATA.parents[1]).as_posix()})") if source else ""
    if not estimated:
        times = measured
    elif ranked and estimated < len(ranked):
        winner = "the winner among them" if ranked[0].estimated else "not the winner"
        times = (f"{measured} where the book measured the block and "
                 f"head at the layout's microbatch size; for {estimated} of the {len(ranked)} ranked layouts "
                 f"({winner}) " + estimate)
    else:
        times = estimate
    lines = [f"model {m.name}: {params / 1e9:.2f}B parameters" + (f" ({active / 1e9:.1f}B active)" if m.moe else "")
             + f", {m.layers} layers, hidden {m.hidden}",
             f"{req.gpus} x {req.gpu.name} ({req.gpu.memory_gb:.1f} GB, {req.gpu.bf16_tflops:g} TFLOP/s bf16), "
             f"{req.gpus_per_node} per node; links {req.intra.name} / {req.inter.name}",
             f"batch {req.global_batch} x {req.seq_len} tokens; usable memory {req.usable_bytes / GB:.1f} GB per GPU",
             "times printed: " + _band(req).describe(),
             *calibration.cautions(req.gpu.name, req.framework),
             "action times: " + times]
    return lines


def efficiencies(req: search.Request) -> str:
    """The fractions of the GPU's peak the estimated passes are timed at, for this model's width
    and a microbatch of one sequence (larger microbatches reach a little more)."""
    e = search.costs.pass_efficiencies(req.model, 1, req.seq_len)
    layer = ", ".join(f"{k} {100 * e[k]:.0f}%" for k in ("F", "I", "W"))
    head = ", ".join(f"{k} {100 * e['head_' + k]:.0f}%" for k in ("F", "I", "W"))
    return (f"a layer's {layer}, the head's {head} of {req.gpu.bf16_tflops:g} TFLOP/s "
            f"(hidden size {req.model.hidden}, one sequence of {req.seq_len} tokens per microbatch; "
            "fitted in log2(h / 4096) and the microbatch's tokens)")


def _band(req: search.Request | None) -> calibration.Band:
    """The band a request's times carry (the family of its GPU and framework; every run's without a request)."""
    if req is None:
        return calibration.band_for("", calibration.DEFAULT_FRAMEWORK)
    return calibration.band_for(req.gpu.name, req.framework)


def _sig(x: float, digits: int = 2) -> str:
    """``x`` to ``digits`` significant figures (at least the units), for times whose band is wide."""
    if x == 0 or not math.isfinite(x):
        return f"{x:g}"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(x))))
    return f"{round(x, decimals):.{decimals}f}"


def step_text(step_s: float, band: calibration.Band) -> str:
    """A predicted step time, calibrated, with its band: '69 s per step (58 to 84 s)'."""
    centre, short, long = band.step(step_s)
    return f"{_sig(centre)} s per step ({_sig(short)} to {_sig(long)} s)"


def throughput_text(pred: search.Prediction, band: calibration.Band) -> str:
    """Tokens per second per GPU and MFU, calibrated, with their band."""
    centre, low, high = band.throughput(pred.tokens_per_s_per_gpu)
    mfu = pred.mfu / band.factor
    return (f"{_sig(centre)} tokens/s per GPU ({_sig(low)} to {_sig(high)}), "
            f"{100 * mfu:.0f}% MFU ({100 * mfu * low / centre:.0f} to {100 * mfu * high / centre:.0f}%)")


def table(ranked: list[search.Prediction], top: int, req: search.Request | None = None) -> list[str]:
    """The ranked layouts; step time, throughput and MFU calibrated (:mod:`ppbook.planner.calibration`),
    each step time with its band; ``*`` marks the layouts tied with the winner (:func:`tie`), and
    ``passes`` says whether a layout's pass times were measured or estimated from FLOPs."""
    band = _band(req)
    tied = len(tie(ranked, req))
    experts = any(o.layout.ep > 1 for o in ranked[:top])  # an ep column only where expert parallelism is used
    context = any(o.layout.cp > 1 for o in ranked[:top])  # a cp column only where context parallelism is used
    split = any(o.layout.etp > 1 for o in ranked[:top])   # an etp column only where experts are split
    rows = [f"{'':>4} {'tp':>2} " + (f"{'cp':>2} " if context else "") + f"{'pp':>3} {'v':>2} {'dp':>4} " +
            (f"{'ep':>3} " if experts else "") + (f"{'etp':>3} " if split else "") +
            f"{'sharding':>8} {'schedule':>21} {'balance':>7} {'b':>2} {'m':>5} "
            f"{'recompute':>9} {'step s':>7} {'band s':>11} {'tok/s/GPU':>9} {'MFU':>5} {'bubble':>6} {'GB/GPU':>6} "
            f"{'passes':>9}"]
    for i, o in enumerate(ranked[:top], 1):
        c = o.layout
        centre, short, long = band.step(o.step_s)
        tps = band.throughput(o.tokens_per_s_per_gpu)[0]
        mark = "*" if i <= tied and tied > 1 else " "
        rows.append(f"{i:>3}{mark} {c.tp:>2} " + (f"{c.cp:>2} " if context else "") + f"{c.p:>3} {c.v:>2} {c.dp:>4} " +
                    (f"{c.ep:>3} " if experts else "") + (f"{c.etp:>3} " if split else "") +
                    f"{c.sharding:>8} {c.schedule:>21} {c.balance if c.p > 1 else '':>7} {c.b:>2} "
                    f"{c.m:>5} {c.recompute:>9} {_sig(centre, 3):>7} {_sig(short) + '-' + _sig(long):>11} "
                    f"{tps:>9.0f} {100 * o.mfu / band.factor:>4.0f}% {bubble_text(o):>6} {o.peak_gb:>6.1f} "
                    f"{'estimated' if o.estimated else 'measured':>9}")
    if tied > 1:
        rows.append(f"* tied: {tied} layouts are predicted within the winner's band"
                    + (f" (the first {min(top, tied)} shown)" if tied > top else ""))
    return rows


def bubble_text(pred: search.Prediction) -> str:
    """The bubble as printed: '-' for a layout without a pipeline, which has none."""
    return "-" if pred.layout.p == 1 else f"{100 * pred.bubble:.1f}%"


def tie_slack(req: search.Request | None) -> float:
    """How far above the winner's step time a layout still ties with it: the top of the band
    (at least the search's own slack). Search with it (``search.plan(req, slack=tie_slack(req))``)
    to rank every tied layout."""
    return max(search.SLACK, _band(req).high)


def tie(ranked: list[search.Prediction], req: search.Request | None = None) -> list[search.Prediction]:
    """The layouts tied with the winner: those whose predicted time lies within the winner's band
    (``band.step``): the planner cannot tell them apart. The winner alone when nothing else is."""
    if not ranked:
        return []
    top = ranked[0].step_s * (1 + max(0.0, _band(req).high))
    return [o for o in ranked if o.step_s <= top]


def simplicity(layout: search.Layout) -> tuple:
    """What makes a layout simpler to run, most important first: fewer kinds of parallelism beyond
    data parallelism (a pipeline, context, experts, tensor), then fewer pipeline stages, a smaller
    tensor-parallel group, no recomputation, less sharding machinery."""
    kinds = (layout.p > 1) + (layout.cp > 1) + (layout.ep > 1) + (layout.tp > 1)
    return (kinds, layout.num_stages, layout.tp, layout.cp, memory.RECOMPUTE.index(layout.recompute)
            if layout.recompute in memory.RECOMPUTE else 9, memory.SHARDING.index(layout.sharding))


def roomiest(tied: list[search.Prediction]) -> search.Prediction:
    return min(tied, key=lambda o: (o.peak_bytes, o.step_s))


def simplest(tied: list[search.Prediction]) -> search.Prediction:
    return min(tied, key=lambda o: (simplicity(o.layout), o.step_s))


def comfortable(ranked: list[search.Prediction], req: search.Request) -> search.Prediction | None:
    """A layout whose fullest GPU leaves at least :data:`calibration.THIN_MARGIN` of the usable
    memory free: the roomiest of the tie where it has room, else the fastest ranked one, else the
    fastest found when searched again with that much more headroom."""
    tied = [o for o in tie(ranked, req) if not calibration.thin(o.peak_bytes, req.usable_bytes)]
    if tied:
        return roomiest(tied)
    for o in ranked:
        if not calibration.thin(o.peak_bytes, req.usable_bytes):
            return o
    roomy = replace(req, headroom=1 - (1 - req.headroom) * (1 - calibration.THIN_MARGIN))
    found = search.plan(roomy)[0]
    return search.predict(found[0].layout, req) if found else None


def free_pct(pred: search.Prediction, req: search.Request) -> float:
    return 100 * (1 - pred.peak_bytes / req.usable_bytes)


def margin_text(ranked: list[search.Prediction], req: search.Request) -> str | None:
    """A sentence when the winner's margin is thin, naming a layout with a comfortable one (the
    roomiest tied layout where the tie has one: :func:`comfortable`)."""
    if not ranked or not calibration.thin(ranked[0].peak_bytes, req.usable_bytes):
        return None
    win = ranked[0]
    text = (f"thin margin: the winner leaves {free_pct(win, req):.1f}% of the usable memory free, under the "
            f"{100 * calibration.THIN_MARGIN:.0f}% the planner's memory model needs to be trusted with")
    roomy = comfortable(ranked, req)
    if roomy is None:
        return text + "; no layout leaves more"
    which = "the roomiest tied layout" if any(o is roomy for o in tie(ranked, req)) else \
        "the fastest layout with a comfortable margin"
    return (text + f"; {which} is {roomy.layout.label()}, {roomy.peak_gb:.1f} GB ({free_pct(roomy, req):.0f}% free), "
            f"{100 * (roomy.step_s / win.step_s - 1):.1f}% longer")


def breakdown(pred: search.Prediction, req: search.Request) -> list[str]:
    """Every pipeline rank's memory by kind, in GB (one tensor-parallel group's GPUs hold the same)."""
    rows = [f"  {'rank':>4} {'stages':>10} {'params':>7} {'grads':>7} {'optim':>7} {'activ':>7} {'logits':>7} "
            f"{'buffers':>7} {'total':>7} of {req.usable_bytes / GB:.1f} usable"]
    ranks = pred.memory if len(pred.memory) <= 8 else pred.memory[:4] + pred.memory[-4:]
    for r in ranks:
        stages_text = ",".join(map(str, r.stages)) if len(r.stages) <= 3 else f"{r.stages[0]},...,{r.stages[-1]}"
        rows.append(f"  {r.rank:>4} {stages_text:>10} {r.parameters / GB:>7.1f} {r.gradients / GB:>7.1f} "
                    f"{r.optimizer / GB:>7.1f} {r.activations / GB:>7.1f} {r.logits / GB:>7.1f} {r.buffers / GB:>7.1f} "
                    f"{r.total / GB:>7.1f}")
    if len(pred.memory) > 8:
        rows.insert(5, "   ...")
    return rows


def passes_text(pred: search.Prediction) -> str:
    return "pass times estimated from FLOPs" if pred.estimated else "pass times measured on this GPU"


def tie_text(ranked: list[search.Prediction], req: search.Request | None = None) -> str | None:
    """The answer's first line where the winner ties: how many layouts lie within its band, and the
    roomiest and the simplest of them (``None`` when nothing ties)."""
    tied = tie(ranked, req)
    if len(tied) < 2:
        return None
    band, win = _band(req), ranked[0]
    _, short, long = band.step(win.step_s)
    parts = [f"a tie: {len(tied)} layouts are predicted within the winner's band ({_sig(short)} to {_sig(long)} s), "
             "so the planner cannot rank them"]
    for name, o in (("the roomiest", roomiest(tied)), ("the simplest", simplest(tied))):
        room = (f", {o.peak_gb:.1f} GB on its fullest GPU ({free_pct(o, req):.0f}% free)" if req is not None
                else f", {o.peak_gb:.1f} GB on its fullest GPU")
        longer = "the winner itself" if o is win else f"{100 * (o.step_s / win.step_s - 1):.1f}% longer"
        parts.append(f"{name} is {o.layout.label()}{room if name == 'the roomiest' else ''}, {longer}")
    return "; ".join(parts) + "."


def why_winner(ranked: list[search.Prediction], req: search.Request | None = None) -> str:
    """The answer: where the winner ties, a first line saying so (:func:`tie_text`); then the winner
    (its time and throughput calibrated, with their band, and whether its pass times were measured),
    and how much longer the runner-up and the best of another kind take; with ``req``, a last
    sentence when its memory margin is thin (:func:`margin_text`)."""
    if not ranked:
        return "nothing fits: see the closest layout's memory below"
    win, band = ranked[0], _band(req)
    tied = tie_text(ranked, req)
    bubble = "" if win.layout.p == 1 else f", bubble {100 * win.bubble:.1f}%"
    parts = [f"{win.layout.label()} is predicted fastest: {step_text(win.step_s, band)} ({passes_text(win)}), "
             f"{throughput_text(win, band)}{bubble}, {_sig(band.step(win.dp_exposed_s)[0])} s of data-parallel "
             f"traffic not hidden, {win.peak_gb:.1f} GB on the fullest GPU"]
    if len(ranked) > 1:
        r = ranked[1]
        parts.append(f"the runner-up ({r.layout.label()}) takes {100 * (r.step_s / win.step_s - 1):.1f}% longer")
    other = next((o for o in ranked[1:] if (o.layout.p == 1) != (win.layout.p == 1)), None)
    if other is not None:
        kind = "layout without a pipeline" if other.layout.p == 1 else "pipelined layout"
        parts.append(f"the best {kind} ({other.layout.label()}) {100 * (other.step_s / win.step_s - 1):.1f}% longer")
    margin = margin_text(ranked, req) if req is not None else None
    return (f"{tied}\n" if tied else "") + "; ".join(parts) + "." + (f"\n{margin}." if margin else "")


TERMS = ("computation", "recomputation", "bubble and hand-offs", "data-parallel traffic not hidden", "optimizer step")


def step_terms(pred: search.Prediction, req: search.Request) -> dict[str, float]:
    """A predicted step time as the sum of its parts on the GPU that finishes last (the one that
    sets it): its passes without recomputation (tensor parallelism's collectives and the
    all-to-all included), the forwards it runs again, the time it waits inside the pipeline (the
    bubble and the hand-offs), the data-parallel traffic computation does not hide, and the
    optimizer's step. They add up to ``pred.step_s``."""
    layout, c = pred.layout, pred.detail["critical"]
    stages = search._owned(layout, c["rank"])
    with_redo, _ = search._stage_costs(layout, req)
    without, _ = search._stage_costs(replace(layout, recompute="none"), req)
    redo = layout.m * sum(with_redo[(s, k)] - without[(s, k)] for s in stages for k in ("F", "B"))
    return {"computation": c["busy_s"] - redo, "recomputation": redo, "bubble and hand-offs": c["end_s"] - c["busy_s"],
            "data-parallel traffic not hidden": c["dp_exposed_s"], "optimizer step": c["optimizer_s"]}


WHY_TERMS = {"computation": "computation", "recomputation": "recomputation", "bubble and hand-offs": "bubble and hand-offs",
             "data-parallel traffic not hidden": "sharding traffic", "optimizer step": "optimizer"}


def _sum_line(name: str, terms: dict[str, float], k: float) -> str:
    parts = " + ".join(f"{k * terms[t]:.1f} {WHY_TERMS[t]}" for t in TERMS if k * terms[t] >= 0.05 or t == "computation")
    return f"  {name:<12} {parts} = {k * sum(terms.values()):.1f} s"




@dataclass
class PipelinePays:
    """When a pipeline pays, as the planner computes it for one request: the story the introduction,
    chapter 10 and the why-lines tell alike (:func:`pipeline_pays`). A pipeline pays

    - when the model's state does not fit without one (``best_without`` is ``None`` though some
      layout without one splits the batch over the GPUs: ``splits_without``);
    - when the GPUs outnumber what the batch can spread over without one: every replica needs a
      sequence of its own, and a replica without a pipeline is at most the widest tensor- (and
      context-) parallel group: ``most_gpus_without`` = global batch x that width;
    - and otherwise where what it saves (the data-parallel traffic its smaller replicas groups move,
      recomputation its lighter GPUs avoid) outweighs its bubble and hand-offs, which the batch
      decides: at a small batch per GPU, traffic that too little computation hides; at a large one,
      a bubble that stays as the step grows. ``scan`` asks it: the same two layouts (the best of
      each kind here) at other multiples of this global batch (:data:`ppbook.planner.search.MULTIPLES`; their microbatch
      size kept, the microbatches scaled), each step time predicted with whether it fits there
      (:func:`at_batch`), ``None`` where the layout cannot run at that batch.
    """
    req: search.Request
    best_without: search.Prediction | None   # the fastest layout without a pipeline that fits
    best_with: search.Prediction | None      # the fastest pipelined layout that fits
    splits_without: bool                     # some layout without a pipeline splits the batch over the GPUs
    most_gpus_without: int
    scan: list[tuple[float, tuple[float, bool] | None, tuple[float, bool] | None]]  # (multiple, without, with)

    @property
    def fits_without(self) -> bool:
        return self.best_without is not None

    @property
    def pays(self) -> bool:
        """Whether the best pipelined layout is predicted faster than the best without (or is the only one)."""
        if self.best_with is None:
            return False
        return self.best_without is None or self.best_with.step_s < self.best_without.step_s


def at_batch(pred: search.Prediction, req: search.Request, k: float) -> tuple[float, bool] | None:
    """The step time of ``pred``'s layout at ``k`` times this global batch (its microbatch size kept,
    its microbatches scaled), and whether it fits there; ``None`` where they do not scale to whole
    microbatches or the layout cannot run there."""
    m, batch = pred.layout.m * k, req.global_batch * k
    if m < 1 or m != int(m) or batch != int(batch):
        return None
    layout, scaled = replace(pred.layout, m=int(m)), search.with_layout(req, global_batch=int(batch))
    if search.constraint_problem(layout, scaled):
        return None
    out = search.predict(layout, scaled, check_memory=False)
    return out.step_s, out.peak_bytes <= scaled.usable_bytes


def pipeline_pays(req: search.Request, ranked: list[search.Prediction] | None = None) -> PipelinePays:
    """The planner's answer to "does a pipeline pay here, and when would it?" (:class:`PipelinePays`),
    from the best layout of each kind (taken from ``ranked`` where it holds one, else searched)."""
    ranked = ranked or []

    def best(pipelined: bool) -> search.Prediction | None:
        found = next((o for o in ranked if (o.layout.p > 1) == pipelined), None)
        if found is not None:
            return found
        pps = tuple(p for p in range(2, req.max_p + 1) if not req.pps or p in req.pps) if pipelined else (1,)
        return next(iter(search.plan(search.with_layout(req, pps=pps))[0]), None) if pps else None

    without, with_ = best(False), best(True)
    flat = search.with_layout(req, pps=(1,))
    splits = any(search.constraint_problem(c, flat) is None for c in search.candidates(flat))
    widest = max(search.tensor_parallel_sizes(req), default=1) * max(req.cps or (1,))
    scan = [] if without is None or with_ is None else \
        [(k, at_batch(without, req, k), at_batch(with_, req, k)) for k in search.MULTIPLES]
    return PipelinePays(req, without, with_, splits, req.global_batch * widest, scan)


def _multiple(k: float) -> str:
    return f"{k:g}" if k >= 1 else f"1/{round(1 / k)}"


def _ranges(ks: list[float]) -> str:
    """'1/16 to 2 times' from consecutive multiples (of :data:`ppbook.planner.search.MULTIPLES`)."""
    return f"{_multiple(ks[0])}" + (f" to {_multiple(ks[-1])}" if len(ks) > 1 else "") + " times"


def scan_text(pays: PipelinePays) -> str:
    """Where along the batch each kind is predicted faster, from ``pays.scan`` (time alone), and where
    either does not fit: 'the one without at 1/16 to 32 times this batch (the pipelined one does not
    fit from 2 times)'."""
    runs: list[list] = []   # [winner, multiples]
    unfit: dict[str, list[float]] = {"the pipelined one": [], "the one without": []}
    for k, without, with_ in pays.scan:
        if without is None or with_ is None:
            continue
        who = "the pipelined one" if with_[0] < without[0] else "the one without"
        if runs and runs[-1][0] == who:
            runs[-1][1].append(k)
        else:
            runs.append([who, [k]])
        for name, x in (("the one without", without), ("the pipelined one", with_)):
            if not x[1]:
                unfit[name].append(k)
    if not runs:
        return "here neither runs at other batches"
    text = "here the same two layouts at other batches: " + ", ".join(f"{who} faster at {_ranges(ks)}"
                                                                        for who, ks in runs) + " this batch"
    gaps = [f"{name} does not fit at {', '.join(_multiple(k) for k in ks)} times" for name, ks in unfit.items() if ks]
    return text + (f" ({'; '.join(gaps)})" if gaps else "")


def pays_text(pays: PipelinePays) -> str:
    """One line: when a pipeline pays (the state or the batch needs one; otherwise what it saves
    against its bubble, which the batch decides), with this request's numbers."""
    req = pays.req
    if not pays.splits_without:
        state = "not asked here: the batch does not split without one"
    elif pays.fits_without:
        state = f"here it fits: {pays.best_without.peak_gb:.1f} GB on the fullest GPU of the best layout without one"
    else:
        state = "here it does not: the reason a pipeline is needed"
    batch = (f"{req.global_batch} sequences, one replica each at most {pays.most_gpus_without // req.global_batch} GPUs "
             f"wide, the replicas sharing the batch evenly: at most {pays.most_gpus_without} GPUs; here {req.gpus}"
             + ("" if pays.splits_without else ", which the batch does not split over: the reason a pipeline is needed"))
    return (f"  a pipeline pays when the model's state does not fit without one ({state}); when the GPUs outnumber "
            f"what the batch spreads over without one ({batch}); and otherwise where what it saves outweighs its "
            "bubble, which the batch decides: a small batch per GPU leaves data-parallel traffic that too little "
            "computation hides, which a pipeline's fewer replicas cut; a large batch makes the bubble, which does not "
            f"grow with it, a smaller share of the step ({scan_text(pays)})")


def why_lines(ranked: list[search.Prediction], req: search.Request) -> list[str]:
    """Why the winner wins, in two lines of arithmetic against the best layout of the other kind
    (pipelined or not): each step time as its parts on the GPU that finishes last (calibrated
    seconds, :func:`step_terms`), then what the difference comes from and when a pipeline pays
    (:func:`pipeline_pays`); then which runtime the winner needs, and the best layout torchtitan and
    Megatron-LM run."""
    if not ranked:
        return []
    win, k = ranked[0], _band(req).factor
    pays = pipeline_pays(req, ranked)
    other = pays.best_without if win.layout.p > 1 else pays.best_with
    lines = []
    mine = step_terms(win, req)
    if other is not None:
        theirs = step_terms(other, req)
        kind = "no pipeline" if other.layout.p == 1 else "pipelined"
        passes = ("both estimated from FLOPs" if win.estimated and other.estimated else
                  "both measured" if not (win.estimated or other.estimated) else
                  f"the winner's {'estimated' if win.estimated else 'measured'}, the other's "
                  f"{'estimated' if other.estimated else 'measured'}")
        lines += [f"why: seconds per step on the GPU that finishes last (calibrated), the winner against the best "
                  f"{kind} layout ({other.layout.label()}; pass times {passes}):",
                  _sum_line("winner", mine, k), _sum_line(kind, theirs, k)]
        diff = {t: theirs[t] - mine[t] for t in TERMS}
        bubble = diff["bubble and hand-offs"]
        rest = sum(diff.values()) - bubble
        if win.layout.p == 1:
            lines.append(f"  the pipeline {'saves' if rest < 0 else 'spends'} {abs(k * rest):.1f} s "
                         f"{'elsewhere' if rest < 0 else 'more elsewhere'} and loses {k * bubble:.1f} s to its "
                         "bubble and hand-offs")
        else:  # the winner is the pipeline: what the other layout spends beyond it is the pipeline's saving
            saved = {t: diff[t] for t in TERMS if t != "bubble and hand-offs"}
            lines.append(f"  the pipeline loses {-k * bubble:.1f} s to its bubble and hand-offs and saves {k * rest:.1f} s "
                         f"elsewhere, most of it in {WHY_TERMS[max(saved, key=saved.get)]}")
    elif win.layout.p > 1:
        lines.append("why: no layout without a pipeline " + ("fits" if pays.splits_without else
                                                            "splits this batch over the GPUs"))
    else:
        lines.append("why: no pipelined layout fits")
    lines.append(pays_text(pays))
    needs = runtime_needs(win.layout)
    if needs:
        lines.append(f"the winner needs torch 2.13's pipelining runtime ({needs}): torchtitan runs it; Megatron-LM does not")
    for kind, name in (("torchtitan", "torchtitan 0.3.0"), ("megatron", "Megatron-LM")):
        problem = runs_on(win.layout, kind, req)
        if problem is None:
            lines.append(f"{name} runs the winner")
            continue
        best = best_for(ranked, req, kind)
        lines.append(f"{name} cannot run the winner ({problem}); its best: " + (
            f"{best.layout.label()}, {100 * (best.step_s / win.step_s - 1):.1f}% slower" if best else "nothing fits"))
    return lines


def runtime_needs(layout: search.Layout) -> str:
    """What of torch 2.13's pipelining runtime a layout uses that Megatron-LM's has not ('' if nothing)."""
    needs = []
    if layout.schedule in ("DualPipeV", "ZBVZeroBubble", "InterleavedZeroBubble", "LoopedBFS", "GPipe"):
        needs.append(f"Schedule{layout.schedule}")
    if layout.p > 1 and layout.sharding == "fsdp":
        needs.append("FSDP under a pipeline")
    return ", ".join(needs)


def explain(layout: search.Layout, req: search.Request, ranked: list[search.Prediction]) -> list[str]:
    """A named layout: its memory per GPU, its step time part by part beside the winner's, and
    which part makes it slower and which kind of memory keeps it from fitting."""
    pred = search.predict(layout, req, check_memory=False)
    lines = [f"layout {layout.label()}:"]
    fits = pred.peak_bytes <= req.usable_bytes
    worst = max(pred.memory, key=lambda r: r.total)
    kinds = {k: getattr(worst, k) for k in search.MEMORY_KINDS}
    if fits:
        lines.append(f"  fits: {pred.peak_gb:.1f} GB on the fullest GPU (rank {worst.rank})")
    else:
        big = max(kinds, key=kinds.get)
        lines.append(f"  does not fit: rank {worst.rank} needs {worst.total / GB:.1f} GB of {req.usable_bytes / GB:.1f} "
                     f"usable, most of it {big} ({kinds[big] / GB:.1f} GB)")
    lines += breakdown(pred, req)
    mine = step_terms(pred, req)
    win = ranked[0] if ranked else None
    theirs = step_terms(win, req) if win is not None else None
    band = _band(req)
    k = band.factor  # every part calibrated alike; the band is the total's
    pipeline = (f"passes {pred.pipeline_s * k:.2f} s (no pipeline)" if layout.p == 1 else
                f"pipeline {pred.pipeline_s * k:.2f} s (bubble {100 * pred.bubble:.1f}%)")
    lines.append(f"  {step_text(pred.step_s, band)} ({passes_text(pred)}): {pipeline}, data-parallel traffic not "
                 f"hidden {pred.dp_exposed_s * k:.2f} s, optimizer {pred.optimizer_s * k:.2f} s; "
                 f"{throughput_text(pred, band)}")
    header = f"  {'seconds per step (calibrated), on the GPU that finishes last':<60} {'this layout':>11}"
    lines.append(header + (f" {'winner':>8} {'difference':>10}" if theirs else ""))
    for term in TERMS:
        row = f"  {term:<60} {k * mine[term]:>11.2f}"
        lines.append(row + (f" {k * theirs[term]:>8.2f} {k * (mine[term] - theirs[term]):>+10.2f}" if theirs else ""))
    if win is None:
        return lines
    if win.layout == layout:
        lines.append("  it is the planner's choice")
        return lines
    slower = 100 * (pred.step_s / win.step_s - 1)
    term = max(TERMS, key=lambda k: mine[k] - theirs[k]) if slower >= 0 else min(TERMS, key=lambda k: mine[k] - theirs[k])
    verdict = (f"  {abs(slower):.1f}% {'slower' if slower >= 0 else 'faster'} than the winner ({win.layout.label()}), "
               f"most of the difference in {term} ({k * (mine[term] - theirs[term]):+.2f} s)")
    if not fits:
        theirs_mem = max(win.memory, key=lambda r: r.total)
        tip = max(search.MEMORY_KINDS, key=lambda k: kinds[k] - getattr(theirs_mem, k))
        verdict += (f"; and it does not fit: its fullest GPU holds {kinds[tip] / GB:.1f} GB of {tip}, "
                    f"{(kinds[tip] - getattr(theirs_mem, tip)) / GB:.1f} GB more than the winner's fullest GPU")
    lines.append(verdict)
    return lines


def layout_json(layout: search.Layout, req: search.Request) -> dict:
    """The explained layout for --json: its prediction, memory per rank and the timeline of one
    step (what the planner page draws for it)."""
    events = search.timeline(layout, req)
    return {**search.prediction_json(search.predict(layout, req, check_memory=False)),
            "timeline": [[e.rank, e.stage, e.kind, e.microbatch, e.start, e.end] for e in events]}


# What each framework can run and its version, registry and sharding flags live in the planner's export
# module (the page exports the same layouts): FRAMEWORKS, TORCHTITAN_VERSION, TORCHTITAN_REGISTRY,
# MEGATRON_CORE_VERSION, MEGATRON_SHARDING.


def runs_on(layout: search.Layout, kind: str, req: search.Request | None = None) -> str | None:
    """Why framework ``kind`` cannot run ``layout`` (as the engine itself would refuse it, or as its
    nearest option would hold other memory than the planner counts); ``None`` if it can. With
    ``req``, also whether its layers split over the stages as the framework splits them."""
    fw = FRAMEWORKS[kind]
    experts = experts_problem(layout, kind)
    if experts:
        return experts
    if layout.schedule not in fw["schedules"]:
        return f"{kind} runs no {layout.schedule} schedule"
    if layout.sharding not in fw["shardings"]:
        return f"{kind} has no {layout.sharding} sharding"
    if (kind == "torchtitan" and req is not None and req.overlap_f_b and layout.schedule == "DualPipeV"
            and layout.ep > 1):  # torchtitan/distributed/dual_pipe_v.py (after 0.3.0): get_dual_pipe_v_flag
        return ("torchtitan 0.3.0 has no DualPipeV overlap of the experts' all-to-all (it registers no OVERLAP_F_B "
                "function; the overlap added after it refuses activation checkpointing): plan without --overlap-f-b")
    if kind == "torchtitan" and layout.cp > 1 and layout.sharding != "fsdp":
        return ("torchtitan shards the parameters over the context-parallel GPUs whenever cp > 1 (FSDP over "
                "dp_shard x cp, ParallelDims.fsdp_enabled): use sharding fsdp")
    if layout.recompute not in fw["recomputes"]:
        return (f"{kind}'s selective recomputation (core attention only, by default) keeps about twice the "
                "activations of the op-level policy the planner counts")
    if kind == "megatron" and req is not None:
        if req.model.position == "alibi":
            return "Megatron-LM has no ALiBi position embedding"
        if req.model.mlp not in MEGATRON_MLP:
            return f"Megatron-LM's command line has no {req.model.mlp} MLP"
        if req.optimizer not in MEGATRON_OPTIMIZER:
            return f"Megatron-LM has no {req.optimizer} optimizer"
    if kind == "megatron" and layout.p > 1:
        if layout.balance == "ends" and layout.num_stages > layout.p:
            return "Megatron-LM lightens the first and last pipeline ranks, not stages, under interleaving"
        if req is not None:
            layers = [len(x) for x in search.layers_of(layout, req)]
            middle = layers[1:-1] if layout.balance == "ends" else layers
            if len(set(middle)) > 1:
                return (f"Megatron-LM splits the {'middle ' if layout.balance == 'ends' else ''}layers evenly over "
                        f"the stages, and {sum(middle)} do not split over {len(middle)}")
    return None


def exportable(ranked: list[search.Prediction], req: search.Request, kind: str) -> tuple[search.Prediction | None, str]:
    """The fastest layout framework ``kind`` can run, and a sentence when it is not the winner
    (searched again within the framework's options if no ranked layout qualifies)."""
    if not ranked:
        return None, ""
    win = ranked[0]
    problem = runs_on(win.layout, kind, req)
    if problem is None:
        return win, ""
    best = best_for(ranked, req, kind)
    if best is None:
        return None, f"the winner cannot be exported: {problem}, and nothing {kind} runs fits"
    return best, (f"the winner cannot be exported: {problem}; the fastest layout it runs is {best.layout.label()}, "
                  f"{100 * (best.step_s / win.step_s - 1):.1f}% slower")


def best_for(ranked: list[search.Prediction], req: search.Request, kind: str) -> search.Prediction | None:
    """The fastest layout framework ``kind`` runs: among the ranked, or searched again within its options."""
    best = next((o for o in ranked if runs_on(o.layout, kind, req) is None), None)
    if best is None:
        fw = FRAMEWORKS[kind]
        narrowed = search.with_layout(req, schedules=tuple(s for s in req.schedules if s in fw["schedules"]),
                                      shardings=tuple(x for x in req.shardings if x in fw["shardings"]),
                                      recomputes=tuple(x for x in req.recomputes if x in fw["recomputes"]))
        best = next((o for o in search.plan(narrowed)[0] if runs_on(o.layout, kind, req) is None), None)
    return best


def _torchrun(req: search.Request) -> str:
    nodes = -(-req.gpus // req.gpus_per_node)
    per_node = min(req.gpus, req.gpus_per_node)
    rdzv = " --rdzv-backend c10d --rdzv-endpoint <HEAD_NODE>:29500" if nodes > 1 else ""
    return f"torchrun --nnodes {nodes} --nproc-per-node {per_node}{rdzv}"


def torchtitan_args(pred: search.Prediction, req: search.Request) -> tuple[list[str], list[str]]:
    """torchtitan 0.3.0's command-line overrides for a layout (after ``--module``/``--config``), and notes:
    first what every registry entry sets that a job must replace (:data:`export.TORCHTITAN_OVERRIDES`),
    then the layout, every degree named (an entry sets its own)."""
    c = pred.layout
    first_less, last_less = search.end_weights(req) if c.balance == "ends" and c.p > 1 else (0, 0)
    notes: list[str] = []
    args = list(TORCHTITAN_OVERRIDES)
    args += [f"--parallelism.data_parallel_replicate_degree {c.dp if c.sharding == 'none' else 1}",
             f"--parallelism.data_parallel_shard_degree {c.dp if c.sharding == 'fsdp' else 1}",
             f"--parallelism.fsdp_reshard_after_forward {req.fsdp_reshard}",
             f"--parallelism.tensor_parallel_degree {c.tp}"]
    if c.tp > 1:
        args.append("--parallelism.enable_sequence_parallel" if req.sequence_parallel
                    else "--parallelism.no-enable_sequence_parallel")
    args += [f"--parallelism.context_parallel_degree {c.cp}", f"--parallelism.expert_parallel_degree {c.ep}",
             f"--parallelism.pipeline_parallel_degree {c.p}"]
    if c.p > 1:
        args += [f"--parallelism.pipeline_parallel_schedule {c.schedule}",
                 f"--parallelism.pipeline_parallel_microbatch_size {c.b}",
                 f"--parallelism.pipeline_parallel_first_stage_less_layers {first_less}",
                 f"--parallelism.pipeline_parallel_last_stage_less_layers {last_less}"]
        default_v = 1 if schedules.placement(c.schedule) == "single" else 2
        if c.num_stages // c.p != default_v:  # torchtitan cuts ceil((layers + less) / layers_per_stage) stages
            units = req.model.layers + first_less + last_less
            per_stage = -(-units // c.num_stages)
            args.append(f"--parallelism.pipeline_parallel_layers_per_stage {per_stage}")
            if -(-units // per_stage) != c.num_stages:
                notes.append(f"torchtitan cuts {units} layer units into {-(-units // per_stage)} stages at "
                             f"{per_stage} per stage, not {c.num_stages}; list the stages' modules in "
                             "--parallelism.module_fqns_per_model_part")
        args.append("--training.disable_cuda_graphs")  # torchtitan 0.3.0 refuses CUDA graphs under a pipeline
        if c.schedule == "DualPipeV":
            notes.append("torchtitan 0.3.0 registers no function for DualPipeV's overlapped pairs: torch runs each "
                         "pair's forward and backward one after the other")
    # a pipeline cuts the local batch into microbatches; without one torchtitan accumulates
    # gradients over global / (local x dp) batches of b sequences
    args += [f"--training.local_batch_size {c.b * c.m if c.p > 1 else c.b}",
             f"--training.global_batch_size {req.global_batch}", f"--training.seq_len {req.seq_len}"]
    args.append("activation-checkpoint:" + c.recompute)  # tyro's subcommand: SelectiveAC (op-level), FullAC, none
    logits = max((r.logits for r in (pred.memory or search.rank_memory(c, req))), default=0.0)
    notes.append(f"kept from the registry entry: its optimizer (AdamW) and learning-rate schedule, checkpoints every "
                 f"{TORCHTITAN_CHECKPOINT_INTERVAL} steps under <OUTPUT_DIR>/checkpoint, and its loss chunked along "
                 f"the sequence (ChunkedLossWrapper, {TORCHTITAN_LOSS_CHUNKS} chunks), which holds about "
                 f"1/{TORCHTITAN_LOSS_CHUNKS} of the logits the planner counts"
                 + (f" ({logits / GB:.1f} GB on the GPU that holds the most)" if logits else "")
                 + ": the job needs less memory than printed (--loss.num_chunks 1 holds them whole, as counted)")
    if req.recipe != "bf16":
        notes.append(f"torchtitan's FSDP keeps float32 master weights and reduces gradients in float32 (the bf16 "
                     f"recipe); the planner counted --recipe {req.recipe}")
    if req.precision in TORCHTITAN_PRECISION_NOTES:
        notes.append(TORCHTITAN_PRECISION_NOTES[req.precision])
    if req.optimizer != "adamw":
        notes.append(f"the planner counted the state of {req.optimizer}; the registry entry runs AdamW: set yours in it")
    return args, notes


def megatron_model_args(req: search.Request) -> tuple[list[str], list[str]]:
    """The model's shape as Megatron-LM's command line gives it (``pretrain_gpt.py`` builds the model
    from these flags), and notes where Megatron-LM would build something else."""
    m = req.model
    notes: list[str] = []
    args = [f"--num-layers {m.layers}", f"--hidden-size {m.hidden}", f"--num-attention-heads {m.heads}"]
    if m.kv_heads != m.heads and not m.mla:
        args += ["--group-query-attention", f"--num-query-groups {m.kv_heads}"]
    if m.head_dim and m.head_dim != m.hidden // m.heads and not m.mla:
        args.append(f"--kv-channels {m.head_dim}")
    args.append(f"--ffn-hidden-size {m.ffn}")
    positions = max(req.seq_len, m.max_positions)
    args += [f"--seq-length {req.seq_len}", f"--max-position-embeddings {positions}"]
    if m.position == "learned" and positions != m.max_positions:
        notes.append(f"Megatron-LM needs --max-position-embeddings of at least --seq-length: {positions} learned "
                     f"positions, where the model has {m.max_positions}")
    args += MEGATRON_MLP[m.mlp]
    if m.norm == "rms":
        args.append("--normalization RMSNorm")
    if m.position == "rope":
        args += ["--position-embedding-type rope", "--rotary-base <ROPE_BASE>"]
    else:
        args.append("--position-embedding-type learned_absolute")
    if not m.bias:
        args.append("--disable-bias-linear")
        if m.qkv_bias:
            args.append("--add-qkv-bias")
    if not m.tied:
        args.append("--untie-embeddings-and-output-weights")
    args += ["--attention-dropout 0.0", "--hidden-dropout 0.0"]
    if m.mla:
        args += ["--multi-latent-attention", f"--kv-lora-rank {m.kv_lora_rank}", f"--qk-head-dim {m.qk_nope_dim}",
                 f"--qk-pos-emb-head-dim {m.qk_rope_dim}", f"--v-head-dim {m.v_head_dim}"]
        if m.q_lora_rank:
            args.append(f"--q-lora-rank {m.q_lora_rank}")
    if m.moe:
        args += [f"--num-experts {m.experts}", f"--moe-router-topk {m.top_k}", f"--moe-ffn-hidden-size {m.expert_ffn}",
                 *MEGATRON_DISPATCHER[req.dispatcher], "--moe-grouped-gemm"]
        if req.capacity_factor > 0:
            args.append(f"--moe-expert-capacity-factor {req.capacity_factor:g}")
        if m.shared_experts:
            args.append(f"--moe-shared-expert-intermediate-size {m.shared_experts * m.expert_ffn}")
        if m.dense_layers:
            args.append(f"--moe-layer-freq '([0]*{m.dense_layers}+[1]*{m.layers - m.dense_layers})'")  # quoted for the shell
        if m.router_bias:
            args.append("--moe-router-enable-expert-bias")
    return args, notes


def megatron_args(pred: search.Prediction, req: search.Request) -> tuple[list[str], list[str]]:
    """Megatron-LM's ``pretrain_gpt.py`` arguments for a layout (its release :data:`export.MEGATRON_LM_RELEASE`),
    and notes: the model's shape, the layout with the overlap the planner's time assumes, training, data
    and checkpoints (placeholders in angle brackets)."""
    c = pred.layout
    layers = [len(x) for x in search.layers_of(c, req)]
    args, notes = megatron_model_args(req)
    args += [f"--tensor-model-parallel-size {c.tp}", f"--pipeline-model-parallel-size {c.p}"]
    if c.cp > 1:
        args.append(f"--context-parallel-size {c.cp}")
    if c.ep > 1:
        args.append(f"--expert-model-parallel-size {c.ep}")
    if req.model.moe:  # Megatron-Core splits each expert over tp GPUs unless told: name etp, 1 included
        args.append(f"--expert-tensor-parallel-size {c.etp}")
    if c.num_stages > c.p:
        args.append(f"--num-virtual-stages-per-pipeline-rank {c.num_stages // c.p}")
    if c.balance == "ends" and c.p > 1:
        args += [f"--decoder-first-pipeline-num-layers {layers[0]}", f"--decoder-last-pipeline-num-layers {layers[-1]}"]
    if c.tp > 1 and req.sequence_parallel:
        args.append("--sequence-parallel")
    args += MEGATRON_SHARDING[c.sharding]
    if c.dp * c.cp > 1:
        args += MEGATRON_OVERLAP[c.sharding]
    if c.sharding in ("zero2", "fsdp"):
        notes.append(f"{c.sharding}: Megatron-Core's Megatron-FSDP" + (
            "; check that your version runs it with pipeline parallelism" if c.p > 1 else ""))
    if c.recompute == "full":
        args += ["--recompute-granularity full", "--recompute-method uniform", "--recompute-num-layers 1"]
    if req.kernels == "unfused":
        args.append("--attention-backend unfused")
    args += [f"--micro-batch-size {c.b}", f"--global-batch-size {req.global_batch}", "--bf16",
             *MEGATRON_PRECISION[req.precision], *MEGATRON_OPTIMIZER[req.optimizer], "--train-iters <TRAIN_ITERS>", "--lr <LR>", "--lr-warmup-iters <WARMUP_ITERS>", "--eval-iters 0",
             "--data-path <DATA_PREFIX>", "--tokenizer-type HuggingFaceTokenizer", "--tokenizer-model <TOKENIZER>",
             "--save <CHECKPOINT_DIR>", "--load <CHECKPOINT_DIR>", "--save-interval <SAVE_INTERVAL>"]
    step = MEGATRON_VOCAB_DIVISOR * c.tp
    padded = -(-req.model.vocab // step) * step
    if padded != req.model.vocab:
        notes.append(f"Megatron-LM pads the vocabulary to {padded} (a multiple of {MEGATRON_VOCAB_DIVISOR} x tp), "
                     f"where the planner counts {req.model.vocab}")
    notes.append("the learning-rate schedule, Adam's betas, weight decay and clipping are Megatron-LM's defaults, "
                 "and evaluation is off (--eval-iters 0: the planner's time has none): set yours")
    return args, notes


def _placeholders(text: str) -> list[str]:
    """The placeholders a command leaves, in order of first use, each once."""
    import re

    return list(dict.fromkeys(re.findall(r"<([A-Z_]+)>", text)))


def export(pred: search.Prediction, req: search.Request, kind: str) -> str:
    """A layout ``kind`` runs (:func:`runs_on`) as a complete command: a torchtitan 0.3.0 job
    (``torchrun ... -m torchtitan.train --module M --config C`` and its overrides) or Megatron-LM's
    ``pretrain_gpt.py`` with the model's shape, the layout, training, data and checkpoints. Values in
    angle brackets are placeholders, each named in a note before the command (a comment line of its
    own, as every note), with what to fill in."""
    c = pred.layout
    problem = runs_on(c, kind, req)
    if problem:
        raise ValueError(f"--export {kind}: {problem} ({c.label()})")
    if kind == "torchtitan":
        args, notes = torchtitan_args(pred, req)
        entry = TORCHTITAN_REGISTRY.get(req.model.name)
        if entry is None:
            module, config = "<MODULE>", "<CONFIG>"
            notes.insert(0, f"torchtitan {TORCHTITAN_VERSION} has no registry entry for {req.model.name}: write one (a "
                            "function returning Trainer.Config, as torchtitan/models/llama3/config_registry.py's "
                            "llama3_70b) and name its module and function below")
        else:
            module, config, flavour = entry
            notes.insert(0, f"torchtitan {TORCHTITAN_VERSION} (pip install torchtitan=={TORCHTITAN_VERSION}; its main "
                            f"branch has renamed fields since): registry entry {config}, model flavour {flavour}")
            if config in TORCHTITAN_ENTRY_NOTES:
                notes.insert(1, f"the registry entry {config} {TORCHTITAN_ENTRY_NOTES[config]}")
        command = " \\\n  ".join([f"{_torchrun(req)} -m torchtitan.train --module {module} --config {config}", *args])
    else:
        args, notes = megatron_args(pred, req)
        notes.insert(0, f"Megatron-LM {MEGATRON_LM_RELEASE} (git clone --branch {MEGATRON_LM_RELEASE} "
                        "https://github.com/NVIDIA/Megatron-LM; run from its root): pretrain_gpt.py with the model's "
                        "shape, the layout, and the overlap of data-parallel traffic the planner's time assumes")
        env = "CUDA_DEVICE_MAX_CONNECTIONS=1 " if (c.tp > 1 or c.cp > 1) and c.sharding not in ("zero2", "fsdp") else ""
        command = " \\\n  ".join([f"{env}{_torchrun(req)} pretrain_gpt.py", *args])
    fill = "; ".join(f"<{name}> {PLACEHOLDERS[name]}" for name in _placeholders(command))
    notes.insert(1, f"fill in {fill}")
    return "\n".join([f"# {n}" for n in notes] + [command])


def drop_summary(dropped: list[search.Prediction], limit: int = 20) -> list[str]:
    """What ``--why`` prints: how many layouts were dropped for each reason, most first, then the
    first ``limit`` of them with their reason (the planner page shows the same)."""
    by_reason: dict[str, list[search.Prediction]] = {}
    for o in dropped:
        by_reason.setdefault((o.why_not or "").split(":")[0], []).append(o)
    lines = [f"{len(v)} dropped: {k}" for k, v in sorted(by_reason.items(), key=lambda kv: -len(kv[1]))]
    lines += [f"  {o.layout.label()}: {o.why_not}" for o in dropped[:limit]]
    if len(dropped) > limit:
        lines.append(f"  ... and {len(dropped) - limit} more (--json lists all)")
    return lines


def main(argv=None) -> int:
    args = parse_args(argv)
    layout_problem = None
    try:
        req = request_from(args)
        try:
            named = parse_layout(args.layout, req) if args.layout else None
        except LayoutProblem as e:  # the rest of the answer still stands
            named, layout_problem = None, e
        if args.json and not Path(args.json).resolve().parent.is_dir():
            raise ValueError(f"--json {args.json}: its folder does not exist; create it or pick another path")
    except ValueError as e:
        print(f"ppbook.plan: error: {e}", file=sys.stderr)
        return 2
    ranked, dropped = search.plan(req, slack=tie_slack(req))
    print("\n".join(header(req, ranked)))
    for line in assumptions(args, req) + not_modelled(args, req):
        print(line)
    print("\n".join(table(ranked, args.top, req)))
    if ranked:
        print(f"{len(ranked)} layouts ranked, {len(dropped)} dropped (--why says why); the others cannot come "
              f"within {100 * tie_slack(req):.0f}% of the winner, the top of its band (their busiest GPU's computation "
              "alone takes longer)")
    else:
        print(f"{len(dropped)} layouts dropped (--why says why)")
    answer, why = why_winner(ranked, req), why_lines(ranked, req)
    print(answer)
    for line in why:
        print(line)
    if ranked:
        print("memory per GPU of the winner, GB:")
        print("\n".join(breakdown(ranked[0], req)))
    else:
        closest = search.closest(dropped, req)
        if closest is not None:
            print(f"the closest layout, {closest.layout.label()}, needs {closest.peak_gb:.1f} GB on its fullest GPU "
                  f"of {req.usable_bytes / GB:.1f} usable; use more GPUs, a larger --tp, recomputation or sharding:")
            print("\n".join(breakdown(closest, req)))
    if named is not None:
        print("\n".join(explain(named, req, ranked)))
    if args.export:
        chosen, note = exportable(ranked, req, args.export)
        if note:
            print(note)
        if chosen is not None:
            print(f"{'the winner' if not note else 'that layout'} as {args.export} configuration:")
            print(export(chosen, req, args.export))
    if args.why:
        print("\n".join(drop_summary(dropped)))
    if args.json:
        Path(args.json).write_text(json.dumps({
            "request": {**asdict(req), "model": shapes.to_json(req.model), "gpu": asdict(req.gpu),
                        "intra": asdict(req.intra), "inter": asdict(req.inter)},
            "ranked": [search.prediction_json(o) for o in ranked],
            "dropped": [search.prediction_json(o) for o in dropped],
            "winner_reason": answer,
            "tie": [o.layout.label() for o in tie(ranked, req)],
            "why": why,
            "calibration": asdict(_band(req)), "cautions": calibration.cautions(req.gpu.name, req.framework),
            **({"layout": layout_json(named, req)} if named is not None else {})}, indent=1, default=float))
    if layout_problem is not None:
        print(f"ppbook.plan: error: {layout_problem}", file=sys.stderr)
        return 2
    return 0 if ranked else 1


if __name__ == "__main__":
    raise SystemExit(main())
