"""Test helper (not a companion script): run each of torch's seven schedule classes on the
book's Llama with :class:`ppbook.activations.ActivationProbe` on every stage, for one step, and
write the saved-activation bytes each stage held at its peak.

    torchrun --standalone --nproc-per-node 2 tests/helpers/record_llama_memory.py --json out.json

Stages are built and placed by chapter 5's `scripts/05_schedules.py` (`build`): stage r on rank r (GPipe, 1F1B), stages r, r + p (looped), r and
2p - 1 - r (V-shaped). ``tests/test_plan_memory.py`` compares the result with
:func:`ppbook.model_memory.stage_activation_bytes` times :func:`ppbook.model_memory.peak_microbatches`.

It also records what each ``PipelineStage`` keeps beyond autograd's saved tensors, for the
planner's ``buffers`` and held outputs (:func:`ppbook.planner.memory.stage_buffer_bytes`,
:func:`ppbook.planner.memory.held_io_bytes`): the bytes of its receive buffers after the step, and,
whenever a backward starts, the bytes of the outputs the schedule keeps per microbatch
(``fwd_cache``) and whether each kept input is a receive buffer itself.
"""

from __future__ import annotations

import argparse
import json

import torch

from ppbook import activations, launch, stages, timeline
from ppbook import dist as ppdist
from ppbook.dist import gather_to_rank0
from ppbook.models import LlamaConfig, build_model


def _after_w(events, actions) -> dict[int, int]:
    """Per stage, the most bytes one microbatch still holds when its weight-gradient pass ends
    (zero-bubble schedules: what torch keeps until ``step`` returns)."""
    out: dict[int, int] = {}
    for a in actions:
        if a.kind == "W":
            held = sum(e.delta for e in events if e.stage == a.stage and e.microbatch == a.microbatch and e.time <= a.end)
            out[a.stage] = max(out.get(a.stage, 0), held)
    return out


def spy_on_stage_io(stage) -> dict:
    """Wrap ``stage.backward_one_chunk`` to note, each time a backward starts, the largest output
    one microbatch keeps in the schedule's ``fwd_cache``, and whether every kept input is one of
    the stage's receive buffers."""
    seen = {"output_bytes": 0, "inputs_are_buffers": True}
    backward = stage.backward_one_chunk

    def spy(*args, **kwargs):
        buffers = [i.buffer for chunk in stage.args_recv_info.values() for i in chunk if i.buffer is not None]
        for outputs, inputs in stage.fwd_cache.values():
            outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
            seen["output_bytes"] = max(seen["output_bytes"], sum(o.nbytes for o in outputs))
            if not stage.is_first:
                seen["inputs_are_buffers"] &= all(any(x is b for b in buffers) for x in inputs)
        return backward(*args, **kwargs)

    stage.backward_one_chunk = spy
    return seen


def buffer_bytes(stage) -> int:
    """Bytes of every receive buffer a stage holds: activations in, gradients in."""
    infos = [i for chunk in (*stage.args_recv_info.values(), *stage.grad_recv_info.values()) for i in chunk]
    return sum(i.buffer.nbytes for i in infos if i.buffer is not None)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", required=True)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--microbatch-size", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=16)
    cli = parser.parse_args()
    info = ppdist.setup("cpu", timeout_s=120)
    p, m = info.world_size, cli.microbatches
    cfg = LlamaConfig(vocab_size=64, dim=32, n_layers=2 * p, n_heads=4, n_kv_heads=2, ffn_hidden_dim=48,
                      max_seq_len=cli.seq_len)
    full = build_model(cfg, seed=0)
    g = torch.Generator().manual_seed(0)
    seq = torch.randint(0, cfg.vocab_size, (m * cli.microbatch_size, cli.seq_len + 1), generator=g)
    tokens, targets = seq[:, :-1].contiguous(), seq[:, 1:].contiguous()  # (B, T) each
    build = launch.load_script("05_schedules.py").build
    run_args = argparse.Namespace(stages_per_rank=2, microbatches=m)
    results = {}
    for name in stages.TORCH_SCHEDULES:
        probe = activations.ActivationProbe(info.rank, enabled=True)
        rec = timeline.Recorder(info.rank)
        schedule, _, indices, num_stages = build(name, full, run_args, info, [probe, rec])  # chapter 5's placement
        kept = {s.stage_index: (s, spy_on_stage_io(s)) for s in getattr(schedule, "_stages", None) or [schedule._stage]}
        kwargs = {"target": targets, "losses": []} if num_stages - 1 in indices else {}
        schedule.step(tokens, **kwargs) if 0 in indices else schedule.step(**kwargs)
        io = {i: {"buffer_bytes": buffer_bytes(s), **seen} for i, (s, seen) in kept.items()}
        rows = gather_to_rank0((activations.to_json(probe.events), timeline.to_json(rec.events), io))
        if info.rank == 0:
            events = [e for r in rows for e in activations.from_json(r[0])]
            actions = [e for r in rows for e in timeline.from_json(r[1])]
            stage_io = {i: v for r in rows for i, v in r[2].items()}
            first_mb = {}  # bytes each stage saved for microbatch 0 (what one microbatch costs)
            for e in events:
                if e.microbatch == 0 and e.delta > 0:
                    first_mb[e.stage] = first_mb.get(e.stage, 0) + e.delta
            results[name] = {"num_stages": num_stages, "peak_bytes": activations.peak_bytes(events),
                             "peak_in_flight": activations.peak_in_flight(events),
                             "peak_in_flight_most": activations.peak_in_flight(events, fraction=0.5),
                             "bytes_per_microbatch": first_mb, "after_weight_pass": _after_w(events, actions),
                             "stage_io": stage_io}
    if info.rank == 0:
        with open(cli.json, "w") as f:
            json.dump({"world_size": p, "microbatches": m, "microbatch_size": cli.microbatch_size,
                       "seq_len": cli.seq_len, "config": cfg.__dict__, "runs": results}, f)
    ppdist.teardown()


if __name__ == "__main__":
    main()
