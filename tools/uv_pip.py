"""``pip install`` for ``make``'s virtual environment, done by uv, with pip's own configuration.

    python tools/uv_pip.py -r requirements.txt -e .         # what `make` runs, in .venv's python
    python tools/uv_pip.py torch==2.13.0 --index-url URL    # any of uv pip install's arguments

Why: on a 2-core machine pip took 130 s to install the book's packages into a fresh ``.venv``
(resolving, downloading and unpacking ray, torch and jupyter-book one after another, then compiling
every module), a tenth of a fresh ``make test``; uv installs the same pins in about 30 s from an
empty cache. uv does not read pip's configuration, and a machine's pip configuration may be what
finds its packages (a local wheel of torch, a mirror, a proxy's certificate), so this passes on
what ``pip config list`` shows: ``index-url``, ``extra-index-url``, ``find-links`` and
``constraint`` as uv's flags of the same names (an index or folder that does not exist is left out,
as pip ignores it), ``cert`` as ``SSL_CERT_FILE``. Installs into the python that runs this file.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

#: pip's settings with a uv flag of the same name; each may hold several values, space-separated
PASSED = ("index-url", "extra-index-url", "find-links", "constraint")


def pip_config() -> dict[str, list[str]]:
    """pip's settings of :data:`PASSED` and ``cert`` as ``pip config list`` shows them (its files and
    ``PIP_*`` variables), each with its values in order and without repeats."""
    out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    found: dict[str, list[str]] = {}
    for line in out.splitlines():
        key, _, value = line.partition("=")
        name = key.rsplit(".", 1)[-1]
        if name not in (*PASSED, "cert") or not value:
            continue
        for item in shlex.split(value.strip().strip("'\"")):
            if item not in found.setdefault(name, []):
                found[name].append(item)
    return found


def exists(location: str) -> bool:
    """Whether a local index, folder or file is there (a URL of another scheme is assumed to be)."""
    if location.startswith("file://"):
        return Path(location[len("file://"):]).exists()
    return "://" in location or Path(location).exists()


def uv_command(args: list[str], config: dict[str, list[str]]) -> list[str]:
    """``uv pip install`` into this python with ``args``, pip's ``config`` passed on. An index the
    caller names itself (``--index-url``) replaces pip's."""
    from uv import find_uv_bin

    # No bytecode compiled now (all 18,000 files, as pip does: 54 CPU-s, 29 s of a 40 s install).
    # The Makefile lets Python write the bytecode of what is imported, once, where
    # PYTHONDONTWRITEBYTECODE would have every process compile its modules again (a rank: 11 CPU-s
    # instead of 4.5 for torch).
    # Every index's versions weighed together, as pip does (uv's default takes a package's versions
    # from the first index that has any).
    cmd = [find_uv_bin(), "pip", "install", "--index-strategy", "unsafe-best-match",
           "--python", sys.executable, *args]
    for name in PASSED:
        if name in ("index-url", "extra-index-url") and "--index-url" in args:
            continue
        for value in config.get(name, []):
            if exists(value):
                cmd += [f"--{name}", value]
    return cmd


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print("uv_pip.py: error: name what to install, e.g. -r requirements.txt -e .", file=sys.stderr)
        return 2
    config = pip_config()
    env = dict(os.environ)
    if config.get("cert") and "SSL_CERT_FILE" not in env:
        env["SSL_CERT_FILE"] = config["cert"][0]
    return subprocess.run(uv_command(args, config), env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
