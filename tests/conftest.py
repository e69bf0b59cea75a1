"""Shared fixtures. Markers: ``torchrun`` launches processes, ``book`` builds the whole book."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def pytest_configure(config):
    config.addinivalue_line("markers", "torchrun: launches processes (a script under torchrun, or alone); "
                                       "make test-fast leaves these out")
    config.addinivalue_line("markers", "book: builds the whole book or drives a browser")


#: The whole book from an empty cache: about 12 minutes on an idle 2-core machine, over 15 when
#: the cores are shared (a CI run timed out at pytest's default of 900 s while other jobs ran).
#: The build is one subprocess with its own timeout; a test that uses it gets the whole budget.
BOOK_BUILD_TIMEOUT_S = 3000


def pytest_collection_modifyitems(config, items):
    """Whichever test first asks for ``built_book`` pays for the build inside its own timeout:
    give every such test room for the build, not the default per-test limit."""
    for item in items:
        if "built_book" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.timeout(BOOK_BUILD_TIMEOUT_S + 600))


@pytest.fixture(scope="session")
def built_book(tmp_path_factory) -> Path:
    """The whole book built once per session from an EMPTY execution cache, under -W -n.

    jupyter-cache keys on code cells only, so a cache kept from an earlier build would hide a
    change in scripts/ or src/; building into a fresh output folder guarantees a cold cache.
    """
    out = tmp_path_factory.mktemp("book")
    cmd = [str(Path(sys.executable).with_name("jupyter-book")), "build", str(ROOT), "--all", "-W", "-n",
           "--keep-going", "--path-output", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                          timeout=BOOK_BUILD_TIMEOUT_S)
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


def refusal(script: str, args: list, world_size: int = 2) -> str:
    """The message ``scripts/<script>`` refuses ``args`` with at ``world_size`` processes, found
    in this process: the script's pure ``validate(args, world_size)`` (what it runs on every rank
    before any process group), so a bad flag costs no torchrun launch. Fails if it accepts them.

    That a refusal reaches the terminal as one line and exit status 2 on every rank is the
    launcher's part, tested once end to end under torchrun (``tests/test_scaling_out.py``).
    """
    from ppbook import launch

    module = launch.load_script(script)
    validate = getattr(module, "validate", None) or module.cli.validate_common  # scripts with no checks of their own
    with pytest.raises(ValueError) as err:
        validate(module.parse_args([str(a) for a in args]), world_size)
    return str(err.value)


def assert_one_line_error(script: str, args: list, message: str, nproc: int = 2) -> None:
    """``script`` refuses bad ``args`` at ``nproc`` processes with one line saying ``message``
    (checked in-process: see :func:`refusal`)."""
    text = refusal(script, args, nproc)
    assert message in text and "\n" not in text, text


def argparse_refusal(script: str, args: list, capsys) -> str:
    """What argparse prints when ``scripts/<script>`` is given ``args`` it cannot parse (exit status 2)."""
    from ppbook import launch

    module = launch.load_script(script)
    with pytest.raises(SystemExit) as err:
        module.parse_args([str(a) for a in args])
    assert err.value.code == 2
    return capsys.readouterr().err
