"""Read a GPU record under ``data/gpu/`` into one shape, whichever harness wrote it, for chapter 11.

Two layouts exist: the H200 record of 2026-11-28 (``run_gpu.py`` beside it: check.json for
chapters 1-9's scripts, record.json's ``phase2`` for chapters 12-15's, bench.json with one plain
loop, mem.json a list of rows) and what ``make gpu-check`` writes since (``tools/gpu_check.py``:
check.json for every launch, bench.json with two plain loops, mem.json and costs.json with
``meta`` and ``rows``). :func:`load` returns for either::

    {"name", "meta": {gpu, torch, cuda, nccl, date, commit, ...},
     "launches": [{"name", "status", "evidence", "seconds"}],   # names of gpu_check.LAUNCHES
     "bench": {"loops": {"pipeline"|"accumulate"|"whole": {...}}, "ratio_to_accumulate"?, "ratio_to_whole", ...} | None,
     "mem": [{"tag", "argv", "peak_allocated", "step_seconds"}], "costs": {"meta", "rows"} | None,
     "profile": str | None}

``data/gpu/fixes.json`` says, for each launch the H200 record saw fail, what happened, what fixed
it and in which commit.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from ppbook.launch import repo_root

GPU_DATA = repo_root() / "data" / "gpu"
FIXES = GPU_DATA / "fixes.json"
# the H200 record's tags for chapters 12-15 (its run_gpu.py's EXTRA) -> gpu_check's launch names
# (the record ran chapter 12's sections as scripts/12_combinations.py --section NAME, which became
# scripts/12_NAME.py: the same code, one script per topic)
H200_TAGS = {"12_shapes": "12_shapes.py", "12_recompute": "12_recompute.py", "12_compile_inductor": "12_compile.py",
             "13_moe": "13_moe.py",
             "14_own_schedule": "14_own_schedule.py", "15_packed": "15_packed.py"}
_EVIDENCE = (re.compile(r"\b\w+(Error|Exception): \S.*"), re.compile(r"^\S+\.py: error: .*"),
             re.compile(r".*max \|weight - ref\| = .*"))


def evidence(output: str | None) -> str | None:
    """The line of a failed launch's output that says what went wrong (an exception with its
    message, a script's one-line refusal, a weight difference), without the rank prefix; None if
    the recorded tail holds none."""
    for line in (output or "").splitlines():
        line = re.sub(r"^\[rank\d+\]:\s*", "", line.strip())
        for pattern in _EVIDENCE:
            if pattern.search(line) and "ChildFailedError" not in line:
                return line
    return None


def _json(path: Path):
    return json.loads(path.read_text()) if path.is_file() else None


def records() -> list[Path]:
    """Every record folder under data/gpu/, oldest first (their names end with the date)."""
    return sorted((p for p in GPU_DATA.iterdir() if (p / "record.json").is_file()),
                  key=lambda p: (p.name[-10:], p.name))


def load(folder: str | Path) -> dict:
    folder = GPU_DATA / folder if not Path(folder).is_absolute() else Path(folder)
    record, check = _json(folder / "record.json"), _json(folder / "check.json") or {"runs": []}
    profile = (folder / "profile.txt").read_text() if (folder / "profile.txt").is_file() else None
    launches = [{"name": r["name"], "status": r["status"], "seconds": r.get("seconds"),
                 "evidence": evidence(r.get("output_tail") or r.get("error")) if r["status"] == "failed" else None}
                for r in check["runs"]]
    if "phase2" in record:  # the H200 record of 2026-11-28
        versions = json.loads(record["versions"]["tail"])
        bench_file = _json(folder / "bench.json")
        meta = {**bench_file["meta"], **versions, "commit": None}
        for step in record["phase2"]:
            if step["tag"] in H200_TAGS:
                failed = step["rc"] != 0
                launches.append({"name": H200_TAGS[step["tag"]], "status": "failed" if failed else "passed",
                                 "seconds": step["seconds"], "evidence": evidence(step["tail"]) if failed else None})
        b = bench_file["benchmark"]
        bench = {"loops": {"pipeline": b["pipeline"], "whole": b["plain"]}, "ratio_to_whole": b["ratio_to_plain"],
                 "microbatches": int(b["args"][b["args"].index("--microbatches") + 1]), "args": b["args"],
                 "tokens_per_step": b["tokens_per_step"], "peak_flops": b["peak_flops"]}
        mem = [{"tag": r["tag"], "argv": r["argv"], "peak_allocated": r.get("pipeline_max_allocated"),
                "step_seconds": r.get("step_seconds", [])} for r in _json(folder / "mem.json") or []]
    else:
        meta = record["meta"]
        bench = _json(folder / "bench.json")
        mem = (_json(folder / "mem.json") or {}).get("rows", [])
    return {"name": folder.name, "meta": meta, "launches": launches, "bench": bench, "mem": mem,
            "costs": _json(folder / "costs.json"), "profile": profile}


def fixes() -> dict:
    """data/gpu/fixes.json: the record it answers, and per failed launch what happened and its fix."""
    return json.loads(FIXES.read_text())
