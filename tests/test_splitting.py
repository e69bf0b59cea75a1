"""Chapter 4: splitting a model. Pure tests of ppbook.split, then scripts/04_splitting.py under
torchrun at 2, 3 and 4 processes against the one-process model."""

import itertools
import random

import pytest
import torch

from conftest import assert_one_line_error
from ppbook import launch, split
from ppbook.workload import loss_fn
from ppbook.models import GPTConfig, Llama, LlamaConfig, build_model, count_parameters
from ppbook.stages import assign_layers, keep_parts, stage_module

CONFIGS = [GPTConfig(n_layers=5), LlamaConfig(n_layers=5)]


# --- partition and policies -------------------------------------------------------------------
def brute_force(costs, p):
    n = len(costs)
    best = None
    for cuts in itertools.combinations(range(1, n), p - 1):
        bounds = (0, *cuts, n)
        worst = max(sum(costs[a:b]) for a, b in zip(bounds, bounds[1:]))
        best = worst if best is None else min(best, worst)
    return best


@pytest.mark.parametrize("seed", range(40))
def test_partition_is_optimal_contiguous_and_complete(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 9)
    p = rng.randint(1, n)
    costs = [rng.choice([0.0, rng.random(), rng.randint(1, 5)]) for _ in range(n)]
    runs = split.partition(costs, p)
    assert len(runs) == p and all(runs)
    assert sum(runs, []) == list(range(n))  # contiguous, in order, nothing dropped
    assert max(sum(costs[i] for i in r) for r in runs) == pytest.approx(brute_force(costs, p))


def test_partition_examples_and_errors():
    assert split.partition([1, 1, 1, 1, 4], 2) == [[0, 1, 2, 3], [4]]
    assert split.partition([5], 1) == [[0]]
    with pytest.raises(ValueError, match="non-empty stages"):
        split.partition([1, 2], 3)
    with pytest.raises(ValueError, match="non-negative"):
        split.partition([1, -2], 1)
    with pytest.raises(ValueError, match="at least 1"):
        split.partition([1, 2], 0)


@pytest.mark.parametrize("n_layers,p", [(12, 5), (5, 2), (5, 3), (5, 4), (8, 2), (7, 7)])
@pytest.mark.parametrize("policy", split.POLICIES)
def test_every_policy_gives_every_layer_to_exactly_one_stage(n_layers, p, policy):
    rng = random.Random(n_layers * 10 + p)
    params = [rng.randint(1, 100) for _ in range(n_layers + 2)]
    seconds = [rng.random() for _ in range(n_layers + 2)]
    layers = split.balance(policy, n_layers, p, params=params, seconds=seconds)
    assert len(layers) == p
    assert sum(layers, []) == list(range(n_layers))
    assert all(layers[1:-1]), "a middle stage with no layer would only forward its input"


def test_layers_policy_is_assign_layers_and_heavy_head_moves_layers_forward():
    assert split.balance("layers", 12, 5) == assign_layers(12, 5)
    costs = [0.1] + [1.0] * 8 + [6.0]  # embedding cheap, head as heavy as six layers
    assert split.balance("time", 8, 2, seconds=costs) == [[0, 1, 2, 3, 4, 5, 6], [7]]
    assert split.stage_costs([[0, 1, 2, 3, 4, 5, 6], [7]], costs) == pytest.approx([7.1, 7.0])
    # parameter counts see an untied embedding as heavy as the head
    params = [6] + [1] * 8 + [6]
    assert split.balance("params", 8, 2, params=params) == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_balance_refuses_unknown_policy_and_wrong_costs():
    with pytest.raises(ValueError, match="unknown balancing policy 'flops'"):
        split.balance("flops", 4, 2, seconds=[1] * 6)
    with pytest.raises(ValueError, match="needs one cost per unit"):
        split.balance("time", 4, 2, seconds=[1] * 5)
    with pytest.raises(ValueError, match="needs one cost per unit"):
        split.balance("params", 4, 2)


@pytest.mark.parametrize("cfg", CONFIGS, ids=["gpt", "llama"])
def test_unit_params_add_up_and_profile_covers_every_unit(cfg):
    model = build_model(cfg)
    params = split.unit_params(model)
    assert len(params) == cfg.n_layers + 2 and sum(params) == count_parameters(model)
    tokens = torch.randint(0, cfg.vocab_size, (2, 16))
    seconds = split.profile_units(model, tokens, tokens, loss_fn, repeats=2, warmup=1)
    assert len(seconds) == cfg.n_layers + 2 and all(s > 0 for s in seconds)
    assert all(p.grad is None for p in model.parameters())
    assert len(model.layers) == cfg.n_layers and model.output is not None  # the model is left whole


def test_keep_parts_refuses_layers_the_model_does_not_have():
    with pytest.raises(ValueError, match=r"layers \[7\] are not in the model"):
        keep_parts(build_model(GPTConfig(n_layers=4)), [3, 7], embedding=True, head=False)


# --- meta-device construction -------------------------------------------------------------------
@pytest.mark.parametrize("cfg", CONFIGS, ids=["gpt", "llama"])
@pytest.mark.parametrize("p", [1, 2, 3, 4, 5])
def test_meta_stages_have_bitwise_the_full_models_weights_and_buffers(cfg, p):
    full = build_model(cfg, seed=7)
    params, buffers = dict(full.named_parameters()), dict(full.named_buffers())
    seen = []
    for i in range(p):
        stage = split.build_stage_on_meta(cfg, 7, i, p)
        assert not any(t.is_meta for t in stage.parameters())
        for name, t in stage.named_parameters():
            assert torch.equal(t, params[name]), name
            seen.append(name)
        for name, t in stage.named_buffers():
            assert torch.equal(t, buffers[name]), name
    assert sorted(seen) == sorted(params)


@pytest.mark.parametrize("cfg", CONFIGS, ids=["gpt", "llama"])
def test_meta_stages_chained_compute_the_full_models_output(cfg):
    full = build_model(cfg, seed=3)
    tokens = torch.randint(0, cfg.vocab_size, (2, 16))
    layers = [[0], [1, 2, 3], [4]]  # an explicit, uneven assignment
    h = tokens
    for i in range(3):
        h = split.build_stage_on_meta(cfg, 3, i, 3, layers=layers[i])(h)
    assert torch.equal(h, full(tokens))


def test_seed_and_reset_parameters_on_a_meta_stage_differ_from_the_full_model():
    """What the meta-device recipe of the seed articles does, and why it is not the same model."""
    cfg = LlamaConfig(n_layers=4)
    torch.manual_seed(0)
    full = Llama(cfg)  # PyTorch's default initialisation, in creation order
    with torch.device("meta"):
        stage = Llama(cfg)
    stage_module(stage, 1, 2).to_empty(device="cpu")
    torch.manual_seed(0)
    for module in stage.modules():
        if hasattr(module, "reset_parameters"):
            module.reset_parameters()
    ref = dict(full.named_parameters())
    linear = [n for n, _ in stage.named_parameters() if n.endswith("wq.weight")]
    assert linear and not any(torch.equal(dict(stage.named_parameters())[n], ref[n]) for n in linear)


# The peak memory of building a stage on the meta device against building the full model first
# (split.peak_build_memory, two fresh processes): chapter 4 measures it and checks it.


# --- the script under torchrun ----------------------------------------------------------------
pytest_torchrun = pytest.mark.torchrun


@pytest_torchrun
@pytest.mark.parametrize("nproc,model", [(3, "gpt"), (4, "llama")])  # 2 processes: chapter 4 runs and checks both
def test_manual_and_tracer_splits_equal_one_process(nproc, model):
    """Both split methods of one model at 3 and at 4 processes, each model at one of them: the uneven
    splits (5 layers as 2 + 2 + 1 and 2 + 1 + 1 + 1, middle stages without embedding or head) are the
    case, and the tracer's export of each model is most of a launch's time. Chapter 4 splits both
    models at 2 processes; tests/test_check_every_m.py splits GPT and Llama at 2 and at 3."""
    r = launch.torchrun("04_splitting.py", ["--check", "--experiments", "check", "--models", model], nproc=nproc,
                        timeout=400)
    checks = r.data["checks"]
    assert r.data["match"] and len(checks) == 2
    expected = assign_layers(5, nproc)  # 5 layers: uneven at 2, 3 and 4 stages
    for c in checks:
        assert c["match"], c
        assert c["layers_per_stage"] == expected
        assert c["loss"] == pytest.approx(c["reference_loss"], abs=1e-6)
        for s in c["stages"]:
            assert s["weights_equal_full"], (c["model"], c["method"], s)
            assert s["max_weight_diff"] == 0.0
            if c["method"] == "manual":
                assert s["max_grad_diff"] == 0.0  # same microbatches, same order: bitwise
            else:
                assert s["max_grad_diff"] <= 1e-6
    by = {(c["model"], c["method"]): c for c in checks}
    assert [s["params"] for s in by[(model, "manual")]["stages"]] == \
        [s["params"] for s in by[(model, "tracer")]["stages"]]  # both methods: the same parameters on the same stages


# tied weights (two copies until their gradients are summed) and the balance policies (each equal to
# one process, 'time' optimal for its costs) at 2 processes: chapter 4 runs and checks them


# A tensor keyword argument meant for a later stage fails with torch's TypeError on rank 0:
# chapter 4 runs it and checks the message.


@pytest.mark.parametrize("args,message", [
    (["--experiments", "balance", "--balance-layers", "1"], "--balance-layers 1 is fewer than the 2 stages"),
    (["--experiments", "balance", "--balance-dim", "30"], "--balance-dim 30 must be divisible by --heads 4"),
    (["--layers", "1"], "need at least 2 layers"),
])
def test_bad_input_one_line_nonzero_exit(args, message):
    assert_one_line_error("04_splitting.py", args, message)


def test_tied_and_kwarg_need_two_processes():
    assert_one_line_error("04_splitting.py", ["--experiments", "tied"], "at least 2 processes", nproc=1)


@pytest.mark.torchrun
def test_one_process_without_torchrun_is_a_one_stage_pipeline():
    r = launch.python("04_splitting.py", ["--check", "--models", "llama"], timeout=240)
    assert r.data["world_size"] == 1 and r.data["match"]
    assert [c["layers_per_stage"] for c in r.data["checks"]] == [[[0, 1, 2, 3, 4]]] * 2
