"""``python -m ppbook.plan --export``: the exported job read back by the engines' own config code.

torchtitan 0.3.0: the overrides are parsed by ``tyro`` with torchtitan's own registry
(``ConfigManager.register_tyro_rules``) into its own dataclasses (``ParallelismConfig``,
``TrainingConfig``, ``DebugConfig``, ``CompileConfig`` and the activation-checkpointing union), whose
``__post_init__`` validates them; then ``Trainer.Config``'s own checks (its ``__post_init__`` and
``_validate_cuda_graphs``, taken from torchtitan's trainer.py: importing the trainer pulls in
torchtitan's whole dependency set, which the suite does not install) and the pipeline's stage
count (``torchtitan.distributed.pipeline_parallel._get_pipeline_metadata``). The registry entry
named by ``--config`` is checked in torchtitan's config_registry source.

Megatron-LM: the arguments are mapped to megatron-core 0.16.1's ``TransformerConfig`` (with
``ModelParallelConfig``) and ``DistributedDataParallelConfig`` fields, built with the model's
shape, so that their ``__post_init__`` validates the layout and the recomputation.
"""

import ast
import importlib.util
import shlex
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest

from ppbook import plan
from ppbook.planner import hardware, search, shapes

tyro = pytest.importorskip("tyro", reason="pip install -r requirements.txt")
pytest.importorskip("torchtitan", reason="the Makefile installs torchtitan==0.3.0 --no-deps")
pytest.importorskip("megatron.core", reason="the Makefile installs megatron-core==0.16.1 --no-deps")


def request(model="llama3-70b", gpus=64, batch=128, seq=8192):
    return search.Request(shapes.PRESETS[model], hardware.GPUS["h100-sxm"], gpus, 8, batch, seq,
                          hardware.LINKS["nvlink-h100"], hardware.LINKS["ib-ndr400"])


def command_words(text: str) -> list[str]:
    """The words of the exported command as a shell reads them (the '#' notes dropped)."""
    return shlex.split("\n".join(x for x in text.splitlines() if not x.startswith("#")).replace("\\\n", " "))


# --- torchtitan 0.3.0 --------------------------------------------------------------------------------------

def _torchtitan_job():
    """A dataclass with the sections of torchtitan's ``Trainer.Config`` that the export sets, typed
    with torchtitan's own classes, and ``Trainer.Config``'s own validation functions."""
    from torchtitan.config import CompileConfig, DebugConfig, ParallelismConfig, TrainingConfig
    from torchtitan.distributed import activation_checkpoint as ac

    @dataclass(kw_only=True)
    class Job:
        training: TrainingConfig = field(default_factory=TrainingConfig)
        parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
        activation_checkpoint: ac.ActivationCheckpointingConfig = field(default_factory=ac.SelectiveAC.Config)
        compile: CompileConfig = field(default_factory=CompileConfig)
        debug: DebugConfig = field(default_factory=DebugConfig)
        model_spec: None = None

    import torchtitan
    trainer = Path(torchtitan.__file__).parent / "trainer.py"
    tree = ast.parse(trainer.read_text())
    config = next(n for c in tree.body if isinstance(c, ast.ClassDef) and c.name == "Trainer"
                  for n in c.body if isinstance(n, ast.ClassDef) and n.name == "Config")
    checks = [n for n in config.body if isinstance(n, ast.FunctionDef) and n.name in ("__post_init__",
                                                                                      "_validate_cuda_graphs")]
    assert len(checks) == 2, "torchtitan's Trainer.Config changed: update this test"
    scope = {"SelectiveAC": ac.SelectiveAC, "MemoryBudgetAC": ac.MemoryBudgetAC, "FlexAttention": object,
             "LocalTokenDispatcher": object, "MinimalAsyncEPTokenDispatcher": object, "HybridEPTokenDispatcher": object}
    exec(compile(ast.Module(body=checks, type_ignores=[]), str(trainer), "exec"), scope)
    Job._validate_cuda_graphs = scope["_validate_cuda_graphs"]
    return Job, scope["__post_init__"]


def torchtitan_read_back(text: str, req: search.Request):
    """The exported job as torchtitan 0.3.0's config code reads it: (module, config, parsed job)."""
    from torchtitan.config import ParallelismConfig
    from torchtitan.config.manager import ConfigManager, custom_registry

    words = command_words(text)
    at = words.index("torchtitan.train")
    assert words[at - 1] == "-m" and words[0] == "torchrun"
    rest = words[at + 1:]
    module, config = rest[rest.index("--module") + 1], rest[rest.index("--config") + 1]
    overrides = [w for i, w in enumerate(rest) if w not in ("--module", "--config") and
                 rest[i - 1] not in ("--module", "--config")]
    Job, post_init = _torchtitan_job()
    ConfigManager()  # registers torchtitan's tyro rules in custom_registry
    job = tyro.cli(Job, args=overrides, default=Job(parallelism=ParallelismConfig()), registry=custom_registry)
    post_init(job)
    return module, config, job


def registry_entries(module: str) -> set[str]:
    spec = importlib.util.find_spec(f"torchtitan.models.{module}")
    source = Path(spec.submodule_search_locations[0]) / "config_registry.py"
    return {n.name for n in ast.parse(source.read_text()).body if isinstance(n, ast.FunctionDef)}


@pytest.mark.parametrize("layout", [
    search.Layout(4, 4, 4, "Interleaved1F1B", 2, 1, 32, "fsdp", "selective", "ends"),
    search.Layout(4, 4, 4, "Interleaved1F1B", 4, 1, 32, "fsdp", "full"),
    search.Layout(8, 2, 4, "1F1B", 1, 2, 16, "none", "none"),
    search.Layout(2, 1, 32, search.NO_PIPELINE, 1, 2, 2, "fsdp", "full"),
    search.Layout(4, 2, 8, "DualPipeV", 2, 1, 16, "fsdp", "none"),
])
def test_torchtitan_export_round_trips_through_its_config_code(layout):
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
    from torchtitan.distributed.pipeline_parallel import _get_pipeline_metadata

    req = request()
    text = plan.export(search.predict(layout, req, check_memory=False), req, "torchtitan")
    assert "torchtitan 0.3.0" in text.splitlines()[0]
    module, config, job = torchtitan_read_back(text, req)
    assert (module, config) == ("llama3", "llama3_70b") and config in registry_entries(module)
    par, tr = job.parallelism, job.training
    assert (par.tensor_parallel_degree, par.pipeline_parallel_degree) == (layout.tp, layout.p)
    assert (par.data_parallel_shard_degree, par.data_parallel_replicate_degree) == \
        ((layout.dp, 1) if layout.sharding == "fsdp" else (1, layout.dp))
    assert type(job.activation_checkpoint) is {"full": FullAC.Config, "selective": SelectiveAC.Config,
                                               "none": type(None)}[layout.recompute]
    # the batch torchtitan takes per replica: the pipeline's microbatches, or one accumulation step
    assert tr.local_batch_size == (layout.b * layout.m if layout.p > 1 else layout.b)
    assert tr.global_batch_size // (tr.local_batch_size * layout.dp) == (1 if layout.p > 1 else layout.m)
    assert (tr.global_batch_size, tr.seq_len) == (req.global_batch, req.seq_len)
    if layout.p > 1:
        assert par.pipeline_parallel_schedule == layout.schedule and par.pipeline_parallel_microbatch_size == layout.b
        stages, _, first, last = _get_pipeline_metadata(SimpleNamespace(pp=layout.p), par,
                                                        SimpleNamespace(layers=[None] * req.model.layers))
        assert stages == layout.num_stages
        assert (first, last) == (search.end_weights(req) if layout.balance == "ends" else (0, 0))


def test_torchtitan_refuses_what_the_export_leaves_out():
    """The checks taken from torchtitan are live: without the export's --training.disable_cuda_graphs
    a pipelined job is refused, as torchtitan 0.3.0 refuses it."""
    req = request()
    layout = search.Layout(8, 2, 4, "1F1B", 1, 2, 16, "fsdp", "none")
    text = plan.export(search.predict(layout, req, check_memory=False), req, "torchtitan")
    with pytest.raises(ValueError, match="CUDA graphs do not support pipeline parallelism"):
        torchtitan_read_back(text.replace("--training.disable_cuda_graphs", ""), req)


def test_torchtitan_export_without_a_registry_entry_says_so():
    req = request("mistral-7b", 8, 64, 4096)
    text = plan.export(search.predict(search.Layout(1, 1, 8, search.NO_PIPELINE, 1, 1, 8, "fsdp", "full"), req,
                                      check_memory=False), req, "torchtitan")
    assert "has no registry entry for mistral-7b" in text and "--config YOUR_ENTRY" in text


# --- Megatron-LM (megatron-core 0.16.1) --------------------------------------------------------------------

TRANSFORMER = {"--tensor-model-parallel-size": "tensor_model_parallel_size",
               "--pipeline-model-parallel-size": "pipeline_model_parallel_size",
               "--num-virtual-stages-per-pipeline-rank": "virtual_pipeline_model_parallel_size",
               "--expert-model-parallel-size": "expert_model_parallel_size",
               "--decoder-first-pipeline-num-layers": "num_layers_in_first_pipeline_stage",
               "--decoder-last-pipeline-num-layers": "num_layers_in_last_pipeline_stage",
               "--sequence-parallel": "sequence_parallel", "--bf16": "bf16",
               "--recompute-granularity": "recompute_granularity", "--recompute-method": "recompute_method",
               "--recompute-num-layers": "recompute_num_layers", "--recompute-modules": "recompute_modules"}
DDP = {"--use-distributed-optimizer": "use_distributed_optimizer", "--use-megatron-fsdp": "use_megatron_fsdp",
       "--data-parallel-sharding-strategy": "data_parallel_sharding_strategy"}
TRAINING = {"--micro-batch-size", "--global-batch-size", "--seq-length", "--ckpt-format"}  # Megatron-LM's trainer


def megatron_read_back(text: str, req: search.Request):
    """The exported arguments as megatron-core's config classes take them."""
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.transformer.transformer_config import TransformerConfig

    words = command_words(text)
    flags = {w: words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("--") else True
             for i, w in enumerate(words) if w.startswith("--")}
    unknown = set(flags) - set(TRANSFORMER) - set(DDP) - TRAINING
    assert not unknown, f"flags this test does not map: {unknown}"

    def typed(cls, name, value):
        kind = cls.__dataclass_fields__[name].type
        return value if value is True or "str" in str(kind) or "Literal" in str(kind) else int(value)

    import torch

    m = req.model
    kwargs = {TRANSFORMER[f]: typed(TransformerConfig, TRANSFORMER[f], v) for f, v in flags.items() if f in TRANSFORMER}
    if kwargs.get("bf16"):  # Megatron-LM's trainer derives these from --bf16 (core_transformer_config_from_args)
        kwargs.update(params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16)
    if m.moe:
        kwargs.update(num_moe_experts=m.experts, moe_router_topk=m.top_k, moe_ffn_hidden_size=m.expert_ffn)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tc = TransformerConfig(num_layers=m.layers, hidden_size=m.hidden, num_attention_heads=m.heads,
                               num_query_groups=m.kv_heads, ffn_hidden_size=m.ffn, **kwargs)
        ddp = DistributedDataParallelConfig(**{DDP[f]: v for f, v in flags.items() if f in DDP})
    return flags, tc, ddp


@pytest.mark.parametrize("layout", [
    search.Layout(4, 2, 8, "1F1B", 1, 1, 16, "zero1", "full", "ends"),
    search.Layout(8, 2, 4, "1F1B", 1, 2, 16, "fsdp", "full"),
    search.Layout(2, 1, 32, search.NO_PIPELINE, 1, 2, 2, "none", "none"),
    search.Layout(4, 4, 4, "Interleaved1F1B", 5, 1, 32, "zero1", "none"),
])
def test_megatron_export_round_trips_through_megatron_core(layout):
    req = request()
    text = plan.export(search.predict(layout, req, check_memory=False), req, "megatron")
    flags, tc, ddp = megatron_read_back(text, req)
    assert (tc.tensor_model_parallel_size, tc.pipeline_model_parallel_size) == (layout.tp, layout.p)
    assert (tc.virtual_pipeline_model_parallel_size or 1) == layout.num_stages // layout.p
    assert tc.sequence_parallel == (layout.tp > 1) and tc.bf16
    assert tc.recompute_granularity == {"none": None}.get(layout.recompute, layout.recompute)
    assert ddp.use_distributed_optimizer == (layout.sharding != "none")
    assert ddp.data_parallel_sharding_strategy == {"fsdp": "optim_grads_params", "zero2": "optim_grads"}.get(
        layout.sharding, "no_shard")
    assert flags["--micro-batch-size"] == str(layout.b) and flags["--global-batch-size"] == str(req.global_batch)
    if layout.balance == "ends":
        layers = [len(x) for x in search.layers_of(layout, req)]
        assert (tc.num_layers_in_first_pipeline_stage, tc.num_layers_in_last_pipeline_stage) == (layers[0], layers[-1])


def test_megatron_core_refuses_what_the_export_refuses():
    """megatron-core's own validation is live: under interleaving it lightens ranks, not stages, and
    refuses a first rank whose layers do not split over its stages; the export refuses the planner's
    lightened first stage there, and an uneven split, as Megatron-LM would."""
    req = request()
    layout = search.Layout(4, 4, 4, "Interleaved1F1B", 2, 1, 32, "zero1", "full")
    text = plan.export(search.predict(layout, req, check_memory=False), req, "megatron")
    with pytest.raises(ValueError, match="must be divisible by virtual pipeline"):
        megatron_read_back(text + " --decoder-first-pipeline-num-layers 9", req)
    for refused, why in ((search.Layout(4, 4, 4, "Interleaved1F1B", 2, 1, 32, "zero1", "full", "ends"), "ranks, not"),
                         (search.Layout(4, 2, 8, "Interleaved1F1B", 3, 1, 16, "zero1", "full"), "do not split")):
        assert why in plan.runs_on(refused, "megatron", req)
        with pytest.raises(ValueError, match=why):
            plan.export(search.predict(refused, req, check_memory=False), req, "megatron")


def test_megatron_selective_is_refused_not_mapped():
    """Megatron's selective recomputes core attention only: the planner's op-level count does not hold there."""
    req = request()
    layout = search.Layout(4, 4, 4, "Interleaved1F1B", 2, 1, 32, "zero1", "selective")
    assert "selective" in plan.runs_on(layout, "megatron")
    with pytest.raises(ValueError, match="twice the activations"):
        plan.export(search.predict(layout, req, check_memory=False), req, "megatron")
    assert plan.runs_on(search.Layout(4, 4, 4, "Interleaved1F1B", 2, 1, 32, "fsdp", "selective"), "torchtitan") is None


def test_torchtitan_export_refuses_dualpipev_overlap_it_does_not_run():
    """A plan that hides DualPipeV's all-to-all under its pair (--overlap-f-b) is not torchtitan
    0.3.0's: outside its experiments, nothing in it registers a function for torch's OVERLAP_F_B
    actions (the overlap added after it, torchtitan/distributed/dual_pipe_v.py, refuses activation
    checkpointing)."""
    from dataclasses import replace

    source = Path(importlib.util.find_spec("torchtitan").origin).parent
    registers = [f for f in source.rglob("*.py") if "experiments" not in f.parts
                 and ("OVERLAP_F_B" in f.read_text() or "register_custom_function" in f.read_text())]
    assert not registers, registers
    req = request("mixtral-8x7b", 16, 64, 4096)
    layout = search.Layout(1, 2, 8, "DualPipeV", 2, 1, 8, "fsdp", "full", "even", 2)
    assert plan.runs_on(layout, "torchtitan", req) is None
    assert "plan without --overlap-f-b" in plan.runs_on(layout, "torchtitan", replace(req, overlap_f_b=True))
    assert plan.runs_on(replace(layout, ep=1), "torchtitan", replace(req, overlap_f_b=True)) is None
