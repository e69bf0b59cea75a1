"""Splitting a model into pipeline stages: by hand (built on the meta device) and with the tracer,
both checked against one process; tied weights under the tracer; and three balancing policies
(equal layer counts, parameter counts, measured time) timed on a Llama with a heavy output head.

CPU, three stages of a 5-layer model (uneven: 2, 2, 1 layers), both models, both methods:
    torchrun --standalone --nproc-per-node 3 scripts/04_splitting.py --check
CPU, two stages, everything (checks, tied weights, balancing) in one launch:
    torchrun --standalone --nproc-per-node 2 scripts/04_splitting.py --experiments check tied balance --check
A tensor keyword argument that a later stage uses: fails on purpose, with torch's error:
    torchrun --standalone --nproc-per-node 2 scripts/04_splitting.py --experiments kwarg
Hugging Face (needs transformers and safetensors): transformers' LlamaForCausalLM, random from a
small config, split by hand and by the tracer (as a ppbook.hf.Chain), trained against one process;
the same model traced as transformers builds it, which fails from three stages on (skip
connections); and the book's Llama stages loaded from a Hugging Face safetensors folder, each rank
reading only its own tensors, with logits checked against transformers':
    torchrun --standalone --nproc-per-node 3 scripts/04_splitting.py --experiments hf hf-weights --check
    torchrun --standalone --nproc-per-node 3 scripts/04_splitting.py --experiments hf-direct
A published model instead of a random one (hf: from_pretrained on every rank, which then keeps
its stage; a Hub name downloads it once, a folder loads offline. The book's launcher sets
HF_HUB_OFFLINE=1, so from a page or a test a Hub name must be in the cache already: run this
with plain torchrun. hf-weights reads only each rank's tensors, from a local folder: download it
first):
    torchrun --standalone --nproc-per-node 4 scripts/04_splitting.py --experiments hf \\
        --hf-model TinyLlama/TinyLlama-1.1B-Chat-v1.0 --seq-len 128 --vocab 32000 --check
    hf download TinyLlama/TinyLlama-1.1B-Chat-v1.0 --local-dir tinyllama
    torchrun --standalone --nproc-per-node 4 scripts/04_splitting.py --experiments hf-weights \\
        --hf-dir tinyllama --seq-len 128 --vocab 32000 --check
Memory on that scale: hf keeps on every rank transformers' whole model, its one-process reference
with gradients and two AdamW moments, and a copy per split method while it is cut: about seven
copies of the weights, some 30 GB per rank for TinyLlama's 1.1B float32 parameters (--methods
manual saves one). hf-weights holds one stage per rank; its --check loads transformers' model on
the last rank in float32, then in float64 (its own rounding, the yardstick), 9 GB at the most.
Folders the book's Llama loads: Llama 1 and 2, TinyLlama, Llama 3.0, and Llama 3.1, 3.2, 3.3
(rope_type "llama3"); a tied one (Llama 3.2 1B, 3B) trains with 07_checkpointing.py --from-hf.
GPUs (NCCL), balancing a larger model:
    torchrun --standalone --nproc-per-node 4 scripts/04_splitting.py --experiments balance \\
        --balance-vocab 32000 --balance-dim 1024 --balance-layers 16 --batch-size 64 --device cuda
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe, SplitPoint, pipeline
from tqdm import tqdm

from ppbook import cli, driver, measure, precision, workload
from ppbook import hf, split
from ppbook.dist import gather_to_rank0
from ppbook.models import GPTConfig, LlamaConfig, build_model
from ppbook.stages import assign_layers, stage_module
from ppbook.timeline import Recorder

EXPERIMENTS = ("check", "tied", "balance", "kwarg", "hf", "hf-direct", "hf-weights")
MODELS = ("gpt", "llama")
METHODS = ("manual", "tracer")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    # 5 layers: uneven on 2, 3 and 4 stages, where layers get dropped if anything does
    cli.add_common_args(p, microbatches=4, batch_size=8, seq_len=32, layers=5, dim=64)
    cli.add_timing_args(p, steps=3)
    p.add_argument("--experiments", nargs="+", choices=EXPERIMENTS, default=["check"],
                   help="check: manual and tracer splits against one process; tied: tied weights under the "
                        "tracer; balance: three balancing policies timed; kwarg: fails on purpose")
    p.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS), help="models for 'check'")
    p.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS), help="split methods for 'check'")
    p.add_argument("--policies", nargs="+", choices=split.POLICIES, default=list(split.POLICIES),
                   help="balancing policies for 'balance'")
    p.add_argument("--balance-vocab", type=int, default=8192, help="vocabulary of the Llama that 'balance' splits")
    p.add_argument("--balance-dim", type=int, default=128)
    p.add_argument("--balance-layers", type=int, default=8)
    p.add_argument("--hf-model", default=None,
                   help="hf, hf-direct: LlamaForCausalLM.from_pretrained(this) (a Hub name downloads) instead of "
                        "a random one built from --vocab, --dim, --layers, --heads, --seq-len")
    p.add_argument("--hf-dir", default=None,
                   help="hf-weights: a local Hugging Face Llama folder (config.json, *.safetensors); default: rank 0 "
                        "writes a random one with save_pretrained into a temporary folder")
    p.add_argument("--hf-steps", type=int, default=3, help="hf: AdamW steps trained through the pipeline")
    return p.parse_args(argv)


def validate(args: argparse.Namespace, num_stages: int) -> None:
    cli.validate_common(args, num_stages)
    if "balance" in args.experiments:
        for name in ("balance_vocab", "balance_dim", "balance_layers"):
            if getattr(args, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
        if args.balance_layers < num_stages:
            raise ValueError(f"--balance-layers {args.balance_layers} is fewer than the {num_stages} stages; "
                             f"raise it or lower --nproc-per-node")
        if args.balance_dim % args.heads:
            raise ValueError(f"--balance-dim {args.balance_dim} must be divisible by --heads {args.heads}")
    if ("tied" in args.experiments or "kwarg" in args.experiments) and num_stages < 2:
        raise ValueError("'tied' and 'kwarg' show what happens between stages: launch them on at least 2 processes")
    if {"hf", "hf-direct", "hf-weights"} & set(args.experiments):
        hf.require_libraries()  # one line, before any process group, when transformers is missing
    if args.hf_steps < 1:
        raise ValueError(f"--hf-steps must be at least 1, got {args.hf_steps}")
    if args.hf_dir is not None:  # a folder the book's Llama cannot load, or without safetensors, is refused here
        cfg, _ = hf.read_folder(args.hf_dir)
        fits_batch("--hf-dir", args.hf_dir, cfg.vocab_size, cfg.max_seq_len, cfg.n_layers, args, num_stages)
    if args.hf_model is not None:
        try:  # a local folder, or a Hub name: from the cache, or (not offline) downloaded in body
            path = hf.hub_config(args.hf_model)
        except ValueError as err:
            raise ValueError(f"--hf-model {err}") from None
        if path is not None:  # transformers' model: any Llama config
            d = json.loads(path.read_text())
            fits_batch("--hf-model", args.hf_model, d["vocab_size"], d["max_position_embeddings"],
                       d["num_hidden_layers"], args, num_stages)
            split_here = sorted({"hf", "hf-direct"} & set(args.experiments))  # the experiments that split it
            if d.get("tie_word_embeddings") and num_stages > 1 and split_here:
                raise ValueError(f"--hf-model {args.hf_model} ties its output head to its embedding, which "
                                 f"{' and '.join(map(repr, split_here))} "
                                 f"would split into two copies: launch it on one process, or use a folder with "
                                 f"--from-hf of 07_checkpointing.py, which adds the copies' gradients")


def fits_batch(flag: str, folder, vocab: int, positions: int, layers: int, args, num_stages: int) -> None:
    """A ValueError unless the random batches (--vocab, --seq-len) fit the folder's model and
    every stage gets a layer."""
    if args.vocab > vocab or args.seq_len > positions or layers < num_stages:
        raise ValueError(f"{flag} {folder}: its model has a vocabulary of {vocab}, {positions} positions and "
                         f"{layers} layers; keep --vocab and --seq-len within them and launch at most "
                         f"{layers} processes")


def config(kind: str, args, vocab=None, dim=None, layers=None) -> GPTConfig | LlamaConfig:
    common = dict(vocab_size=vocab or args.vocab, dim=dim or args.dim, n_layers=layers or args.layers,
                  n_heads=args.heads, max_seq_len=args.seq_len)
    return GPTConfig(**common) if kind == "gpt" else LlamaConfig(**common, n_kv_heads=args.heads // 2 or 1)


# [start-manual]
def manual_stage(cfg, args, info) -> nn.Module:
    """This rank's stage, built on the meta device: only its own parameters ever get memory."""
    return split.build_stage_on_meta(cfg, args.seed, info.rank, info.world_size,
                                     dtype=precision.param_dtype(args.dtype), device=info.device)
# [end-manual]


# [start-tracer]
def traced_stage(full: nn.Module, mb_tokens: torch.Tensor, info):
    """Trace the whole model on one microbatch, cut
    it where the manual split cuts, keep a stage."""
    starts = [layers[0] for layers in assign_layers(len(full.layers), info.world_size)]
    split_spec = {f"layers.{first}": SplitPoint.BEGINNING for first in starts[1:]}
    # torch.export under the hood
    pipe = pipeline(full, mb_args=(mb_tokens,), split_spec=split_spec)
    # a PipelineStage around this stage's part
    return pipe.build_stage(info.rank, device=info.device)
# [end-tracer]


def run_pipeline(stage, stage_mod, tokens, targets, m, info, rec=None) -> list[torch.Tensor]:
    if rec is not None:
        rec.attach(stage)
    schedule = ScheduleGPipe(stage, n_microbatches=m, loss_fn=workload.loss_fn)
    stage_mod.zero_grad(set_to_none=True)
    return driver.schedule_step(schedule, info, tokens, targets)


def check(kind: str, method: str, args, info, tokens, targets) -> dict | None:
    """One split of one model, one GPipe step, compared with one process by parameter name."""
    cfg, m = config(kind, args), args.microbatches
    full = build_model(cfg, seed=args.seed, dtype=precision.param_dtype(args.dtype)).to(info.device)
    reference = copy.deepcopy(full)
    ref_loss = workload.reference_backward(reference, tokens, targets, m)
    if method == "manual":
        stage_mod = manual_stage(cfg, args, info)
        stage = PipelineStage(stage_mod, info.rank, info.world_size, info.device)
    else:
        stage = traced_stage(full, tokens.chunk(m)[0], info)
        stage_mod = stage.submod
    full_params = dict(full.named_parameters())
    weights_equal = all(torch.equal(p, full_params[n]) for n, p in stage_mod.named_parameters())
    losses = run_pipeline(stage, stage_mod, tokens, targets, m, info)
    mine = {"rank": info.rank, "weights_equal_full": weights_equal, **workload.compare(stage_mod, reference),
            "loss": workload.mean_loss(losses) if info.is_last else None}
    stages = gather_to_rank0(mine)
    if stages is None:
        return None
    tol = precision.tolerance(args.dtype)
    ok = all(s["weights_equal_full"] and s["max_grad_diff"] <= tol for s in stages) and \
        abs(stages[-1]["loss"] - ref_loss) <= tol
    return {"model": kind, "method": method, "layers_per_stage": [layer_ids(s["params"]) for s in stages],
            "reference_loss": ref_loss, "loss": stages[-1]["loss"], "match": ok, "stages": stages}


def layer_ids(names: list[str]) -> list[int]:
    return sorted({int(n.split(".")[1]) for n in names if n.startswith("layers.")})


# [start-tied]
def tied(args, info, tokens, targets) -> dict | None:
    """A Llama whose output head reuses the embedding matrix, split by the tracer."""
    cfg, m = config("llama", args), args.microbatches
    full = build_model(
        cfg, seed=args.seed, dtype=precision.param_dtype(args.dtype)
    ).to(info.device)
    # tie: one matrix, used first and last
    full.output.weight = full.tok_embeddings.weight
    reference = copy.deepcopy(full)  # deepcopy keeps the tie
    workload.reference_backward(reference, tokens, targets, m)
    stage = traced_stage(copy.deepcopy(full), tokens.chunk(m)[0], info)
    run_pipeline(stage, stage.submod, tokens, targets, m, info)
    name = (
        "tok_embeddings.weight"
        if info.is_first
        else "output.weight" if info.is_last else None
    )
    grad = dict(stage.submod.named_parameters())[name].grad if name else None
    # The fix: the first and last stages add their gradients of the shared matrix.
    # every rank must take part in new_group
    pair = dist.new_group([0, info.world_size - 1])
    summed = grad.clone() if grad is not None else None
    if summed is not None:
        # comm: sum the two halves of the tied gradient
        dist.all_reduce(summed, group=pair)
# [end-tied]
    ref = reference.tok_embeddings.weight.grad
    mine = {"rank": info.rank, "name": name,
            "grad": grad.cpu().tolist() if grad is not None else None,
            "max_diff": (grad - ref).abs().max().item() if grad is not None else None,
            "max_diff_summed": (summed - ref).abs().max().item() if summed is not None else None,
            "params": [n for n, _ in stage.submod.named_parameters()]}
    stages = gather_to_rank0(mine)
    if stages is None:
        return None
    return {"reference_grad": ref.cpu().tolist(), "first": stages[0], "last": stages[-1],
            "params": [s["params"] for s in stages]}


def balance(args, info, tokens, targets) -> dict | None:
    """Split a Llama with a heavy head by each policy and time a GPipe step of each split."""
    cfg = config("llama", args, vocab=args.balance_vocab, dim=args.balance_dim, layers=args.balance_layers)
    m, p = args.microbatches, info.world_size
    full = build_model(cfg, seed=args.seed, dtype=precision.param_dtype(args.dtype)).to(info.device)
    tokens, targets = tokens % cfg.vocab_size, targets % cfg.vocab_size
    reference = copy.deepcopy(full)
    ref_loss = workload.reference_backward(reference, tokens, targets, m)
    # [start-profile]
    seconds = [None]
    if info.rank == 0:  # one rank profiles, alone, on one microbatch; the others wait
        seconds[0] = split.profile_units(
            full, tokens.chunk(m)[0], targets.chunk(m)[0], workload.loss_fn
        )
    dist.broadcast_object_list(seconds, src=0)
    params = split.unit_params(full)
    plans = {
        policy: split.balance(
            policy, cfg.n_layers, p, params=params, seconds=seconds[0]
        )
        for policy in args.policies
    }
    # [end-profile]
    pipes = {}
    for policy, layers in plans.items():
        stage_mod = stage_module(copy.deepcopy(full), info.rank, p, layers=layers[info.rank])
        stage = PipelineStage(stage_mod, info.rank, p, info.device)
        rec = Recorder(info.rank)
        rec.attach(stage)
        pipes[policy] = (stage_mod, ScheduleGPipe(stage, n_microbatches=m, loss_fn=workload.loss_fn), rec, [], [])
    # Rounds of one step per policy, so that a slow spell of a shared host hits every policy.
    for r in tqdm(range(args.warmup + args.steps), desc="rounds", disable=info.rank != 0):
        for policy, (stage_mod, schedule, rec, losses, records) in pipes.items():
            def step():
                stage_mod.zero_grad(set_to_none=True)
                losses.append(driver.schedule_step(schedule, info, tokens, targets))
            warm = r < args.warmup
            records.extend(measure.timed_steps(step, rec, int(warm), int(not warm), info.device) or [])
    runs, tol = {}, precision.tolerance(args.dtype)
    for policy, (stage_mod, schedule, rec, losses, records) in pipes.items():
        mine = {"rank": info.rank, **workload.compare(stage_mod, reference),
                "loss": workload.mean_loss(losses[-1]) if info.is_last else None}
        stages = gather_to_rank0(mine)
        if stages is None:
            continue
        summary, layers = measure.summarise_steps(records), plans[policy]
        runs[policy] = {
            "layers_per_stage": layers, "stage_params": split.stage_costs(layers, params),
            "predicted_stage_seconds": split.stage_costs(layers, [m * t for t in seconds[0]]),
            "measured_stage_seconds": [m * (summary["costs"][f"{s}F"] + summary["costs"][f"{s}B"]) for s in range(p)],
            "match": all(s["max_grad_diff"] <= tol for s in stages) and abs(stages[-1]["loss"] - ref_loss) <= tol,
            **summary}
    if info.rank != 0:
        return None
    return {"unit_names": split.unit_names(cfg.n_layers), "unit_seconds": seconds[0], "unit_params": params,
            "vocab": cfg.vocab_size, "dim": cfg.dim, "layers": cfg.n_layers, "runs": runs}


class WithTemperature(nn.Module):
    """The model's logits divided by a per-sequence temperature: a tensor keyword argument that
    only the last stage (the head) needs."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, tokens, temperature):
        return self.model(tokens) / temperature  # (B, T, vocab) / (B, 1, 1)


def kwarg(args, info, tokens, targets) -> None:
    """Fails on purpose: the tracer wires the keyword argument to the last stage as a model
    input, but the runtime feeds model inputs to the first stage only."""
    m = args.microbatches
    full = build_model(config("gpt", args), seed=args.seed, dtype=precision.param_dtype(args.dtype)).to(info.device)
    temperature = torch.ones(tokens.shape[0], 1, 1, device=info.device)  # (B, 1, 1)
    starts = [layers[0] for layers in assign_layers(len(full.layers), info.world_size)]
    pipe = pipeline(WithTemperature(full), mb_args=(tokens.chunk(m)[0],),
                    mb_kwargs={"temperature": temperature.chunk(m)[0]},
                    split_spec={f"model.layers.{s}": SplitPoint.BEGINNING for s in starts[1:]})
    stage = pipe.build_stage(info.rank, device=info.device)
    schedule = ScheduleGPipe(stage, n_microbatches=m, loss_fn=workload.loss_fn)
    try:
        if info.is_first:
            schedule.step(tokens, temperature=temperature)  # the model's inputs go to the first stage
        elif info.is_last:
            schedule.step(target=targets)
        else:
            schedule.step()
    except Exception as err:  # one line per rank that a chapter can show, then fail as torch does
        report_failure(info, err)
        raise


def report_failure(info, err: Exception) -> None:
    """This rank's error (or the one it was raised from) as one line on stderr."""
    cause = err.__cause__ or err
    line = f"rank {info.rank} failed: {type(cause).__name__}: {cause}".replace("\n", " ")
    sys.stderr.write(line + "\n")  # one write: another rank's line cannot land before our newline
    sys.stderr.flush()


def transformers_lib():
    """transformers, imported only by the hf experiments (it takes seconds), without its bars."""
    import transformers

    transformers.utils.logging.disable_progress_bar()  # human lines come from one rank
    return transformers


def hf_model(args, info) -> nn.Module:
    """transformers' LlamaForCausalLM, the same on every rank: --hf-model, or random from a config."""
    lib, dtype = transformers_lib(), precision.param_dtype(args.dtype)
    if args.hf_model:  # a Hub name downloads the model once; a folder loads offline
        model = lib.LlamaForCausalLM.from_pretrained(args.hf_model, attn_implementation="sdpa", dtype=dtype)
    else:
        torch.manual_seed(args.seed)  # transformers initialises from the global generator
        model = lib.LlamaForCausalLM(lib.LlamaConfig(**hf.config_to_hf(config("llama", args))))
    return model.to(dtype).to(info.device)


# [start-hf]
def hf_stage(method: str, hf_model: nn.Module, mb_tokens, info):
    """This rank's stage of a transformers Llama wrapped as a Chain,
    cut by hand or traced at the same layers."""
    chain = hf.Chain(copy.deepcopy(hf_model))
    if method == "manual":
        stage_mod = hf.chain_stage(chain, info.rank, info.world_size)
        return PipelineStage(stage_mod, info.rank, info.world_size, info.device)
    layers = assign_layers(len(chain.model.layers), info.world_size)
    split_spec = {f"model.layers.{run[0]}": SplitPoint.BEGINNING for run in layers[1:]}
    pipe = pipeline(chain, mb_args=(mb_tokens,), split_spec=split_spec)
    return pipe.build_stage(info.rank, device=info.device)
# [end-hf]


def hf_train(args, info) -> dict | None:
    """transformers' Llama split both ways and trained --hf-steps AdamW steps through GPipe,
    against the same model trained in one process on the same microbatches."""
    full, m = hf_model(args, info), args.microbatches
    reference = copy.deepcopy(full)  # transformers' own forward, in one process
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-3)
    runs, (tokens, _) = {}, workload.make_batch(args, 0, info.device)
    for method in args.methods:
        stage = hf_stage(method, full, tokens.chunk(m)[0], info)  # traced on one microbatch
        opt = torch.optim.AdamW(stage.submod.parameters(), lr=1e-3)
        schedule = ScheduleGPipe(stage, n_microbatches=m, loss_fn=workload.loss_fn)
        runs[method] = (stage.submod, opt, schedule, [])
    ref_losses = []
    for step in range(args.hf_steps):
        tokens, targets = workload.make_batch(args, step, info.device)
        ref_opt.zero_grad(set_to_none=True)
        mb_losses = [workload.loss_fn(reference(x).logits, y) for x, y in zip(tokens.tensor_split(m), targets.tensor_split(m))]
        for loss in mb_losses:
            loss.backward()
        workload.scale_grads(reference, m)
        ref_losses.append(workload.mean_loss(mb_losses))
        ref_opt.step()
        for stage_mod, opt, schedule, losses in runs.values():
            opt.zero_grad(set_to_none=True)
            mb = driver.schedule_step(schedule, info, tokens, targets)
            losses.append(workload.mean_loss(mb) if info.is_last else None)
            opt.step()
    out, tol = {}, precision.tolerance(args.dtype)
    for method, (stage_mod, _, _, losses) in runs.items():
        stages = gather_to_rank0({"rank": info.rank, **workload.compare(stage_mod, reference), "losses": losses})
        if stages is not None:
            out[method] = {"stages": stages, "losses": stages[-1]["losses"], "reference_losses": ref_losses,
                           "layers_per_stage": [layer_ids([n.removeprefix("model.") for n in s["params"]]) for s in stages],
                           "match": all(s["max_weight_diff"] <= tol for s in stages)
                           and max(abs(a - b) for a, b in zip(stages[-1]["losses"], ref_losses)) <= tol}
    return out or None


def hf_direct(args, info, tokens, targets) -> dict | None:
    """transformers' model traced as it is (only use_cache=False): from three stages on, a stage
    reads the rotary tables and the mask from stage 0, a skip connection; fails on purpose there."""
    full, m = hf_model(args, info), args.microbatches
    full.config.use_cache = False  # else torch.export meets a DynamicCache in the output
    layers = assign_layers(full.config.num_hidden_layers, info.world_size)
    pipe = pipeline(full, mb_args=(tokens.chunk(m)[0],),
                    split_spec={f"model.layers.{run[0]}": SplitPoint.BEGINNING for run in layers[1:]})
    sources = hf.stage_sources(pipe)
    stage = pipe.build_stage(info.rank, device=info.device)
    reference = copy.deepcopy(full)
    for x, y in zip(tokens.tensor_split(m), targets.tensor_split(m)):
        workload.loss_fn(reference(x).logits, y).backward()
    workload.scale_grads(reference, m)
    try:
        run_pipeline(stage, stage.submod, tokens, targets, m, info)
    except Exception as err:  # from three stages on: torch refuses the skip connection
        report_failure(info, err)
        raise
    stages = gather_to_rank0({"rank": info.rank, **workload.compare(stage.submod, reference)})
    return None if stages is None else {"sources": sources, "stages": stages,
                                        "match": all(s["max_grad_diff"] <= precision.tolerance(args.dtype) for s in stages)}


def hf_weights(args, info, tokens) -> dict | None:
    """The book's Llama stages loaded from a Hugging Face folder, each rank reading only its own
    tensors; with --check, the pipeline's logits against transformers' model on the same files."""
    folder = [args.hf_dir]
    if folder[0] is None and info.rank == 0:  # a random transformers model, saved as a Hub folder
        folder[0] = tempfile.mkdtemp(prefix="ppbook-hf-")
        hf_model(args, info).save_pretrained(folder[0])
    dist.broadcast_object_list(folder, src=0)
    dtype = precision.param_dtype(args.dtype)
    with hf.record_reads() as reads:  # what safetensors actually hands this rank
        stage_mod = hf.load_stage(folder[0], info.rank, info.world_size, dtype=dtype, device=info.device)
    cfg, tied = hf.read_config(folder[0])
    schedule = ScheduleGPipe(PipelineStage(stage_mod, info.rank, info.world_size, info.device), args.microbatches)
    logits = schedule.eval(tokens) if info.is_first else schedule.eval()  # forward only; the last stage returns
    diff = bound = None
    if args.check and info.is_last:  # transformers' logits, and its own float32 rounding (float64 run) as the yardstick
        theirs = {}
        for ref_dtype in (dtype, torch.float64):  # one model at a time: the larger is 8 bytes a parameter
            ref = transformers_lib().LlamaForCausalLM.from_pretrained(folder[0], attn_implementation="sdpa",
                                                                      dtype=ref_dtype).to(info.device)
            with torch.no_grad():
                theirs[ref_dtype] = ref(tokens).logits
            del ref
        diff = (theirs[dtype] - logits).abs().max().item()
        bound = hf.rounding_bound(theirs[dtype], theirs[torch.float64])
    stages = gather_to_rank0({"rank": info.rank, "read": [r.tensor for r in reads],  # in the order read
                              "bytes_read": sum(r.bytes for r in reads),
                              "wanted": sorted(set(hf.sources(stage_mod.state_dict(), tied).values())),
                              "max_logit_diff": diff, "bound": bound})
    if stages is None:
        return None
    total = len(hf.weight_files(folder[0]))
    if args.hf_dir is None:
        shutil.rmtree(folder[0], ignore_errors=True)
    diff, bound = stages[-1]["max_logit_diff"], stages[-1]["bound"]
    return {"stages": stages, "n_layers": cfg.n_layers, "tied": tied, "tensors_in_folder": total,
            "max_logit_diff": diff, "tolerance": bound, "match": None if diff is None else diff <= bound}


def body(args: argparse.Namespace, info) -> int:
    tokens, targets = workload.make_batch(args, 0, info.device)
    out: dict = {"world_size": info.world_size, "microbatches": args.microbatches, "dtype": args.dtype,
                 "torch_version": torch.__version__}
    if "check" in args.experiments:
        out["checks"] = [check(kind, method, args, info, tokens, targets)
                         for kind in args.models for method in args.methods]
    if "tied" in args.experiments:
        out["tied"] = tied(args, info, tokens, targets)
    if "balance" in args.experiments:
        out["balance"] = balance(args, info, tokens, targets)
    if "kwarg" in args.experiments:
        kwarg(args, info, tokens, targets)
    if "hf" in args.experiments:
        out["hf"] = hf_train(args, info)
    if "hf-direct" in args.experiments:
        out["hf_direct"] = hf_direct(args, info, tokens, targets)
    if "hf-weights" in args.experiments:
        out["hf_weights"] = hf_weights(args, info, tokens)
    if info.rank != 0:
        return 0
    ok = True
    for c in out.get("checks", []):
        print(f"{c['model']:>5} {c['method']:>6}: layers per stage {c['layers_per_stage']}, "
              f"max grad diff {max(s['max_grad_diff'] for s in c['stages']):.1e}  {'MATCH' if c['match'] else 'MISMATCH'}")
        ok &= c["match"]
    if out.get("tied"):
        t = out["tied"]
        print(f"tied weights: stage gradients off by {t['first']['max_diff']:.1e} (first) and "
              f"{t['last']['max_diff']:.1e} (last); summed across the two stages: {t['last']['max_diff_summed']:.1e}")
    for policy, r in (out.get("balance") or {}).get("runs", {}).items():
        stage_ms = ", ".join(f"{1e3 * s:.1f}" for s in r["measured_stage_seconds"])
        print(f"balance {policy:>6}: layers {[len(x) for x in r['layers_per_stage']]}, stage ms [{stage_ms}], "
              f"step {1e3 * r['median_step_seconds']:.1f} ms  {'MATCH' if r['match'] else 'MISMATCH'}")
        ok &= r["match"]
    for method, r in (out.get("hf") or {}).items():
        print(f"transformers Llama {method:>6}: layers per stage {r['layers_per_stage']}, {len(r['losses'])} steps, "
              f"max weight diff {max(s['max_weight_diff'] for s in r['stages']):.1e}  {'MATCH' if r['match'] else 'MISMATCH'}")
        ok &= r["match"]
    if out.get("hf_direct"):
        r = out["hf_direct"]
        print(f"transformers Llama traced as is: stage inputs from {r['sources']}  {'MATCH' if r['match'] else 'MISMATCH'}")
        ok &= r["match"]
    if out.get("hf_weights"):
        r = out["hf_weights"]
        read = ", ".join(f"{len(s['read'])} ({s['bytes_read'] / 1e3:.0f} kB)" for s in r["stages"])
        diff = "not checked (--check)" if r["max_logit_diff"] is None else \
            f"{r['max_logit_diff']:.1e} (bound {r['tolerance']:.1e}, from transformers' own float32 rounding)"
        print(f"book Llama from Hugging Face files: tensors read per rank [{read}], "
              f"logits vs transformers: {diff}  {'MATCH' if r['match'] in (None, True) else 'MISMATCH'}")
        ok &= r["match"] is True if args.check else r["match"] in (None, True)
    print("MATCH: every pipeline equals the one-process run" if ok else "MISMATCH in at least one run")
    out["match"] = ok
    cli.write_json(args.json, out)
    return 1 if (args.check and not ok) else 0


def main(argv=None) -> int:
    return cli.run("04_splitting.py", parse_args(argv), validate, body)


if __name__ == "__main__":
    sys.exit(main())
