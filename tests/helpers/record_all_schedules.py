"""Test helper (not a companion script): run every schedule class of torch.distributed.pipelining
with the timeline recorder attached, and check gradients against one process.

    torchrun --standalone --nproc-per-node 2 tests/helpers/record_all_schedules.py --json out.json

Placement: :func:`ppbook.stages.stage_indices` (single-stage schedules put stage r on rank r;
looped ones stages r and r + p; V-shaped ones stages r and 2p - 1 - r).
"""

from __future__ import annotations

import argparse
import copy
import json

import torch.distributed as dist
from torch.distributed import pipelining as pp

from ppbook import dist as ppdist
from ppbook import timeline, workload
from ppbook.stages import TORCH_SCHEDULES, placement, stage_indices, stage_module


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", required=True)
    parser.add_argument("--microbatches", type=int, default=4)
    cli = parser.parse_args()
    args = argparse.Namespace(vocab=64, dim=32, layers=4, heads=4, seq_len=16, batch_size=8, seed=0,
                              dtype="float64", microbatches=cli.microbatches)
    info = ppdist.setup("cpu", timeout_s=60)
    p, m = info.world_size, cli.microbatches
    full = workload.full_model(args, info.device)
    tokens, targets = workload.make_batch(args, 0)
    reference = copy.deepcopy(full)
    workload.reference_backward(reference, tokens, targets, m)
    results = {}
    for name in TORCH_SCHEDULES:
        single = placement(name) == "single"
        indices = stage_indices(name, info.rank, p)
        num_stages = p * len(indices)
        rec = timeline.Recorder(info.rank)
        mods, stages = [], []
        for i in indices:
            mod = stage_module(copy.deepcopy(full), i, num_stages)
            stage = pp.PipelineStage(mod, stage_index=i, num_stages=num_stages, device=info.device)
            rec.attach(stage)
            mods.append(mod)
            stages.append(stage)
        cls = getattr(pp, f"Schedule{name}")
        schedule = cls(stages[0] if single else stages, n_microbatches=m, loss_fn=workload.loss_fn)
        holds_first = 0 in indices
        holds_last = num_stages - 1 in indices
        kwargs = {"target": targets, "losses": []} if holds_last else {}
        schedule.step(tokens, **kwargs) if holds_first else schedule.step(**kwargs)
        worst = max(workload.compare(mod, reference)["max_grad_diff"] for mod in mods)
        events = timeline.gather(rec)
        worst_all = [None] * p
        dist.all_gather_object(worst_all, worst)
        if info.rank == 0:
            results[f"Schedule{name}"] = {"num_stages": num_stages, "max_grad_diff": max(worst_all),
                                          "events": timeline.to_json(events)}
    if info.rank == 0:
        with open(cli.json, "w") as f:
            json.dump(results, f)
    ppdist.teardown()


if __name__ == "__main__":
    main()
