"""What each framework runs, for the planner's exports: the options torchtitan 0.3.0 and Megatron-LM
accept, torchtitan's registry entries for the presets and what they set that a reader must replace,
Megatron's sharding flags, the flags of what the planner times beyond the layout (the experts' dispatcher,
FP8 recipes, optimizers; issue 52), and the placeholders an export leaves for the reader to fill in.

Introduced in "Choosing a pipeline". Data only, read by ``python -m ppbook.plan --export`` and by
the planner page (through :func:`ppbook.explorer.planner_data`), so both export the same text.
``tests/test_plan_export.py`` reads every export back with the framework's own parser (torchtitan
0.3.0's ``ConfigManager`` on its registry entry; Megatron-LM's flags at :data:`MEGATRON_LM_RELEASE`)
and holds the facts below to torchtitan's registry.
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
# what every registry entry above sets that a job must replace, as the export overrides it, in order; a value in
# <ANGLE BRACKETS> is a placeholder (PLACEHOLDERS says what to fill in)
TORCHTITAN_OVERRIDES = (
    "--hf_assets_path <HF_ASSETS>",                            # ./assets/hf/Llama-3.1-70B and the like
    "--dataloader.dataset <DATASET>",                          # c4
    "--training.steps <STEPS>",                                # 1000 (10000 for DeepSeek-V3)
    "--optimizer.param_groups.0.optimizer_kwargs.lr <LR>",     # 1.5e-4 and the like
    "--lr_scheduler.warmup_steps <WARMUP_STEPS>",              # 200 (2000)
    "--dump_folder <OUTPUT_DIR>",                              # ./outputs: logs, and checkpoints under it
    "--checkpoint.enable",                                     # off: no checkpoint would be written
    "--profiler.no-enable_profiling",                          # on every 100 steps (the planner's time has none)
)
# what the registry entries set alike and the export keeps, said once in its notes: the loss in
# ChunkedLossWrapper of this many chunks along the sequence (tests/test_plan_export.py holds it to torchtitan's)
TORCHTITAN_LOSS_CHUNKS = 8
TORCHTITAN_CHECKPOINT_INTERVAL = 500
# what a registry entry sets that the planner does not time, and the CLI cannot undo (model_spec is not on it)
TORCHTITAN_ENTRY_NOTES = {
    "llama3_405b": ("converts its linear layers to Float8 (torchao) and compiles the model with asynchronous "
                    "tensor parallelism: the planner times bf16 linears, so its time is not this job's; for a bf16 "
                    "run, write an entry without Float8LinearConverter"),
    "deepseek_v3_671b": "compiles the loss (torch.compile), which the planner does not time",
}
# Megatron-LM's command line is read from its release's megatron/training/arguments.py (the parser is not in the
# megatron-core wheel); its config classes, with which the tests also validate a layout, from megatron-core
MEGATRON_LM_RELEASE = "core_v0.19.0"
MEGATRON_CORE_VERSION = "0.16.1"  # the newest megatron-core wheel for Python 3.11 (0.17 and later need 3.12)
MEGATRON_VOCAB_DIVISOR = 128  # --make-vocab-size-divisible-by's default: the vocabulary is padded to it x tp
# Megatron-LM's command line for the planner's MLPs (the others it has no flag for)
MEGATRON_MLP = {"swiglu": ["--swiglu"], "gelu": [], "relu2": ["--squared-relu"]}
PLACEHOLDERS = {
    "HEAD_NODE": "the address of the first node (torchrun's rendezvous)",
    "HF_ASSETS": "the folder of the model's Hugging Face tokenizer and config.json (torchtitan's "
                 "scripts/download_hf_assets.py writes it)",
    "DATASET": "a data set torchtitan registers (torchtitan/hf_datasets/text_datasets.py: c4, ...) or one you add there",
    "STEPS": "the optimizer steps to train", "LR": "the peak learning rate",
    "WARMUP_STEPS": "the learning rate's warm-up steps", "OUTPUT_DIR": "where logs and checkpoints go",
    "MODULE": "the module of your registry entry", "CONFIG": "your registry entry (a function returning Trainer.Config)",
    "DATA_PREFIX": "the prefix of your data set as Megatron-LM's tools/preprocess_data.py writes it (PREFIX.bin, "
                   "PREFIX.idx)",
    "TOKENIZER": "the model's Hugging Face tokenizer (a name or a folder)",
    "ROPE_BASE": "the model's rotary base (rope_theta in its config.json; 500000 for Llama 3)",
    "TRAIN_ITERS": "the optimizer steps to train", "WARMUP_ITERS": "the learning rate's warm-up steps",
    "CHECKPOINT_DIR": "where checkpoints are written and read", "SAVE_INTERVAL": "steps between checkpoints",
}
MEGATRON_SHARDING = {
    "none": [],
    "zero1": ["--use-distributed-optimizer"],
    "zero2": ["--use-megatron-fsdp", "--data-parallel-sharding-strategy optim_grads", "--use-distributed-optimizer",
              "--ckpt-format fsdp_dtensor"],
    "fsdp": ["--use-megatron-fsdp", "--data-parallel-sharding-strategy optim_grads_params",
             "--use-distributed-optimizer", "--ckpt-format fsdp_dtensor"],
}
# the overlap the planner's time assumes (search._dp_exposed): gradients reduced behind the backward, and with a
# distributed optimizer the updated weights gathered behind the next forward; Megatron-LM does neither by default
MEGATRON_OVERLAP = {"none": ["--overlap-grad-reduce"], "zero1": ["--overlap-grad-reduce", "--overlap-param-gather"],
                    "zero2": ["--overlap-grad-reduce", "--overlap-param-gather"],
                    "fsdp": ["--overlap-grad-reduce", "--overlap-param-gather"]}
# What the planner times beyond the layout (issue 52), as Megatron-LM's command line says it (the flags of
# MEGATRON_LM_RELEASE's parser, tests/data/megatron_lm_arguments.json). The experts' fold: Megatron-Core splits each
# expert over tp GPUs unless told otherwise (--expert-tensor-parallel-size defaults to tp), so a mixture of experts
# always names its etp. How tokens reach the experts (search.DISPATCHERS): DeepEP through the flex dispatcher.
MEGATRON_DISPATCHER = {"alltoall": ["--moe-token-dispatcher-type alltoall"],
                       "deepep": ["--moe-token-dispatcher-type flex", "--moe-flex-dispatcher-backend deepep"]}
# FP8 (memory.PRECISIONS) as Megatron-Bridge's recipes of the same scaling set it (NVIDIA-NeMo/Megatron-Bridge,
# src/megatron/bridge/training/mixed_precision.py @ 05097809: bf16_with_fp8_delayed_scaling_mixed,
# bf16_with_fp8_current_scaling_mixed, bf16_with_fp8_subchannel_scaling_mixed, bf16_with_mxfp8_mixed): E4M3 forward
# and E5M2 gradients ("hybrid") but for MXFP8; delayed scaling with the history of maxima the planner counts
MEGATRON_PRECISION = {
    "bf16": [],
    "fp8-delayed": ["--fp8-format hybrid", "--fp8-recipe delayed",
                    f"--fp8-amax-history-len {memory.PRECISIONS['fp8-delayed'].amax_history}",
                    "--fp8-amax-compute-algo max"],
    "fp8-current": ["--fp8-format hybrid", "--fp8-recipe tensorwise"],
    "fp8-blockwise": ["--fp8-format hybrid", "--fp8-recipe blockwise"],
    "mxfp8": ["--fp8-format e4m3", "--fp8-recipe mxfp8"],
}
# the optimizers' state the planner counts (memory.OPTIMIZER_STATE); Megatron-LM has no Adafactor (plan.runs_on)
MEGATRON_OPTIMIZER = {"adamw": [], "adamw-bf16": ["--use-precision-aware-optimizer", "--exp-avg-dtype bf16",
                                                  "--exp-avg-sq-dtype bf16"],
                      "muon": ["--optimizer muon"], "sgd": ["--optimizer sgd"]}
# torchtitan 0.3.0 turns FP8 on in a registry entry (its converters), not on the command line, and has torchao's
# rowwise Float8 recipes and MXFP8 (torchtitan/components/quantization: Float8LinearConverter's recipe_name
# "rowwise" or "rowwise_with_gw_hp", MXFP8LinearConverter): what the export says of each precision the planner times
TORCHTITAN_PRECISION_NOTES = {
    "fp8-delayed": "torchtitan 0.3.0 has no delayed scaling (torchao's Float8 recipes there are rowwise): this job "
                   "runs bf16 linears, not the FP8 the planner timed",
    "fp8-current": "torchtitan 0.3.0 has no per-tensor FP8 recipe (torchao's Float8 recipes there are rowwise, which "
                   "the planner does not time): this job runs bf16 linears, not the FP8 the planner timed",
    "fp8-blockwise": "torchtitan 0.3.0 has no blockwise FP8 recipe: this job runs bf16 linears, not the FP8 the planner "
                     "timed",
    "mxfp8": "torchtitan 0.3.0 turns MXFP8 on in the registry entry, not on the command line: add "
             "MXFP8LinearConverter.Config() to your entry's converters (Blackwell GPUs)",
}
