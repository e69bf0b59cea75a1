"""tools/build_book.py: which page may start while others run, and which pages run alone."""

from __future__ import annotations

from pathlib import Path

import pytest

import build_book  # tools/, on the path from conftest

A, B, C, T = (Path(f"{n}.md") for n in ("a", "b", "c", "timed"))


def test_two_pages_run_at_once_and_a_timed_page_alone():
    alone = {T}
    assert build_book.may_start(A, set(), alone, jobs=2)
    assert build_book.may_start(B, {A}, alone, jobs=2)
    assert not build_book.may_start(C, {A, B}, alone, jobs=2)  # no free worker
    assert not build_book.may_start(T, {A}, alone, jobs=2)     # a timed page waits for an empty pool
    assert build_book.may_start(T, set(), alone, jobs=2)
    assert not build_book.may_start(A, {T}, alone, jobs=2)     # and nothing joins it
    assert not build_book.may_start(B, {A}, alone, jobs=1)


def test_the_pages_with_measured_times_run_alone_and_first():
    pages = build_book.notebook_pages()
    ordered = build_book.order(pages)
    alone = [p.stem for p in ordered if build_book.executes_alone(build_book.read_page(p))]
    assert alone == ["02_naive", "03_gpipe", "04_splitting", "05_schedules", "schedules_deeper"]
    assert [p.stem for p in ordered[:len(alone)]] == alone and sorted(ordered) == sorted(pages)


@pytest.mark.parametrize("args, message", [
    (["--jobs", "0"], "--jobs must be at least 1, got 0"),
    (["--root", "/nonexistent"], "--root /nonexistent has no _toc.yml: pass the folder of the book"),
])
def test_bad_input_is_refused_in_one_line(args, message, capsys):
    with pytest.raises(SystemExit) as err:
        build_book.main(args)
    assert err.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert message in lines[-1] and lines[-1].startswith("build_book.py: error:"), lines
