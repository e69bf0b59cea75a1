"""Which StateDictOptions survive a save and resume of a two-stage pipeline (chapter 7's other pitfalls).

    torchrun --standalone --nproc-per-node 2 tests/helpers/checkpoint_options.py --json out.json

For each option set, every rank saves its stage and a fresh AdamW state with DCP, loads it back,
and calls set_state_dict; rank 0 writes, per option set and rank, how many model and optimizer
entries get_state_dict returned and where it failed (or "ok").
"""

import argparse
import json
import shutil
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from ppbook.models import GPTConfig, build_model
from ppbook.stages import stage_module

OPTIONS = {
    "flatten": dict(flatten_optimizer_state_dict=True),
    "flatten+cpu_offload": dict(flatten_optimizer_state_dict=True, cpu_offload=True),
    "flatten+full_state_dict": dict(flatten_optimizer_state_dict=True, full_state_dict=True),
    "flatten+full_state_dict+cpu_offload": dict(flatten_optimizer_state_dict=True, full_state_dict=True,
                                                cpu_offload=True),
}


def try_options(options, folder, rank, world):
    stage = stage_module(build_model(GPTConfig(vocab_size=32, dim=16, n_layers=2, n_heads=2, max_seq_len=8)),
                         rank, world)
    opt = torch.optim.AdamW(stage.parameters())
    model_sd, optim_sd = get_state_dict(stage, opt, options=options)
    out = {"model_entries": len(model_sd), "optim_entries": len(optim_sd)}
    for phase in ("save", "load", "set_state_dict"):
        try:
            if phase == "save":
                dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=folder)
            elif phase == "load":
                model_sd, optim_sd = get_state_dict(stage, opt, options=options)
                state = {"model": model_sd, "optim": optim_sd}
                dcp.load(state, checkpoint_id=folder)
            else:
                set_state_dict(stage, opt, model_state_dict=state["model"], optim_state_dict=state["optim"],
                               options=options)
        except Exception as err:  # noqa: BLE001  what fails, and how, is the measurement
            out["failed"] = f"{phase}: {type(err).__name__}: {err}"[:200]
            return out
    out["failed"] = None
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--json", required=True)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    root = [tempfile.mkdtemp(prefix="ppbook-options-") if rank == 0 else None]
    dist.broadcast_object_list(root)
    results = {}
    for name, kwargs in OPTIONS.items():
        mine = try_options(StateDictOptions(**kwargs), f"{root[0]}/{name}", rank, world)
        everyone = [None] * world
        dist.all_gather_object(everyone, mine)
        results[name] = everyone
    dist.barrier()
    if rank == 0:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
        shutil.rmtree(root[0], ignore_errors=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
