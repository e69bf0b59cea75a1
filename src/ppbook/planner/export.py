"""What each framework runs, for the planner's exports: the options torchtitan 0.3.0 and Megatron-LM
accept, torchtitan's registry entries for the presets, and Megatron's sharding flags.

Introduced in "Choosing a pipeline". Data only, read by ``python -m ppbook.plan --export`` and by
the planner page (through :func:`ppbook.explorer.planner_data`), so both export the same text.
"""

from __future__ import annotations

from ppbook.planner import memory, schedules, search

# What each framework can run, for --export: torchtitan 0.3.0 runs torch's schedules and shards with FSDP2
# (or replicates), with full, op-level selective (the planner's "selective") or no checkpointing; Megatron-LM
# runs 1F1B and interleaved 1F1B, and shards with its distributed optimizer (ZeRO-1) or Megatron-Core's
# Megatron-FSDP (gradients too: optim_grads; weights too: optim_grads_params). Megatron's "selective"
# recomputes core attention only (recompute_modules=["core_attn"]), which keeps about twice the activations
# the planner counts for op-level selective checkpointing: it is refused, not mapped.
FRAMEWORKS = {
    "torchtitan": {"schedules": (search.NO_PIPELINE, *schedules.TORCH_SCHEDULES), "shardings": ("none", "fsdp"),
                   "recomputes": memory.RECOMPUTE},
    "megatron": {"schedules": (search.NO_PIPELINE, "1F1B", "Interleaved1F1B"), "shardings": memory.SHARDING,
                 "recomputes": ("none", "full")},
}
TORCHTITAN_VERSION = "0.3.0"
# torchtitan 0.3.0's config registry entries for the planner's presets: (--module, --config, model flavour)
TORCHTITAN_REGISTRY = {
    "llama3-8b": ("llama3", "llama3_8b", "8B"),
    "llama3-70b": ("llama3", "llama3_70b", "70B"),
    "llama3-405b": ("llama3", "llama3_405b", "405B"),
    "deepseek-v3": ("deepseek_v3", "deepseek_v3_671b", "671B"),
}
MEGATRON_CORE_VERSION = "0.16.1"
MEGATRON_SHARDING = {
    "none": [],
    "zero1": ["--use-distributed-optimizer"],
    "zero2": ["--use-megatron-fsdp", "--data-parallel-sharding-strategy optim_grads", "--use-distributed-optimizer",
              "--ckpt-format fsdp_dtensor"],
    "fsdp": ["--use-megatron-fsdp", "--data-parallel-sharding-strategy optim_grads_params",
             "--use-distributed-optimizer", "--ckpt-format fsdp_dtensor"],
}
