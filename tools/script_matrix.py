"""Every companion script's check, as launches: the thirteen of ``tools/gpu_check.py`` and the
chapter 12-15 launches that the first GPU record ran beside them (``EXTRA`` of
``data/gpu/h200-2026-11-28/run_gpu.py``; chapter 12's sections have been scripts of their own since,
FSDP2's and tensor parallelism's among them), sized for ``n`` processes.

    from script_matrix import commands
    commands(2, "cpu")   # [{"name", "script", "nproc", "args"} (or "skip"), ...]

``tools/torch_versions.py`` runs them under another torch, and where a launch is refused for one
schedule (torch < 2.13 on gloo), :func:`without_schedule` again without it; ``tools/gpu_check.py``
runs :func:`extra_commands` at one process for the GPU record (this module imports it only inside
:func:`commands`, so either can import the other).
"""

from __future__ import annotations

# chapter 14: every schedule it writes or runs, torch's and its own
OWN_SCHEDULES = ("1F1B-hand", "1F1B", "Interleaved1F1B", "ZB-H2", "V-Half", "ZBVZeroBubble", "DualPipeV")


def extra_commands(n: int, device: str, inductor: bool = True) -> list[dict]:
    """Chapters 12-15's ``--check`` launches at ``n`` processes: 12's shapes, recompute and compile
    scripts (compile with inductor, torch.compile's default, unless ``inductor=False``: AOTAutograd's
    graphs on eager kernels, seconds on a CPU instead of minutes), its FSDP2 and tensor-parallel
    scripts (a 2-wide mesh dimension from 4 processes on, else 1: a pipeline over every rank), 13's
    MoE pipeline (its pipeline over the ``n`` ranks, one expert group), 14's schedules and 15's
    packed rows."""
    backend = ["--backend", "inductor"] if inductor else []
    inner = "2" if n >= 4 and n % 2 == 0 else "1"
    launches = [
        ("12_shapes.py", ["--check"]),
        ("12_recompute.py", ["--check"]),
        ("12_compile.py", [*backend, "--steps", "3", "--check"]),
        ("12_fsdp.py", ["--dp", inner, "--check"]),
        ("12_tp.py", ["--tp", inner, "--check"]),
        ("13_moe.py", ["--pp", str(n), "--ep", "1", "--check"]),
        ("14_own_schedule.py", ["--check", "--schedules", *OWN_SCHEDULES]),
        ("15_packed.py", ["--check"]),
    ]
    return [{"name": script, "script": script, "nproc": n, "args": [*args, "--device", device]}
            for script, args in launches]


def commands(n: int, device: str, inductor: bool = True) -> list[dict]:
    """``tools/gpu_check.py``'s launches of its thirteen scripts at ``n`` processes, then
    :func:`extra_commands` at ``n`` (the GPU check runs those at one)."""
    from gpu_check import SCRIPTS, script_commands

    return [*script_commands(n, device, SCRIPTS), *extra_commands(n, device, inductor)]


def without_schedule(cmd: dict, name: str) -> dict | None:
    """``cmd`` without schedule ``name`` among what it runs (its ``--schedules``, or 13_moe.py's
    ``--runs`` that use it), named for what it leaves out; ``None`` when it runs no schedule by that
    name or nothing else."""
    from ppbook.launch import load_script

    mod = load_script(cmd["script"])
    args = mod.parse_args(cmd["args"])
    if hasattr(mod, "RUNS") and getattr(args, "runs", None):  # 13_moe.py: runs, each of one schedule
        chosen = list(mod.RUNS) if "all" in args.runs else list(args.runs)
        flag, keep = "--runs", [r for r in chosen if mod.RUNS[r][0] != name]
    elif getattr(args, "schedules", None):
        chosen = list(args.schedules)
        flag, keep = "--schedules", [s for s in chosen if s != name]
    else:
        return None
    if not keep or len(keep) == len(chosen):
        return None
    argv = list(cmd["args"])
    if flag in argv:  # its values, up to the next flag
        i = argv.index(flag)
        j = next((k for k in range(i + 1, len(argv)) if argv[k].startswith("--")), len(argv))
        del argv[i:j]
    at = argv.index("--device") if "--device" in argv else len(argv)
    argv[at:at] = [flag, *keep]
    base = cmd.get("base", cmd["name"])
    dropped = [*cmd.get("dropped", []), name]
    return {**cmd, "name": f"{base} without {', '.join(dropped)}", "base": base, "dropped": dropped, "args": argv}
