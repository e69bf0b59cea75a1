"""Write Megatron-LM's command-line flags, as its own parser defines them, for the export test.

``python -m ppbook.plan --export megatron`` prints a ``pretrain_gpt.py`` command; the test
(``tests/test_plan_export.py``) reads it back with Megatron-LM's parser. That parser
(``megatron/training/arguments.py``) is not in the megatron-core wheel and needs Python 3.12 and
triton to import, so this tool runs it once, on a checkout of a Megatron-LM release, and writes
every flag it defines (option strings, destination, arity, type, choices, action, default) with the
release's tag and commit to ``tests/data/megatron_lm_arguments.json``; the test rebuilds an
``argparse`` parser from that file, offline.

    git clone --branch core_v0.19.0 https://github.com/NVIDIA/Megatron-LM /tmp/mlm
    pip install --no-deps --target /tmp/triton triton     # imported by megatron.core's kernels
    PYTHONPATH=/tmp/mlm:/tmp/triton python tools/megatron_arguments.py /tmp/mlm \\
        --tag core_v0.19.0 --commit "$(git -C /tmp/mlm rev-parse HEAD)"

On Python 3.11 the tool lends ``typing.override`` from ``typing_extensions`` (Megatron-LM's
training package imports it; nothing here calls it).
"""

from __future__ import annotations

import argparse
import json
import sys
import typing
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "megatron_lm_arguments.json"
KINDS = {"_StoreAction": "store", "_StoreTrueAction": "store_true", "_StoreFalseAction": "store_false",
         "_StoreConstAction": "store_const", "_AppendAction": "append", "_CountAction": "count",
         "BooleanOptionalAction": "boolean_optional"}


def describe(action: argparse.Action) -> dict:
    kind = KINDS.get(type(action).__name__)
    if kind is None:
        raise SystemExit(f"megatron_arguments: {action.option_strings}: action {type(action).__name__} is not one "
                         "this tool knows; add it to KINDS")
    t = action.type
    type_name = None if t is None else t.__name__ if t in (int, float, str) else "other"
    nargs = action.nargs if action.nargs is None or isinstance(action.nargs, (int, str)) else str(action.nargs)
    out = {"flags": list(action.option_strings), "dest": action.dest, "kind": kind, "nargs": nargs, "type": type_name}
    default = action.default
    if default is None or isinstance(default, (bool, int, float, str)) or (
            isinstance(default, list) and all(isinstance(x, (bool, int, float, str)) for x in default)):
        out["default"] = default
    else:  # an enum or an object: its text, which the test does not read
        out["default_repr"] = repr(default)
    if action.choices is not None:
        out["choices"] = [c if isinstance(c, (int, float, str)) else str(c) for c in action.choices]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("checkout", type=Path, help="a Megatron-LM checkout at a release tag")
    p.add_argument("--tag", required=True, help="the release tag, e.g. core_v0.19.0")
    p.add_argument("--commit", required=True, help="the tag's commit")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    source = args.checkout / "megatron" / "training" / "arguments.py"
    if not source.is_file():
        print(f"megatron_arguments: {source} does not exist; give the root of a Megatron-LM checkout", file=sys.stderr)
        return 2
    if not hasattr(typing, "override"):  # Python 3.11: the training package imports typing.override
        import typing_extensions
        typing.override = typing_extensions.override
    sys.path.insert(0, str(args.checkout))
    from megatron.training import arguments

    parser = arguments.add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
    actions = [describe(a) for a in parser._actions if a.option_strings and a.dest != "help"]
    header = source.read_text().splitlines()[0]
    entry = (args.checkout / "pretrain_gpt.py").read_text()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "about": "Every flag of Megatron-LM's command line as megatron/training/arguments.py's "
                 "add_megatron_arguments defines it, written by tools/megatron_arguments.py; read by "
                 "tests/test_plan_export.py to parse the planner's Megatron-LM export offline",
        "repository": "https://github.com/NVIDIA/Megatron-LM", "tag": args.tag, "commit": args.commit,
        "file": "megatron/training/arguments.py", "copyright": header.lstrip("# "),
        "license": "Megatron-LM's LICENSE (BSD-3-Clause for NVIDIA's code); the names below are its interface",
        "entry_point": "pretrain_gpt.py", "entry_point_present": "def forward_step" in entry,
        "actions": actions}, indent=1) + "\n")
    print(f"wrote {len(actions)} flags of Megatron-LM {args.tag} to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
