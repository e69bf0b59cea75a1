"""scripts/01_minimal.py, the whole program chapter 1 shows: at two processes it trains exactly what
one process trains, and what a plain training loop of the same model trains; started with plain
``python`` it is that one process."""

import pytest
import torch

from conftest import assert_one_line_error
from ppbook import launch

SCRIPT = "01_minimal.py"
ARGS = ["--steps", "2"]  # two AdamW steps: the second uses the optimizer state of the first


def as_tensors(params: dict) -> dict[str, torch.Tensor]:
    return {name: torch.tensor(value) for name, value in params.items()}


def plain_loop(args) -> tuple[list[float], dict[str, torch.Tensor]]:
    """The same model trained in one process without any pipeline: each microbatch's loss
    backpropagated, the gradients summed and divided by m, as ScheduleGPipe does by default."""
    mod = launch.load_script(SCRIPT)
    torch.manual_seed(args.seed)
    model = mod.Model(args.vocab, args.dim, args.heads, args.layers)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    rows = torch.randint(args.vocab, (args.batch_size, args.seq_len + 1),
                         generator=torch.Generator().manual_seed(args.seed))
    x, y = rows[:, :-1], rows[:, 1:]
    losses = []
    for _ in range(args.steps):
        opt.zero_grad()
        mb = [mod.loss_fn(model(xa), ya) for xa, ya in zip(x.tensor_split(args.microbatches),
                                                           y.tensor_split(args.microbatches))]
        for loss in mb:
            loss.backward()
        for p in model.parameters():
            p.grad.div_(args.microbatches)
        opt.step()
        losses.append(torch.stack(mb).mean().item())
    return losses, {n: p.detach() for n, p in model.named_parameters()}


@pytest.mark.torchrun
def test_two_stages_equal_one_process_and_a_plain_loop(monkeypatch):
    # torchrun gives each of several ranks one thread, but leaves one process its default: the
    # same thread count on both sides makes the comparison bit for bit
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    two = launch.torchrun(SCRIPT, ARGS, nproc=2, timeout=120)
    one = launch.torchrun(SCRIPT, ARGS, nproc=1, timeout=120)
    assert two.data["world_size"] == 2 and one.data["world_size"] == 1
    assert two.data["layers_per_stage"] == [[0, 1], [2, 3]] and one.data["layers_per_stage"] == [[0, 1, 2, 3]]
    assert len(two.data["losses"]) == 2 and two.data["losses"][1] < two.data["losses"][0]
    torch.testing.assert_close(two.data["losses"], one.data["losses"], rtol=0, atol=0)
    pipeline = as_tensors(two.data["params"])
    torch.testing.assert_close(pipeline, as_tensors(one.data["params"]), rtol=0, atol=0)
    # without torchrun's variables the script is rank 0 of a world of one, not a refusal
    plain = launch.python(SCRIPT, ARGS, timeout=120)
    assert plain.data["world_size"] == 1 and plain.data["layers_per_stage"] == [[0, 1, 2, 3]]
    torch.testing.assert_close(plain.data["losses"], one.data["losses"])
    torch.testing.assert_close(as_tensors(plain.data["params"]), as_tensors(one.data["params"]))

    mod = launch.load_script(SCRIPT)
    args = mod.parse_args(ARGS)
    ref_losses, ref_params = plain_loop(args)
    torch.testing.assert_close(two.data["losses"], ref_losses)
    torch.testing.assert_close(pipeline, ref_params)
    torch.manual_seed(args.seed)
    start = mod.Model(args.vocab, args.dim, args.heads, args.layers).state_dict()  # untrained
    assert all(not torch.equal(p, start[n]) for n, p in pipeline.items()), "every parameter was trained"


def test_cut_keeps_each_layer_once_under_its_name():
    mod = launch.load_script(SCRIPT)
    for p in (1, 2, 3, 4):
        parts = []
        for s in range(p):
            torch.manual_seed(0)
            parts.append(mod.cut(mod.Model(64, 32, 4, 4), s, p))
        assert sum((list(part.layers) for part in parts), []) == ["0", "1", "2", "3"]
        assert [part.embed is not None for part in parts] == [True] + [False] * (p - 1)
        assert [part.head is not None for part in parts] == [False] * (p - 1) + [True]
        torch.manual_seed(0)
        full = dict(mod.Model(64, 32, 4, 4).named_parameters())
        for part in parts:
            for name, param in part.named_parameters():
                assert torch.equal(param, full[name]), name


@pytest.mark.parametrize("args,message", [
    (["--batch-size", "10", "--microbatches", "4"], "not divisible by --microbatches 4"),
    (["--layers", "1"], "need at least 2 layers"),
    (["--dim", "30", "--heads", "4"], "--dim 30 must be divisible by --heads 4"),
    (["--steps", "0"], "--steps must be at least 1"),
    (["--json", "/no/such/folder/out.json"], "its folder does not exist"),
] + ([(["--device", "cuda"], "found 0 GPU(s)")] if not torch.cuda.is_available() else []))
def test_bad_input_is_one_line(args, message):
    assert_one_line_error(SCRIPT, args, message)


def test_without_torchrun_it_is_one_process(monkeypatch):
    """Absent torchrun's variables, the checks count one process: one layer is enough, and a
    bad flag is still refused before any process group exists."""
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    mod = launch.load_script(SCRIPT)
    trained = []
    monkeypatch.setattr(mod, "train", trained.append)  # the launch test above runs it for real
    assert mod.main(["--layers", "1"]) == 0 and len(trained) == 1  # one stage of one layer
    assert mod.main(["--batch-size", "10"]) == 2 and len(trained) == 1
