"""``python -m ppbook.plan --export``: the exported command read back by the framework's own parser.

torchtitan 0.3.0: the job, its placeholders filled, goes to torchtitan's own ``ConfigManager``
(``tests/helpers/torchtitan_read_back.py``, in a process of its own): it loads the registry entry
the job names and applies the overrides with tyro into ``Trainer.Config``, whose own
``__post_init__`` validates the result; the pipeline's stages are counted as torchtitan cuts them.
What the registry entry sets and the export must replace (data, tokenizer, steps, learning rate,
profiling, output folder) is read back overridden; what it keeps (the chunked loss) is what the
export's notes say.

Megatron-LM: ``pretrain_gpt.py``'s arguments, placeholders filled, are parsed by Megatron-LM's own
flags (every flag of ``megatron/training/arguments.py`` at :data:`export.MEGATRON_LM_RELEASE`,
written by ``tools/megatron_arguments.py`` to ``tests/data/megatron_lm_arguments.json``: its
parser needs Python 3.12 and triton), then mapped to megatron-core's ``TransformerConfig`` and
``DistributedDataParallelConfig`` (the newest wheel for Python 3.11, :data:`export.MEGATRON_CORE_VERSION`),
whose ``__post_init__`` validates the layout with the model's shape as the command gives it.
"""

import argparse
import ast
import importlib.util
import json
import re
import shlex
import subprocess
import sys
import warnings
from dataclasses import replace
from unittest import mock
from pathlib import Path

import pytest

from ppbook import plan
from ppbook.planner import export, hardware, memory, search, shapes

# found, not imported: importing megatron-core compiles its fused kernels (3 CPU-s), which every
# pytest worker would pay at collection; the tests that use it import it
for _module, _why in (("tyro", "pip install -r requirements.txt"),
                      ("torchtitan", "the Makefile installs torchtitan==0.3.0 --no-deps"),
                      ("megatron.core", "the Makefile installs megatron-core==0.16.1 --no-deps")):
    if importlib.util.find_spec(_module) is None:
        pytest.skip(f"{_module} is not installed: {_why}", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[1]
FILLED = {"HEAD_NODE": "node0", "HF_ASSETS": "/data/hf/llama", "DATASET": "c4_test", "STEPS": "1234", "LR": "0.0003",
          "WARMUP_STEPS": "17", "OUTPUT_DIR": "/data/runs/one", "MODULE": "llama3", "CONFIG": "llama3_8b",
          "DATA_PREFIX": "/data/c4_text_document", "TOKENIZER": "meta-llama/Llama-3.1-70B", "ROPE_BASE": "500000",
          "TRAIN_ITERS": "1234", "WARMUP_ITERS": "17", "CHECKPOINT_DIR": "/data/ckpt", "SAVE_INTERVAL": "500"}


def request(model="llama3-70b", gpus=64, batch=128, seq=8192):
    return search.Request(shapes.PRESETS[model], hardware.GPUS["h100-sxm"], gpus, 8, batch, seq,
                          hardware.LINKS["nvlink-h100"], hardware.LINKS["ib-ndr400"])


def command_words(text: str) -> list[str]:
    """The words of the exported command as a shell reads them, its placeholders filled (the '#'
    notes dropped): every placeholder is named in the notes, with what to fill in."""
    notes = "\n".join(x for x in text.splitlines() if x.startswith("#"))
    command = "\n".join(x for x in text.splitlines() if not x.startswith("#"))
    used = set(re.findall(r"<([A-Z_]+)>", command))
    for name in used:
        assert f"<{name}> {export.PLACEHOLDERS[name]}" in notes, name
    return shlex.split(re.sub(r"<([A-Z_]+)>", lambda m: FILLED[m.group(1)], command).replace("\\\n", " "))


def exported(layout: search.Layout, req: search.Request, kind: str) -> str:
    return plan.export(search.predict(layout, req, check_memory=False), req, kind)


# --- torchtitan 0.3.0 --------------------------------------------------------------------------------------

def torchtitan_read_back(texts: list[str]) -> list[dict]:
    """The exported jobs as torchtitan 0.3.0's ConfigManager reads them (tests/helpers/torchtitan_read_back.py)."""
    jobs = []
    for text in texts:
        words = command_words(text)
        at = words.index("torchtitan.train")
        assert words[at - 1] == "-m" and words[0] == "torchrun"
        jobs.append({"argv": words[at + 1:]})
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "helpers" / "torchtitan_read_back.py")],
                          input=json.dumps(jobs), capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


TT_LAYOUTS = [
    search.Layout(4, 4, 4, "Interleaved1F1B", 2, 1, 32, "fsdp", "selective", "ends"),
    search.Layout(4, 4, 4, "Interleaved1F1B", 4, 1, 32, "fsdp", "full"),
    search.Layout(8, 2, 4, "1F1B", 1, 2, 16, "none", "none"),
    search.Layout(2, 1, 32, search.NO_PIPELINE, 1, 2, 2, "fsdp", "full"),
    search.Layout(4, 2, 8, "DualPipeV", 2, 1, 16, "fsdp", "none"),
    search.Layout(4, 2, 4, "1F1B", 1, 1, 32, "fsdp", "full", "even", 1, 2),   # context parallelism: cp = 2
]


@pytest.fixture(scope="module")
def torchtitan_jobs():
    req = request()
    texts = [exported(layout, req, "torchtitan") for layout in TT_LAYOUTS]
    plain = plan.export(search.Prediction(TT_LAYOUTS[0]), req, "torchtitan")
    # the registry entry alone (the job's command line without its overrides), and the job without the flag
    # torchtitan's checks demand under a pipeline
    bare = f"torchrun --nnodes 8 --nproc-per-node 8 -m torchtitan.train --module llama3 --config llama3_70b"
    without = texts[2].replace("--training.disable_cuda_graphs", "")
    return req, texts, torchtitan_read_back(texts + [bare, without]) + [plain]


def test_torchtitan_reads_every_export_back_with_the_overrides_a_run_needs(torchtitan_jobs):
    req, texts, got = torchtitan_jobs
    for layout, text, job in zip(TT_LAYOUTS, texts, got):
        assert "error" not in job, (layout.label(), job)
        assert text.startswith("# torchtitan 0.3.0") and "registry entry llama3_70b" in text.splitlines()[0]
        par, tr = job["parallelism"], job["training"]
        assert (par["tensor_parallel_degree"], par["pipeline_parallel_degree"], par["context_parallel_degree"]) == \
            (layout.tp, layout.p, layout.cp)
        assert (par["data_parallel_shard_degree"], par["data_parallel_replicate_degree"]) == \
            ((layout.dp, 1) if layout.sharding == "fsdp" else (1, layout.dp))
        assert job["activation_checkpoint"] is None if layout.recompute == "none" else \
            job["activation_checkpoint"]["_type"] == {"full": "FullAC.Config", "selective": "SelectiveAC.Config"}[
                layout.recompute]
        # the batch torchtitan takes per replica: the pipeline's microbatches, or one accumulation step
        assert tr["local_batch_size"] == (layout.b * layout.m if layout.p > 1 else layout.b)
        assert (tr["global_batch_size"], tr["seq_len"]) == (req.global_batch, req.seq_len)
        if layout.p > 1:
            assert par["pipeline_parallel_schedule"] == layout.schedule
            assert par["pipeline_parallel_microbatch_size"] == layout.b
            assert job["pipeline"]["stages"] == layout.num_stages
            assert (job["pipeline"]["first_less"], job["pipeline"]["last_less"]) == \
                (search.end_weights(req) if layout.balance == "ends" else (0, 0))
        # what the registry entry sets that a run must replace: read back as the reader filled it in
        assert (job["hf_assets_path"], job["dataloader"]["dataset"], tr["steps"], job["dump_folder"]) == \
            (FILLED["HF_ASSETS"], FILLED["DATASET"], int(FILLED["STEPS"]), FILLED["OUTPUT_DIR"])
        assert job["optimizer"]["param_groups"][0]["optimizer_kwargs"]["lr"] == float(FILLED["LR"])
        assert job["lr_scheduler"]["warmup_steps"] == int(FILLED["WARMUP_STEPS"])
        assert job["checkpoint"]["enable"] and not job["profiler"]["enable_profiling"]
        assert job["model"]["layers"] == req.model.layers and job["model"]["dim"] == req.model.hidden


def test_the_export_replaces_what_the_registry_entry_would_run_and_says_what_it_keeps(torchtitan_jobs):
    """The registry entry alone would train on C4 with a tokenizer folder of its own, for its own
    steps, profiling every 100, writing no checkpoint; its loss is chunked as the notes say."""
    req, texts, got = torchtitan_jobs
    bare, plain = got[len(TT_LAYOUTS)], got[-1]
    assert "error" not in bare, bare
    assert bare["dataloader"]["dataset"] == "c4" and bare["hf_assets_path"].startswith("./assets/hf/")
    assert bare["profiler"]["enable_profiling"] and not bare["checkpoint"]["enable"] and bare["training"]["steps"] == 1000
    assert bare["loss"]["_type"] == "ChunkedLossWrapper.Config"
    assert bare["loss"]["num_chunks"] == export.TORCHTITAN_LOSS_CHUNKS
    assert bare["checkpoint"]["interval"] == export.TORCHTITAN_CHECKPOINT_INTERVAL
    for override in export.TORCHTITAN_OVERRIDES:
        assert override in texts[0]
    note = next(x for x in texts[0].splitlines() if x.startswith("# kept from the registry entry"))
    logits = max(r.logits for r in search.predict(TT_LAYOUTS[0], req, check_memory=False).memory)
    assert f"ChunkedLossWrapper, {export.TORCHTITAN_LOSS_CHUNKS} chunks" in note and f"{logits / 1e9:.1f} GB" in note
    assert plain == texts[0]  # the same text from a prediction without its memory (the page's case)


def test_torchtitan_refuses_what_the_export_leaves_out(torchtitan_jobs):
    """torchtitan's checks are live: without the export's --training.disable_cuda_graphs a pipelined
    job is refused, as torchtitan 0.3.0 refuses it."""
    _, _, got = torchtitan_jobs
    assert "CUDA graphs do not support pipeline parallelism" in got[len(TT_LAYOUTS) + 1]["error"]


def test_the_registry_entries_are_what_the_export_says_they_are():
    """The notes' facts about torchtitan 0.3.0's registry: each entry the presets use exists; the
    405B entry converts its linears to Float8 and compiles with asynchronous tensor parallelism
    (the note says the planner's time is not that job's)."""
    for module, config, _ in export.TORCHTITAN_REGISTRY.values():
        spec = importlib.util.find_spec(f"torchtitan.models.{module}")
        source = (Path(spec.submodule_search_locations[0]) / "config_registry.py").read_text()
        funcs = {n.name: ast.get_source_segment(source, n) for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)}
        assert config in funcs
        body = funcs[config]
        assert ("Float8LinearConverter" in body and "enable_async_tensor_parallel=True" in body) == \
            (config == "llama3_405b")
        assert ("CompileConfig" in body) == (config in export.TORCHTITAN_ENTRY_NOTES), config
        assert f"ChunkedLossWrapper.Config(" in body


def test_torchtitan_export_without_a_registry_entry_names_its_placeholders():
    req = request("mistral-7b", 8, 64, 4096)
    text = exported(search.Layout(1, 1, 8, search.NO_PIPELINE, 1, 1, 8, "fsdp", "full"), req, "torchtitan")
    assert "has no registry entry for mistral-7b" in text and "--module <MODULE> --config <CONFIG>" in text
    command_words(text)  # every placeholder named


# --- Megatron-LM -------------------------------------------------------------------------------------------

class _Refused(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise _Refused(message)


def megatron_parser() -> argparse.ArgumentParser:
    """Megatron-LM's command line at its release, rebuilt from the flags its parser defines
    (tests/data/megatron_lm_arguments.json): names, arity, types and choices."""
    spec = json.loads((ROOT / "tests" / "data" / "megatron_lm_arguments.json").read_text())
    assert spec["tag"] == export.MEGATRON_LM_RELEASE and spec["entry_point_present"]
    p = _Parser(prog="pretrain_gpt.py", allow_abbrev=False)
    types = {"int": int, "float": float, "str": str}
    for a in spec["actions"]:
        kind = a["kind"]
        default = {"default": a["default"]} if "default" in a else {}
        if kind in ("store_true", "store_false"):
            p.add_argument(*a["flags"], dest=a["dest"], action=kind, **default)
        elif kind == "boolean_optional":
            p.add_argument(a["flags"][0], dest=a["dest"], action=argparse.BooleanOptionalAction, **default)
        else:
            kw = {"dest": a["dest"], "action": "append" if kind == "append" else "store", **default}
            if a["nargs"] is not None:
                kw["nargs"] = a["nargs"]
            if a["type"] in types:
                kw["type"] = types[a["type"]]
                if "choices" in a:
                    kw["choices"] = a["choices"]
            p.add_argument(*a["flags"], **kw)
    return p


def megatron_read_back(text: str, req: search.Request):
    """The exported command, placeholders filled: Megatron-LM's parser reads its arguments, and
    megatron-core's config classes validate the model and the layout they give."""
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.transformer.transformer_config import TransformerConfig

    import torch

    words = command_words(text)
    env = [w for w in words[:words.index("torchrun")] if "=" in w]
    at = words.index("pretrain_gpt.py")
    args = megatron_parser().parse_args(words[at + 1:])
    kwargs = dict(num_layers=args.num_layers, hidden_size=args.hidden_size, num_attention_heads=args.num_attention_heads,
                  num_query_groups=args.num_query_groups if args.group_query_attention else None,
                  ffn_hidden_size=args.ffn_hidden_size, tensor_model_parallel_size=args.tensor_model_parallel_size,
                  pipeline_model_parallel_size=args.pipeline_model_parallel_size,
                  virtual_pipeline_model_parallel_size=args.num_virtual_stages_per_pipeline_rank,
                  context_parallel_size=args.context_parallel_size, expert_model_parallel_size=args.expert_model_parallel_size,
                  num_layers_in_first_pipeline_stage=args.decoder_first_pipeline_num_layers,
                  num_layers_in_last_pipeline_stage=args.decoder_last_pipeline_num_layers,
                  sequence_parallel=args.sequence_parallel, recompute_granularity=args.recompute_granularity,
                  recompute_method=args.recompute_method, recompute_num_layers=args.recompute_num_layers,
                  gated_linear_unit=args.swiglu, normalization=args.normalization, add_bias_linear=args.add_bias_linear,
                  bf16=args.bf16, params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16)
    if args.num_experts:
        kwargs.update(num_moe_experts=args.num_experts, moe_router_topk=args.moe_router_topk,
                      moe_ffn_hidden_size=args.moe_ffn_hidden_size,
                      expert_tensor_parallel_size=args.expert_tensor_parallel_size,
                      moe_token_dispatcher_type=args.moe_token_dispatcher_type,
                      moe_flex_dispatcher_backend=args.moe_flex_dispatcher_backend,
                      moe_expert_capacity_factor=args.moe_expert_capacity_factor)
    if args.fp8:
        kwargs.update(fp8=args.fp8, fp8_recipe=args.fp8_recipe, fp8_amax_history_len=args.fp8_amax_history_len,
                      fp8_amax_compute_algo=args.fp8_amax_compute_algo)
    with warnings.catch_warnings(), mock.patch("megatron.core.transformer.transformer_config.is_te_min_version",
                                              lambda *_, **__: True):  # FP8's checks ask Transformer Engine's version
        warnings.simplefilter("ignore")
        tc = TransformerConfig(**kwargs)
        ddp = DistributedDataParallelConfig(use_distributed_optimizer=args.use_distributed_optimizer,
                                            overlap_grad_reduce=args.overlap_grad_reduce,
                                            overlap_param_gather=args.overlap_param_gather,
                                            use_megatron_fsdp=args.use_megatron_fsdp,
                                            # Megatron-LM's default strategy is read only by Megatron-FSDP
                                            data_parallel_sharding_strategy=args.data_parallel_sharding_strategy
                                            if args.use_megatron_fsdp else "no_shard")
    return env, args, tc, ddp


MG_LAYOUTS = [
    search.Layout(4, 2, 8, "1F1B", 1, 1, 16, "zero1", "full", "ends"),
    search.Layout(8, 2, 4, "1F1B", 1, 2, 16, "fsdp", "full"),
    search.Layout(2, 1, 32, search.NO_PIPELINE, 1, 2, 2, "none", "none"),
    search.Layout(4, 4, 4, "Interleaved1F1B", 5, 1, 32, "zero1", "none"),
    search.Layout(4, 2, 4, "1F1B", 1, 1, 32, "zero1", "full", "even", 1, 2),   # context parallelism: cp = 2
]


@pytest.mark.parametrize("layout", MG_LAYOUTS, ids=lambda x: x.label())
def test_megatron_reads_the_export_back_as_a_complete_pretrain_gpt_command(layout):
    req = request()
    text = exported(layout, req, "megatron")
    assert text.startswith(f"# Megatron-LM {export.MEGATRON_LM_RELEASE}")
    env, args, tc, ddp = megatron_read_back(text, req)
    m = req.model
    # the model's shape, from the command alone
    assert (args.num_layers, args.hidden_size, args.num_attention_heads, args.ffn_hidden_size) == \
        (m.layers, m.hidden, m.heads, m.ffn)
    assert args.group_query_attention and args.num_query_groups == m.kv_heads
    assert (args.seq_length, args.max_position_embeddings) == (req.seq_len, req.seq_len)
    assert args.swiglu and args.normalization == "RMSNorm" and args.position_embedding_type == "rope"
    assert args.untie_embeddings_and_output_weights and not args.add_bias_linear
    assert args.rotary_base == int(FILLED["ROPE_BASE"])
    # data, tokenizer, training and checkpoints, as the reader filled them in
    assert args.data_path == [FILLED["DATA_PREFIX"]] and args.tokenizer_type == "HuggingFaceTokenizer"
    assert args.tokenizer_model == FILLED["TOKENIZER"] and args.train_iters == int(FILLED["TRAIN_ITERS"])
    assert args.save == args.load == FILLED["CHECKPOINT_DIR"]
    # the layout
    assert (tc.tensor_model_parallel_size, tc.pipeline_model_parallel_size, tc.context_parallel_size) == \
        (layout.tp, layout.p, layout.cp)
    assert (tc.virtual_pipeline_model_parallel_size or 1) == layout.num_stages // layout.p
    assert tc.sequence_parallel == (layout.tp > 1) and tc.bf16
    assert tc.recompute_granularity == {"none": None}.get(layout.recompute, layout.recompute)
    assert (args.micro_batch_size, args.global_batch_size) == (layout.b, req.global_batch)
    if layout.balance == "ends":
        layers = [len(x) for x in search.layers_of(layout, req)]
        assert (tc.num_layers_in_first_pipeline_stage, tc.num_layers_in_last_pipeline_stage) == (layers[0], layers[-1])
    # the sharding, and the overlap the planner's time assumes (Megatron-LM does neither by default)
    assert ddp.use_distributed_optimizer == (layout.sharding != "none")
    assert args.use_megatron_fsdp == (layout.sharding in ("zero2", "fsdp"))
    assert ddp.data_parallel_sharding_strategy == {"fsdp": "optim_grads_params", "zero2": "optim_grads"}.get(
        layout.sharding, "no_shard")
    assert args.overlap_grad_reduce and args.overlap_param_gather == (layout.sharding != "none")
    assert not args.overlap_param_gather or args.use_distributed_optimizer  # Megatron-LM's validate_args requires it
    # Megatron-FSDP refuses CUDA_DEVICE_MAX_CONNECTIONS=1 (validate_args); tensor parallelism alone wants it
    assert env == (["CUDA_DEVICE_MAX_CONNECTIONS=1"] if layout.sharding not in ("zero2", "fsdp") and layout.tp > 1 else [])


def test_megatron_parser_refuses_a_flag_it_does_not_have():
    """The rebuilt parser is Megatron-LM's: a flag it does not define, or a value its choices refuse, fails."""
    parser = megatron_parser()
    with pytest.raises(_Refused, match="unrecognized"):
        parser.parse_args(["--num-layers", "2", "--overlap-grad-reduction"])
    with pytest.raises(_Refused, match="invalid choice"):
        parser.parse_args(["--normalization", "RMSnorm"])
    assert parser.parse_args(["--tokenizer-type", "HuggingFaceTokenizer"]).tokenizer_type == "HuggingFaceTokenizer"


# the experts' fold, FP8 and the optimizers (issue 52): Qwen3-30B-A3B on 16 H100s (B200s for MXFP8)
MOE_CASES = [
    # ep 16 over dp 8 (folded over tensor parallelism too), DeepEP, FP8 current scaling, bf16 moments
    (dict(precision="fp8-current", dispatcher="deepep", optimizer="adamw-bf16"),
     search.Layout(2, 1, 8, search.NO_PIPELINE, 1, 2, 4, "zero1", "full", "even", 16)),
    # each expert split over etp 2, a capacity factor, delayed scaling, Muon
    (dict(precision="fp8-delayed", optimizer="muon", capacity_factor=1.25),
     search.Layout(2, 2, 4, "1F1B", 1, 2, 8, "zero1", "full", "even", 4, 1, 2)),
    # no expert parallelism, the experts split over tp (Megatron-Core's default made explicit), blockwise, SGD
    (dict(precision="fp8-blockwise", optimizer="sgd"),
     search.Layout(2, 1, 8, search.NO_PIPELINE, 1, 2, 4, "none", "none", "even", 1, 1, 2)),
    # experts unsplit beside tp 2 (etp 1, which Megatron-Core would not do by default), MXFP8 on Blackwell
    (dict(precision="mxfp8", gpu="b200"),
     search.Layout(2, 1, 8, search.NO_PIPELINE, 1, 2, 4, "zero1", "full", "even", 8)),
]
FP8_FLAGS = {"fp8-current": ("hybrid", "tensorwise"), "fp8-delayed": ("hybrid", "delayed"),
             "fp8-blockwise": ("hybrid", "blockwise"), "mxfp8": ("e4m3", "mxfp8")}


def moe_request(gpu="h100-sxm", **kw) -> search.Request:
    g = hardware.GPUS[gpu]
    return search.Request(shapes.PRESETS["qwen3-30b-a3b"], g, 16, 8, 64, 4096, hardware.LINKS[g.nvlink],
                          hardware.LINKS[g.network], **kw)


@pytest.mark.parametrize("options,layout", MOE_CASES, ids=lambda x: x.label() if isinstance(x, search.Layout) else
                         "-".join(f"{k}={v}" for k, v in x.items()))
def test_megatron_exports_the_experts_fold_fp8_and_the_optimizer(options, layout):
    """What the planner timed reaches Megatron-LM's command line: ep and etp (named even where etp is 1:
    Megatron-Core splits each expert over tp GPUs unless told), the dispatcher, the capacity factor, the FP8
    recipe as Megatron-Bridge's recipes set it, the optimizer; read back by Megatron-LM's parser and validated
    by megatron-core's TransformerConfig. Before issue 52's export, etp, FP8 and the optimizer were dropped."""
    req = moe_request(**options)
    _, args, tc, _ = megatron_read_back(exported(layout, req, "megatron"), req)
    assert (args.expert_model_parallel_size, args.expert_tensor_parallel_size) == (layout.ep, layout.etp)
    assert (tc.expert_model_parallel_size, tc.expert_tensor_parallel_size) == (layout.ep, layout.etp)
    assert (args.num_experts, args.moe_router_topk) == (req.model.experts, req.model.top_k)
    assert (args.moe_token_dispatcher_type, args.moe_flex_dispatcher_backend) == (
        ("flex", "deepep") if req.dispatcher == "deepep" else ("alltoall", "deepep"))  # deepep: the parser's default
    assert args.moe_expert_capacity_factor == (req.capacity_factor or None)
    assert (args.fp8, args.fp8_recipe) == FP8_FLAGS[req.precision] and tc.fp8 == args.fp8
    if req.precision == "fp8-delayed":  # the history of maxima the planner counts
        assert args.fp8_amax_history_len == memory.PRECISIONS["fp8-delayed"].amax_history
    assert args.optimizer == {"muon": "muon", "sgd": "sgd"}.get(req.optimizer, "adam")
    assert args.use_precision_aware_optimizer == (req.optimizer == "adamw-bf16")
    if req.optimizer == "adamw-bf16":
        assert args.exp_avg_dtype == args.exp_avg_sq_dtype == "bf16"


def test_every_flag_the_export_names_is_megatron_lms():
    """Each flag of the export's tables (ppbook.planner.export) is one Megatron-LM's parser defines
    (tests/data/megatron_lm_arguments.json), with a value among its choices."""
    parser = megatron_parser()
    tables = [export.MEGATRON_SHARDING, export.MEGATRON_OVERLAP, export.MEGATRON_MLP, export.MEGATRON_DISPATCHER,
              export.MEGATRON_PRECISION, export.MEGATRON_OPTIMIZER]
    flags = [f for table in tables for value in table.values() for f in value]
    assert {"--fp8-format hybrid", "--fp8-recipe tensorwise", "--moe-flex-dispatcher-backend deepep"} <= set(flags)
    for flag in flags:
        parser.parse_args(flag.split())  # refuses an unknown flag or a value outside its choices
    # the planner's names: every precision and dispatcher it times has its flags; every optimizer but Adafactor
    assert set(export.MEGATRON_PRECISION) == set(memory.PRECISIONS)
    assert set(export.MEGATRON_DISPATCHER) == set(search.DISPATCHERS)
    assert set(memory.OPTIMIZER_STATE) - set(export.MEGATRON_OPTIMIZER) == {"adafactor"}


def test_what_a_framework_cannot_run_of_fp8_and_the_optimizer_is_said():
    """Megatron-LM has no Adafactor: refused in one line. torchtitan 0.3.0 turns FP8 on in a registry
    entry (rowwise Float8, MXFP8), not on its command line: the export says so, and which optimizer was
    counted where the entry runs AdamW."""
    layout = MOE_CASES[0][1]
    with pytest.raises(ValueError, match="Megatron-LM has no adafactor optimizer"):
        exported(layout, moe_request(optimizer="adafactor"), "megatron")
    tt = replace(layout, ep=8, sharding="fsdp")  # torchtitan borrows ep from dp_shard x cp x tp
    for precision in ("fp8-current", "fp8-delayed", "fp8-blockwise"):
        text = exported(tt, moe_request(precision=precision, optimizer="muon"), "torchtitan")
        assert f"# {export.TORCHTITAN_PRECISION_NOTES[precision]}" in text.splitlines()
        assert "# the planner counted the state of muon; the registry entry runs AdamW: set yours in it" in text
    text = exported(tt, moe_request(gpu="b200", precision="mxfp8"), "torchtitan")
    assert "MXFP8LinearConverter" in text and "AdamW: set yours" not in text
    assert not any("FP8" in x or "MXFP8" in x for x in exported(tt, moe_request(), "torchtitan").splitlines()
                   if x.startswith("#"))


def test_megatron_model_flags_for_other_architectures():
    """GPT-3-style (learned positions, LayerNorm, biases, tied embeddings), Qwen2 (biases on q, k, v)
    and a mixture of experts with multi-head latent attention are given in Megatron-LM's flags; what
    Megatron-LM's command line has no flag for (ALiBi) is refused, not approximated."""
    gpt = request("megatron-39b", 512, 512, 2048)
    text = exported(search.Layout(8, 2, 32, "1F1B", 1, 1, 16, "none", "full"), gpt, "megatron")
    _, args, _, _ = megatron_read_back(text, gpt)
    assert args.position_embedding_type == "learned_absolute" and args.normalization == "LayerNorm"
    assert args.add_bias_linear and not args.untie_embeddings_and_output_weights and not args.swiglu
    qwen = request("qwen2.5-7b", 8, 64, 4096)
    _, args, _, _ = megatron_read_back(exported(search.Layout(1, 1, 8, search.NO_PIPELINE, 1, 1, 8, "zero1", "full"),
                                                qwen, "megatron"), qwen)
    assert args.add_qkv_bias and not args.add_bias_linear
    ds = request("deepseek-v3", 256, 256, 4096)
    text = exported(search.Layout(1, 1, 256, search.NO_PIPELINE, 1, 1, 1, "zero1", "full", "even", 8), ds, "megatron")
    _, args, _, _ = megatron_read_back(text, ds)
    assert args.multi_latent_attention and args.num_experts == 256 and args.moe_router_enable_expert_bias
    assert args.moe_layer_freq == "([0]*3+[1]*58)"  # quoted for the shell; Megatron-LM evaluates it
    assert plan.runs_on(search.Layout(4, 12, 8, "1F1B", 1, 1, 64, "zero1", "full"), "megatron",
                        request("bloom-176b", 384, 2048, 2048)) == "Megatron-LM has no ALiBi position embedding"


def test_megatron_core_refuses_what_the_export_refuses():
    """megatron-core's own validation is live: under interleaving it lightens ranks, not stages, and
    refuses a first rank whose layers do not split over its stages; the export refuses the planner's
    lightened first stage there, and an uneven split, as Megatron-LM would."""
    req = request()
    layout = search.Layout(4, 4, 4, "Interleaved1F1B", 2, 1, 32, "zero1", "full")
    text = exported(layout, req, "megatron")
    with pytest.raises(ValueError, match="must be divisible by virtual pipeline"):
        megatron_read_back(text + " \\\n  --decoder-first-pipeline-num-layers 9", req)
    for refused, why in ((search.Layout(4, 4, 4, "Interleaved1F1B", 2, 1, 32, "zero1", "full", "ends"), "ranks, not"),
                         (search.Layout(4, 2, 8, "Interleaved1F1B", 3, 1, 16, "zero1", "full"), "do not split")):
        assert why in plan.runs_on(refused, "megatron", req)
        with pytest.raises(ValueError, match=why):
            exported(refused, req, "megatron")


def test_megatron_selective_is_refused_not_mapped():
    """Megatron's selective recomputes core attention only: the planner's op-level count does not hold there."""
    req = request()
    layout = search.Layout(4, 4, 4, "Interleaved1F1B", 2, 1, 32, "zero1", "selective")
    assert "selective" in plan.runs_on(layout, "megatron")
    with pytest.raises(ValueError, match="twice the activations"):
        exported(layout, req, "megatron")
    assert plan.runs_on(search.Layout(4, 4, 4, "Interleaved1F1B", 2, 1, 32, "fsdp", "selective"), "torchtitan") is None


def test_torchtitan_export_refuses_dualpipev_overlap_it_does_not_run():
    """A plan that hides DualPipeV's all-to-all under its pair (--overlap-f-b) is not torchtitan
    0.3.0's: outside its experiments, nothing in it registers a function for torch's OVERLAP_F_B
    actions (the overlap added after it, torchtitan/distributed/dual_pipe_v.py, refuses activation
    checkpointing)."""
    source = Path(importlib.util.find_spec("torchtitan").origin).parent
    registers = [f for f in source.rglob("*.py") if "experiments" not in f.parts
                 and ("OVERLAP_F_B" in f.read_text() or "register_custom_function" in f.read_text())]
    assert not registers, registers
    req = request("mixtral-8x7b", 16, 64, 4096)
    layout = search.Layout(1, 2, 8, "DualPipeV", 2, 1, 8, "fsdp", "full", "even", 2)
    assert plan.runs_on(layout, "torchtitan", req) is None
    assert "plan without --overlap-f-b" in plan.runs_on(layout, "torchtitan", replace(req, overlap_f_b=True))
    assert plan.runs_on(replace(layout, ep=1), "torchtitan", replace(req, overlap_f_b=True)) is None
