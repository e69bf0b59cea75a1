"""Test helper (not a companion script): run each of torch's seven schedule classes on the
book's Llama with :class:`ppbook.activations.ActivationProbe` on every stage, for one step, and
write the saved-activation bytes each stage held at its peak.

    torchrun --standalone --nproc-per-node 2 tests/helpers/record_llama_memory.py --json out.json

Stages are built and placed by chapter 5's `scripts/05_schedules.py` (`build`): stage r on rank r (GPipe, 1F1B), stages r, r + p (looped), r and
2p - 1 - r (V-shaped). ``tests/test_plan_memory.py`` compares the result with
:func:`ppbook.memory.stage_activation_bytes` times :func:`ppbook.memory.peak_microbatches`.
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
        kwargs = {"target": targets, "losses": []} if num_stages - 1 in indices else {}
        schedule.step(tokens, **kwargs) if 0 in indices else schedule.step(**kwargs)
        rows = gather_to_rank0((activations.to_json(probe.events), timeline.to_json(rec.events)))
        if info.rank == 0:
            events = [e for r in rows for e in activations.from_json(r[0])]
            actions = [e for r in rows for e in timeline.from_json(r[1])]
            first_mb = {}  # bytes each stage saved for microbatch 0 (what one microbatch costs)
            for e in events:
                if e.microbatch == 0 and e.delta > 0:
                    first_mb[e.stage] = first_mb.get(e.stage, 0) + e.delta
            results[name] = {"num_stages": num_stages, "peak_bytes": activations.peak_bytes(events),
                             "peak_in_flight": activations.peak_in_flight(events),
                             "peak_in_flight_most": activations.peak_in_flight(events, fraction=0.5),
                             "bytes_per_microbatch": first_mb, "after_weight_pass": _after_w(events, actions)}
    if info.rank == 0:
        with open(cli.json, "w") as f:
            json.dump({"world_size": p, "microbatches": m, "microbatch_size": cli.microbatch_size,
                       "seq_len": cli.seq_len, "config": cfg.__dict__, "runs": results}, f)
    ppdist.teardown()


if __name__ == "__main__":
    main()
