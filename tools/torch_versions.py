"""Every companion script's check under the torch this interpreter has: passed, gated (refused in the
one line a reader gets, naming what it needs) or failed; one JSON per torch version in
``data/versions/`` and the table of all of them, ``data/versions/README.md``.

    make torch-versions TORCH=2.11.0       # a scratch venv with that torch, then this tool in it
    python tools/torch_versions.py --expect 2.11.0 --nproc 2     # in an interpreter that has it
    python tools/torch_versions.py --render                       # the table again, from the JSONs

The launches are ``tools/script_matrix.py``'s (``tools/gpu_check.py``'s thirteen scripts and
chapters 12-15's), on the CPU (gloo) at ``--nproc`` processes. A launch passes when it exits 0
without a ``"match": false``; it is gated when the script refused before starting, in one line
(``<script>: error: ...``, exit 2) with no traceback; anything else fails: a traceback, a timeout,
a mismatch. A launch refused for one schedule under this torch runs again without it (a row of its
own, "... without ZBVZeroBubble"), so that the rest of the script is checked too. The exit status is
1 when any launch failed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

OUT = ROOT / "data" / "versions"
STATUSES = ("passed", "gated", "failed", "skipped")
# where torchrun's own report of a failed rank begins (its traceback is the launcher's, not the script's)
AGENT_REPORT = re.compile(r"torch/distributed/elastic/multiprocessing/api\.py:\d+\] failed \(exitcode")
REFUSAL = re.compile(r"^(?:\[rank\d+\]:\s*)?(\S+\.py: error: .*)$")
# a refusal for one schedule under this torch on gloo (ppbook.dist.schedule_backend_problem)
REFUSED_SCHEDULE = re.compile(r"\.py: error: (\S+) (?:at \d+ process\(es\) )?on gloo \(CPU\) needs torch")


def classify(returncode: int, output: str, data: dict | None) -> tuple[str, str | None]:
    """(status, the one line a gated launch prints, or None) of one finished launch."""
    if returncode == 0:
        return ("passed" if (data or {}).get("match", True) is not False else "failed"), None
    script_part = AGENT_REPORT.split(output, maxsplit=1)[0]
    refusals = {m.group(1) for line in script_part.splitlines() if (m := REFUSAL.match(line.strip()))}
    if len(refusals) == 1 and "Traceback" not in script_part:
        return "gated", refusals.pop()
    return "failed", None


def run_one(cmd: dict, timeout: float) -> dict:
    """Launch one command of ``script_matrix`` (torchrun on the CPU); its row of the table."""
    from ppbook import launch

    if cmd.get("skip"):
        return {**cmd, "status": "skipped"}
    try:
        r = launch.torchrun(cmd["script"], cmd["args"], nproc=cmd["nproc"], timeout=timeout, check=False,
                            fork=False)
    except launch.LaunchError as err:  # a timeout, or exit 0 without its JSON
        return {**cmd, "status": "failed", "output_tail": str(err)[-3000:]}
    status, line = classify(r.returncode, r.output, r.data)
    row = {**cmd, "status": status, "command": r.reader_command, "returncode": r.returncode,
           "seconds": round(r.seconds, 1)}
    if line:
        row["line"] = line
    if status == "failed":
        row["output_tail"] = r.output[-3000:]
    return row


def run_narrowing(cmd: dict, timeout: float) -> list[dict]:
    """:func:`run_one`; when it is refused for one schedule under this torch, the same launch without
    that schedule as well (``script_matrix.without_schedule``), as often as that takes: the refused
    launch's row, then the narrowed one's."""
    import script_matrix

    rows = [run_one(cmd, timeout)]
    narrowed, row = cmd, rows[0]
    while row["status"] == "gated" and (m := REFUSED_SCHEDULE.search(row["line"])):
        narrowed = script_matrix.without_schedule(narrowed, m.group(1))
        if narrowed is None:
            break
        row = run_one(narrowed, timeout)
    if narrowed is not cmd and narrowed is not None:
        rows.append(row)
    return rows


def version_key(version: str) -> tuple:
    return tuple(int(x) if x.isdigit() else x for x in re.split(r"[.+]", version))


def base_version(version: str) -> str:
    """``2.11.0+cu130`` -> ``2.11.0``."""
    return version.split("+")[0]


def shown_command(argv: list[str], from_make: bool = True) -> str:
    """The command as a reader would type it: ``make torch-versions ...`` when make ran it (it says so in
    ``PPBOOK_VERSIONS_COMMAND``), without ``--out`` (a path of this machine) either way."""
    words = list(argv)
    if "--out" in words:
        del words[words.index("--out"):words.index("--out") + 2]
    made = os.environ.get("PPBOOK_VERSIONS_COMMAND") if from_make else None
    return made or "python tools/torch_versions.py " + " ".join(words)


def provenance(torch_version: str, nproc: int, argv: list[str]) -> dict:
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                check=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                                    capture_output=True, text=True).stdout.strip())
    except (OSError, subprocess.CalledProcessError):
        commit, dirty = None, None
    return {"torch": torch_version, "python": platform.python_version(), "platform": platform.platform(),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores", "device": "cpu (gloo)", "nproc": nproc,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": shown_command(argv), "book_commit": commit,
            "book_tree_dirty": dirty}


def render(folder: Path = OUT) -> str:
    """The markdown table of every ``torch-*.json`` in ``folder``: a row per launch, a column per version."""
    records = sorted((json.loads(p.read_text()) for p in folder.glob("torch-*.json")),
                     key=lambda r: version_key(r["meta"]["torch"]))
    names = list(dict.fromkeys(row["name"] for rec in records for row in rec["runs"]))
    base = {row["name"]: row["base"] for rec in records for row in rec["runs"] if row.get("base")}
    versions = [base_version(rec["meta"]["torch"]) for rec in records]
    lines = ["# The companion scripts under each torch version", "",
             "Written by `tools/torch_versions.py` (`make torch-versions TORCH=<version>`) from the JSON beside "
             "this file, one per version; not edited by hand. Each launch is the `--check` of "
             "`tools/script_matrix.py` on the CPU (gloo). *passed*: it ran and matched one process; *gated*: it "
             "refused in one line, quoted below, naming what it needs; *failed*: anything else (the JSON holds "
             "its output).", "",
             "| launch | " + " | ".join(f"torch {v}" for v in versions) + " |",
             "|:--|" + ":--|" * len(versions)]
    notes = []
    for name in names:
        cells = []
        for v, rec in zip(versions, records):
            row = next((r for r in rec["runs"] if r["name"] == name), None)
            if row is None and name in base and any(r["name"] == base[name] and r["status"] == "passed"
                                                    for r in rec["runs"]):
                cells.append("not needed")  # the whole launch passed under this torch
            elif row is None:
                cells.append("not run")
            elif row["status"] == "gated":
                notes.append(f"{len(notes) + 1}. torch {v}, {name}: `{row['line']}`")
                cells.append(f"gated ({len(notes)})")
            elif row["status"] == "skipped":
                cells.append(f"skipped: {row.get('skip', '')}")
            else:
                cells.append(row["status"])
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    if notes:
        lines += ["", "What a gated launch printed:", "", *notes]
    lines += ["", "Provenance:", ""]
    for v, rec in zip(versions, records):
        m = rec["meta"]
        lines.append(f"- torch {v}: {m['date'][:10]}, Python {m['python']}, {m['machine']}, {m['nproc']} "
                     f"process(es) per launch, the book at {m['book_commit']}"
                     f"{' with uncommitted changes' if m['book_tree_dirty'] else ''}; `{m['command']}`"
                     + "".join(f"; then {r['date'][:10]}, the book at {r['book_commit']}: `{r['command']}`"
                               for r in m.get("reruns", [])) + ".")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--expect", default=None, help="the torch version this interpreter must have (e.g. 2.11.0)")
    p.add_argument("--nproc", type=int, default=2, help="processes per launch (1 or 2 on a small CPU)")
    p.add_argument("--only", nargs="+", default=None, help="run only these launches (by name); the JSON keeps the rest")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per launch (a busy CPU is slow)")
    p.add_argument("--inductor", action="store_true",
                   help="chapter 12's compile section with inductor, as on a GPU (minutes of compiling on a CPU; "
                        "default: the script's aot_eager)")
    p.add_argument("--out", default=str(OUT), help="folder of the JSONs and the table")
    p.add_argument("--render", action="store_true", help="only write the table again from the JSONs")
    args = p.parse_args(argv)
    out = Path(args.out)
    if args.render:
        (out / "README.md").write_text(render(out))
        return 0
    import torch

    import script_matrix

    found = base_version(torch.__version__)
    if args.expect and found != args.expect:
        print(f"torch_versions.py: error: this interpreter has torch {torch.__version__}, not {args.expect}; run it "
              f"with the scratch venv's python (make torch-versions TORCH={args.expect})", file=sys.stderr)
        return 2
    if args.nproc < 1:
        print(f"torch_versions.py: error: --nproc must be at least 1, got {args.nproc}", file=sys.stderr)
        return 2
    cmds = script_matrix.commands(args.nproc, "cpu", inductor=args.inductor)
    names = [c["name"] for c in cmds]
    unknown = sorted(set(args.only or []) - set(names))
    if unknown:
        print(f"torch_versions.py: error: --only {' '.join(unknown)}: no such launch; pick from {', '.join(names)}",
              file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"torch-{found}.json"
    previous = json.loads(path.read_text()) if args.only and path.is_file() else {"runs": []}
    old, meta, runs = previous["runs"], provenance(torch.__version__, args.nproc, argv), []
    if args.only and "meta" in previous:  # the last whole run's provenance, and this rerun's after it
        rerun = {k: meta[k] for k in ("date", "book_commit", "book_tree_dirty")}
        rerun["command"] = shown_command(argv, from_make=False)
        meta = {**previous["meta"], "reruns": [*previous["meta"].get("reruns", []), rerun]}
    for cmd in cmds:
        if args.only and cmd["name"] not in args.only:  # the rows of the last run, the narrowed ones too
            runs += [r for r in old if r.get("base", r["name"]) == cmd["name"]]
            continue
        for row in run_narrowing(cmd, args.timeout):
            runs.append({**row, "date": datetime.date.today().isoformat(), "book_commit": meta["book_commit"]})
            print(f"{row['name']}: {row['status']}" + (f" ({row['line']})" if row.get("line") else ""), flush=True)
        path.write_text(json.dumps({"meta": meta, "runs": runs}, indent=1) + "\n")  # a run cut short keeps its rows
    path.write_text(json.dumps({"meta": meta, "runs": runs}, indent=1) + "\n")
    (out / "README.md").write_text(render(out))
    failed = [r["name"] for r in runs if r["status"] == "failed"]
    print(f"{'FAILED: ' + ', '.join(failed) if failed else 'no launch failed'}; {path} and {out / 'README.md'}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
