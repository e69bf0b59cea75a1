"""Read the errors out of a failed torchrun launch: which rank raised what, and which rank started it.

Introduced in the troubleshooting appendix (book/a3_troubleshooting.md); its tests use it too.

torchrun prefixes every line a rank writes to stderr with ``[rankN]:`` and ends with a summary
whose "Root Cause (first observed failure)" is simply the first process it saw exit, not
necessarily the rank that made the mistake: when one rank crashes, its peers fail next with
gloo's "Connection closed by peer" (or a timeout). :func:`root_cause` skips those consequences.
"""

from __future__ import annotations

import re

_ERROR_LINE = re.compile(r"^\[rank(\d+)\]: ((?:[\w.]+\.)?(\w+(?:Error|Exception))): (.*)$", re.M)
CONSEQUENCES = ("Connection closed by peer", "Connection reset by peer")


def rank_errors(output: str) -> dict[int, tuple[str, str]]:
    """The last exception each rank printed, as ``{rank: (exception type, first line of message)}``.

    The type is the short class name (``PipeliningMetadataError``, not its module path).
    """
    errors = {}
    for m in _ERROR_LINE.finditer(output):
        errors[int(m.group(1))] = (m.group(3), m.group(4).strip())
    return dict(sorted(errors.items()))


def root_cause(output: str) -> tuple[int, str, str] | None:
    """``(rank, exception type, message)`` of the rank whose error is not a consequence
    of a peer's crash; ``None`` when no rank printed an exception."""
    errors = rank_errors(output)
    own = [
        (r, t, msg)
        for r, (t, msg) in errors.items()
        if not any(c in msg for c in CONSEQUENCES)
    ]
    return (
        own[0] if own else next(((r, t, msg) for r, (t, msg) in errors.items()), None)
    )


def surfaced(output: str, kind: str, message: str, rank: int | None = None) -> bool:
    """Whether a failed launch's ``output`` shows one mistake as the book describes it: the root
    cause (:func:`root_cause`) is a ``kind`` whose message contains ``message``, on ``rank`` (any
    rank when ``None``: a race decides which side of a hang times out first), and every other
    rank either made the same mistake or only lost its peer (:data:`CONSEQUENCES`)."""
    cause = root_cause(output)
    if cause is None or cause[1] != kind or message not in cause[2] or rank not in (None, cause[0]):
        return False
    return all(message in msg or any(c in msg for c in CONSEQUENCES) for _, msg in rank_errors(output).values())


def without_source_path(message: str) -> str:
    """gloo prefixes its messages with the C++ file it was built from (``[/__w/.../pair.cc:553] ``);
    drop that prefix so the message reads the same on every build of torch."""
    return re.sub(r"^\[[^\]]*\.(?:cc|cpp|h):\d+\] ", "", message)
