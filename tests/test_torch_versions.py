"""The plumbing of ``make torch-versions`` (``tools/torch_versions.py``, ``tools/script_matrix.py``):
its launches, how it reads a launch's output, the table it writes, and the tables committed in
``data/versions/``. The launches themselves run under another torch, outside the suite."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import gpu_record
import pytest
import script_matrix
import torch_versions

from ppbook.launch import load_script

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "data" / "gpu" / "h200-2026-11-28" / "record.json"


def test_the_launches_cover_every_companion_script_and_the_gpu_records():
    cmds = script_matrix.commands(2, "cpu")
    names = [c["name"] for c in cmds]
    assert len(names) == len(set(names))
    assert {c["script"] for c in cmds} == {p.name for p in (ROOT / "scripts").glob("*.py")}
    for c in cmds:
        assert c["nproc"] == 2 and c["args"][-2:] == ["--device", "cpu"], c
    # the chapter 12-15 launches of the first GPU record (its run_gpu.py's EXTRA), each under the name
    # chapter 11 gives it (chapter 12's "12_combinations.py --section NAME" is "12_NAME.py" since)
    record = json.loads(RECORD.read_text())
    ran = [r for r in record["phase2"] if r["cmd"][1:3] == ["-m", "torch.distributed.run"]]
    assert ran and all(r["tag"] in gpu_record.H200_TAGS for r in ran), [r["tag"] for r in ran]
    for r in ran:
        script = Path(r["cmd"][6]).name
        section = r["cmd"][r["cmd"].index("--section") + 1] if "--section" in r["cmd"] else None
        assert gpu_record.H200_TAGS[r["tag"]] == (f"12_{section}.py" if section else script), r["tag"]
    assert set(gpu_record.H200_TAGS.values()) <= set(names)


@pytest.mark.parametrize("nproc", [1, 2])
def test_every_launch_passes_its_scripts_validation(nproc, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", str(nproc))
    for c in script_matrix.commands(nproc, "cpu"):
        if c.get("skip"):
            continue
        mod = load_script(c["script"])
        args = mod.parse_args(c["args"])
        getattr(mod, "validate", lambda a, w: None)(args, nproc)


def test_a_launch_refused_for_one_schedule_runs_again_without_it(monkeypatch):
    cmds = {c["name"]: c for c in script_matrix.commands(2, "cpu")}
    narrowed = script_matrix.without_schedule(cmds["05_schedules.py"], "DualPipeV")
    narrowed = script_matrix.without_schedule(narrowed, "ZBVZeroBubble")
    assert narrowed["name"] == "05_schedules.py without DualPipeV, ZBVZeroBubble"
    args = load_script("05_schedules.py").parse_args(narrowed["args"])
    assert "DualPipeV" not in args.schedules and "ZBVZeroBubble" not in args.schedules and len(args.schedules) == 5
    assert narrowed["args"][-2:] == ["--device", "cpu"]
    moe = script_matrix.without_schedule(cmds["13_moe.py"], "DualPipeV")  # its --runs that use DualPipeV
    assert moe["args"][moe["args"].index("--runs") + 1:][:3] == ["1F1B", "aux-ignored", "aux-over-m"]
    own = script_matrix.without_schedule(cmds["14_own_schedule.py"], "V-Half")
    assert "V-Half" not in own["args"] and "ZB-H2" in own["args"]
    assert script_matrix.without_schedule(cmds["02_naive.py"], "GPipe") is None  # it runs no named schedule
    # the tool: a refusal for one schedule, then the launch without it
    outcomes = iter([("gated", "05_schedules.py: error: DualPipeV on gloo (CPU) needs torch >= 2.13, found 2.11.0"),
                     ("gated", "05_schedules.py: error: ZBVZeroBubble on gloo (CPU) needs torch >= 2.13, found 2.11"),
                     ("passed", None)])

    def fake_run(cmd, timeout):
        status, line = next(outcomes)
        return {**cmd, "status": status, **({"line": line} if line else {})}

    monkeypatch.setattr(torch_versions, "run_one", fake_run)
    rows = torch_versions.run_narrowing(cmds["05_schedules.py"], 1.0)
    assert [(r["name"], r["status"]) for r in rows] == [
        ("05_schedules.py", "gated"), ("05_schedules.py without DualPipeV, ZBVZeroBubble", "passed")]


def tail_of(tag: str) -> str:
    return next(r["tail"] for r in json.loads(RECORD.read_text())["phase2"] if r["tag"] == tag)


def test_a_refusal_in_one_line_is_gated_and_a_traceback_fails():
    # the GPU record's 13_moe.py: the script's one line, then torchrun's report (with its own traceback)
    status, line = torch_versions.classify(1, tail_of("13_moe"), None)
    assert status == "gated" and line.startswith("13_moe.py: error: DualPipeV on gloo (CPU) needs torch >= 2.13")
    assert torch_versions.classify(1, tail_of("15_packed"), None) == ("failed", None)  # the script's traceback
    assert torch_versions.classify(0, "MATCH", {"match": True}) == ("passed", None)
    assert torch_versions.classify(0, "", None) == ("passed", None)  # a script without --check (01_minimal.py)
    assert torch_versions.classify(0, "MISMATCH", {"match": False}) == ("failed", None)
    two = "a.py: error: one thing\n[rank1]: a.py: error: another thing\n"
    assert torch_versions.classify(1, two, None) == ("failed", None)


def test_the_table_has_a_column_per_version_and_quotes_each_gate(tmp_path):
    def record(version, rows):
        meta = {"torch": version, "python": "3.11.7", "machine": "x86_64, 2 CPU cores", "nproc": 2,
                "date": "2026-11-28T00:00:00+00:00", "command": "python tools/torch_versions.py --expect x",
                "book_commit": "abc1234", "book_tree_dirty": False}
        (tmp_path / f"torch-{version.split('+')[0]}.json").write_text(json.dumps({"meta": meta, "runs": rows}))

    record("2.15.0+cu130", [{"name": "a.py", "status": "passed"}, {"name": "b.py", "status": "passed"}])
    record("2.9.1", [{"name": "a.py", "status": "failed"}])
    record("2.11.0+cu130", [{"name": "a.py", "status": "gated", "line": "a.py: error: needs torch >= 2.13"},
                            {"name": "a.py without V", "base": "a.py", "status": "passed"},
                            {"name": "b.py", "status": "skipped", "skip": "staged on exactly 2 processes"}])
    table = torch_versions.render(tmp_path)
    assert "| launch | torch 2.9.1 | torch 2.11.0 | torch 2.15.0 |" in table  # by version, not by text
    assert "| a.py | failed | gated (1) | passed |" in table
    assert "| a.py without V | not run | passed | not needed |" in table  # 2.9.1's a.py failed: not run
    assert "| b.py | not run | skipped: staged on exactly 2 processes | passed |" in table
    assert "1. torch 2.11.0, a.py: `a.py: error: needs torch >= 2.13`" in table
    assert table.count("the book at abc1234;") == 3
    rec = json.loads((tmp_path / "torch-2.11.0.json").read_text())
    rec["meta"]["reruns"] = [{"date": "2026-11-29T00:00:00+00:00", "book_commit": "def5678", "book_tree_dirty": False,
                              "command": "python tools/torch_versions.py --only a.py"}]
    (tmp_path / "torch-2.11.0.json").write_text(json.dumps(rec))
    assert "; then 2026-11-29, the book at def5678: `python tools/torch_versions.py --only a.py`." in \
        torch_versions.render(tmp_path)


def test_the_recorded_command_shows_no_path_of_this_machine(monkeypatch):
    monkeypatch.delenv("PPBOOK_VERSIONS_COMMAND", raising=False)
    assert torch_versions.shown_command(["--nproc", "2", "--out", "/home/me/x", "--inductor"]) == \
        "python tools/torch_versions.py --nproc 2 --inductor"
    monkeypatch.setenv("PPBOOK_VERSIONS_COMMAND", "make torch-versions TORCH=2.11.0 NPROC=2")
    assert torch_versions.shown_command(["--out", "/x"]) == "make torch-versions TORCH=2.11.0 NPROC=2"


def test_a_rerun_of_some_launches_keeps_the_others_rows(tmp_path, monkeypatch):
    import torch

    version = torch_versions.base_version(torch.__version__)
    cmds = [{"name": n, "script": f"{n}.py", "nproc": 2, "args": []} for n in ("a", "b", "c")]
    monkeypatch.setattr(script_matrix, "commands", lambda n, device, inductor=False: cmds)
    monkeypatch.setattr(torch_versions, "run_one", lambda cmd, timeout: {**cmd, "status": "passed"})
    meta = {"torch": torch.__version__, "python": "3.11.7", "machine": "m", "nproc": 2, "date": "2026-11-27T00:00:00",
            "command": "make torch-versions", "book_commit": "old", "book_tree_dirty": False}
    rows = [{"name": "a", "status": "passed"}, {"name": "b", "status": "failed"},
            {"name": "c", "status": "gated", "line": "c.py: error: x"}, {"name": "c without V", "base": "c",
                                                                        "status": "passed"}]
    (tmp_path / f"torch-{version}.json").write_text(json.dumps({"meta": meta, "runs": rows}))
    assert torch_versions.main(["--only", "b", "--out", str(tmp_path)]) == 0
    rec = json.loads((tmp_path / f"torch-{version}.json").read_text())
    assert [(r["name"], r["status"]) for r in rec["runs"]] == [("a", "passed"), ("b", "passed"), ("c", "gated"),
                                                                ("c without V", "passed")]
    assert rec["meta"]["book_commit"] == "old" and rec["meta"]["reruns"][0]["command"].endswith("--only b")
    assert "| b | passed |" in (tmp_path / "README.md").read_text()


def test_bad_input_is_one_line(capsys):
    assert torch_versions.main(["--expect", "0.0.1"]) == 2
    assert torch_versions.main(["--only", "no_such.py"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2 and "not 0.0.1" in lines[0] and "no_such.py: no such launch" in lines[1], lines


COMMITTED = sorted((ROOT / "data" / "versions").glob("torch-*.json"))


def test_the_committed_tables_hold_the_claimed_versions_with_provenance_and_no_failure():
    versions = {p.stem.removeprefix("torch-") for p in COMMITTED}
    assert {"2.11.0", "2.15.0"} <= versions, versions
    for p in COMMITTED:
        rec = json.loads(p.read_text())
        for key in ("torch", "python", "machine", "date", "command", "book_commit", "nproc"):
            assert rec["meta"].get(key) is not None, (p.name, key)
        commands = [rec["meta"]["command"], *(r.get("command") or "" for r in rec["runs"])]
        assert not [c for c in commands if any(w.startswith("/") for w in shlex.split(c))], p.name  # no path of ours
        failed = [r["name"] for r in rec["runs"] if r["status"] == "failed"]
        assert not failed, (p.name, failed)
        names = {r.get("base", r["name"]) for r in rec["runs"]}
        assert names == {c["name"] for c in script_matrix.commands(rec["meta"]["nproc"], "cpu")}, p.name
    assert (ROOT / "data" / "versions" / "README.md").read_text() == torch_versions.render()
