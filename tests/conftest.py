"""Shared fixtures. Markers: ``torchrun`` launches processes, ``book`` builds the whole book."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def pytest_configure(config):
    config.addinivalue_line("markers", "torchrun: launches a companion script under torchrun")
    config.addinivalue_line("markers", "book: builds the whole book or drives a browser")


@pytest.fixture(scope="session")
def built_book(tmp_path_factory) -> Path:
    """The whole book built once per session from an EMPTY execution cache, under -W -n.

    jupyter-cache keys on code cells only, so a cache kept from an earlier build would hide a
    change in scripts/ or src/; building into a fresh output folder guarantees a cold cache.
    """
    out = tmp_path_factory.mktemp("book")
    cmd = [str(Path(sys.executable).with_name("jupyter-book")), "build", str(ROOT), "--all", "-W", "-n",
           "--keep-going", "--path-output", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=2400)
    log = proc.stdout + proc.stderr
    (out / "build.log").write_text(log)
    assert proc.returncode == 0, f"book build failed (exit {proc.returncode}):\n{log[-6000:]}"
    html = out / "_build" / "html"
    assert (html / "index.html").is_file(), log[-3000:]
    return html


def assert_one_error_line(result, script: str, message: str) -> None:
    """Bad input: a non-zero exit and exactly one distinct ``<script>: error:`` line, saying ``message``
    (every rank prints the same line; it counts once)."""
    assert result.returncode != 0
    errors = sorted({line for line in result.output.splitlines() if line.startswith(f"{script}: error:")})
    assert len(errors) == 1 and message in errors[0], result.output


def assert_one_line_error(script: str, args: list, message: str, nproc: int = 2, timeout: float = 90) -> None:
    """``script`` under torchrun with bad ``args``: see :func:`assert_one_error_line`."""
    from ppbook import launch

    r = launch.torchrun(script, args, nproc=nproc, timeout=timeout, check=False, json_result=False)
    assert_one_error_line(r, script, message)
