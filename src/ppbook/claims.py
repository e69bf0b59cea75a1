"""Conclusions the build checks: glue a number and assert what the sentence beside it says.

Introduced in chapter 0; every chapter uses it. A sentence such as "every stage fits in an
80 GB device" rests on computed numbers. Stating it through :func:`claim` glues the value the
sentence shows *and* checks the condition the sentence asserts, so that when the numbers move
and the sentence becomes false, the page fails to execute with an error naming the claim,
instead of the book printing a conclusion its own numbers contradict::

    claim("stage_max_gb", per_stage_max / 1e9, per_stage_max < 80e9,
          why="the heaviest stage must fit in an 80 GB device")

and in the prose: ``the heaviest stage needs {glue:text}`stage_max_gb:.0f` GB, so it fits``.
"""

from __future__ import annotations

from typing import Any


class ClaimError(AssertionError):
    """A conclusion printed in the book no longer follows from its numbers."""


def check(name: str, holds: bool, why: str = "") -> None:
    """Raise :class:`ClaimError` naming the claim unless ``holds`` (nothing is glued)."""
    if not bool(holds):
        raise ClaimError(f"claim {name!r} is false: {why or 'its condition does not hold'}; "
                         "fix the sentence that states it or the numbers behind it")


def claim(name: str, value: Any, holds: bool, why: str = "") -> Any:
    """Check the conclusion ``holds`` (see :func:`check`), then glue ``value`` as ``name``.

    ``value`` is what the sentence shows (a number, or a word such as "faster" computed from the
    data); ``why`` says what the sentence concludes, for the error message. Returns ``value``.
    Outside a notebook (a test, a script) nothing is glued; the check still runs.
    """
    check(name, holds, why)
    _glue(name, value)
    return value


def _glue(name: str, value: Any) -> None:
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython ships with the book's environment
        return
    if get_ipython() is None:
        return
    from myst_nb import glue

    glue(name, value, display=False)
