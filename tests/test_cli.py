"""ppbook.cli: the run wrapper's one error line, in-process (no torchrun)."""

from __future__ import annotations

import argparse

import pytest

from ppbook import cli


def refuse(args: argparse.Namespace, world_size: int) -> None:
    raise ValueError("--batch-size 6 must split into --microbatches 4")


@pytest.mark.parametrize("rank, prints", [(None, True), ("0", True), ("1", False), ("3", False)])
def test_bad_input_is_printed_by_global_rank_0_only(monkeypatch, capsys, rank, prints):
    # every rank of a torchrun job fails the same validation at once; two printing ranks
    # interleaved their lines into one, so only global rank 0 (or a plain process) prints
    if rank is None:
        monkeypatch.delenv("RANK", raising=False)
    else:
        monkeypatch.setenv("RANK", rank)
    monkeypatch.setenv("WORLD_SIZE", "4")
    status = cli.run("probe.py", argparse.Namespace(), refuse, body=lambda args, info: 0)
    err = capsys.readouterr().err
    assert status == 2  # every rank exits with the same status
    assert err == ("probe.py: error: --batch-size 6 must split into --microbatches 4\n" if prints else "")


def test_a_raising_body_keeps_the_process_group_until_its_traceback_is_out(monkeypatch):
    # Tearing down in a ``finally`` closed the culprit's connections before Python printed its
    # traceback; a peer then failed with "Connection closed by peer", exited, and the launcher
    # killed the culprit, so the output named only the peer (chapter A3's root cause went missing).
    events = []
    monkeypatch.setattr(cli.ppdist, "setup", lambda device, timeout_s: events.append("setup") or "info")
    monkeypatch.setattr(cli.ppdist, "teardown", lambda: events.append("teardown"))
    args = argparse.Namespace(device="cpu", timeout=60)

    def fails(args, info):
        raise TypeError("forward() takes 2 positional arguments but 3 were given")

    with pytest.raises(TypeError, match="positional arguments"):
        cli.run("probe.py", args, lambda args, world_size: None, fails)
    assert events == ["setup"]
    events.clear()
    assert cli.run("probe.py", args, lambda args, world_size: None, lambda args, info: 3) == 3
    assert events == ["setup", "teardown"]
