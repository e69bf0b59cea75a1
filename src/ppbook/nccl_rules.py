"""Hold gloo to NCCL's rules, on the CPU: the checking mode behind ``PPBOOK_NCCL_RULES=1``.

Introduced in appendix A3 ("Troubleshooting"). gloo forgives what NCCL does not, so a script that
passes every CPU check can still race or hang on GPUs. With ``PPBOOK_NCCL_RULES=1`` in a rank's
environment, :func:`install` (run by the book's launcher, its launch server, and
:func:`ppbook.dist.setup`) replaces ``torch.distributed``'s point-to-point and collective
functions, DDP's two start-up collectives and the functional collectives
(``torch.ops._c10d_functional``, what DTensor, tensor and context parallelism run) with versions
that behave as NCCL does where NCCL is stricter, and check what NCCL assumes.

While the program runs, in each rank:

- ``batch_isend_irecv`` returns ONE work for the whole batch (NCCL's coalescing path), so code
  that waits on some of the works it got back waits on nothing;
- a received tensor (``irecv``'s, a batch's receives) and the output of every
  asynchronous collective (``async_op=True``) hold poison until the work has been waited on: NaN,
  or the smallest integer for integer tensors; read before ``wait()``, it spoils the result, and
  ``--check`` sees it on every run;
- ``wait()`` refuses a tensor that changed while NCCL owned it: a send's tensor (``isend``, a
  batch's sends) or an asynchronous collective's input that differs from the copy taken when it
  was posted, a receive's or an output that no longer holds the poison;
- a blocking ``send`` returns once posted, as NCCL's does (gloo's waits for the receiver); whether
  it would wait forever on NCCL is decided at the end, below;
- operations issued from two threads with nothing ordering them (no thread start or join, no
  ``Event``, ``Semaphore`` or ``Barrier`` between them) are refused at once: the order two
  threads take differs between ranks from run to run, and NCCL needs one order on every rank.
  A lock does not count: it keeps two threads apart but lets either go first;
- tensors handed to the operations of ``torch.distributed`` must be contiguous; a receive from
  any source (``src=None``) is refused, as NCCL has none.

At the end (``destroy_process_group``, or exit) the ranks compare their records through the
job's store, and the run fails with one line naming the operations and the ranks if:

- a message has no receive (or a receive no message), or its sender and receiver disagree on its
  number of elements or its dtype (:func:`message_problem`); or it was sent alone (``send``,
  ``isend``) and received in a ``batch_isend_irecv``, or the other way round: without
  ``device_id`` in ``init_process_group``, NCCL runs lone messages on a communicator of the two
  ranks and batches on the group's, and the two never meet;
- the first operation of a rank on a group is a ``batch_isend_irecv`` and some rank of the group
  does not also begin with one (:func:`first_batch_problem`: torch's ``batch_isend_irecv``
  documentation; the communicator is created inside it);
- the operations can wait on each other forever on NCCL (:func:`deadlock_problem`): every
  message is taken to be large (a send completes only once its receive has started), a
  communicator's operations run one after the other, a collective completes only once every
  member has started it, collectives on different groups are taken to run in one order (NCCL's
  guide asks for one order across communicators), and ``wait()`` holds everything issued after
  it until the work completes; checked with lone messages on two-rank communicators and with one
  communicator per group, the two layouts torch uses without and with ``device_id``;
- a receive or an asynchronous collective was never waited on, or a send's tensor changed and
  its work was never waited on.

Every check depends on what the program does, not on how its threads or the network happen to
interleave: a violation fails every run. ``PPBOOK_NCCL_RULES_RECORD=DIR`` also writes each
rank's record to ``DIR/rankN.json``. Set ``PPBOOK_NCCL_RULES=0`` (or leave it unset) for gloo as
it is.

Not checked: the collectives DDP's reducer issues from C++ during the backward (invisible from
Python; on GPUs NCCL's flight recorder records them); a CUDA
synchronisation (``.item()``, ``.cpu()``) that would wait on a collective or a message on NCCL;
the functional point-to-point ops (``torch.ops._c10d_functional.isend``, ``irecv``,
``batch_p2p_ops``, which only compiled code issues) and anything issued inside compiled code; the
functional collectives' outputs are not poisoned (the ``AsyncCollectiveTensor`` that wraps one
waits when first read) and their tensors are not checked for contiguity (they copy); the
sizes of collectives across ranks; whether a tensor is on the rank's GPU (on a CPU run every
tensor is on the CPU: the suite's device check, ``tests/test_devices.py``, catches CPU tensors
headed for NCCL); a semaphore used as a lock (it orders two threads in whichever order they
arrive); messages small enough that NCCL would not wait for their receive (every message counts
as large, so code that only works because its messages are small is refused).
"""

from __future__ import annotations

import atexit
import inspect
import itertools
import json
import os
import sys
import threading
import time
from datetime import timedelta

ENV = "PPBOOK_NCCL_RULES"
RECORD_ENV = "PPBOOK_NCCL_RULES_RECORD"  # a folder: each rank writes its record there at the end
PREFIX = "ppbook.nccl_rules"
STORE_WAIT_S = 60.0  # at the end, how long a rank waits for the others' records
_SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "nccl_rules_site")


def asked(environ=None) -> bool:
    """Whether ``PPBOOK_NCCL_RULES`` asks for the mode (1, true, yes, on; unset, 0, false, no, off:
    not); any other value is refused in one line rather than read as off."""
    environ = os.environ if environ is None else environ
    value = environ.get(ENV, "").strip().lower()
    if value not in ("1", "true", "yes", "on", "", "0", "false", "no", "off"):
        raise ValueError(f"{ENV}={environ[ENV]!r} is neither on nor off: set it to 1 to hold gloo to NCCL's "
                         "rules, or 0 for gloo as it is")
    return value in ("1", "true", "yes", "on")


def site_folder() -> str:
    """A folder to put first on ``PYTHONPATH``: its ``sitecustomize`` installs the mode in every
    Python process started with ``PPBOOK_NCCL_RULES=1`` (torchrun's ranks, for scripts that
    import nothing from the book)."""
    return _SITE


class RuleError(RuntimeError):
    """A rule of NCCL that the program broke (raised where it is found, in this rank)."""


# ----------------------------------------------------------------------------- state

class _State:
    def __init__(self):
        self.lock = threading.RLock()
        self.launches = []  # this rank's operations in issue order (see _issue)
        self.waits = []  # [operation index, how many operations had been issued] per first wait()
        self.firsts = {}  # group name -> this rank's first collective or batch on it
        self.counts = {}  # per description kind: how many so far (for "#n" in messages)
        self.event_counts = {}  # per event key without its index: how many so far
        self.last = None  # (thread token, its clock at the op, description, thread name)
        self.pending_sends = []  # gloo's works of sends: NCCL's wait() does not hold the CPU for them
        self.unwaited = {}  # id -> description of works whose tensors hold poison, not waited on yet
        self.open_sends = {}  # id -> (description, [(tensor, its copy when posted)]) of sends not waited on
        self.functional = {}  # data_ptr of a functional collective's output -> its operation's index
        self.checked = False
        self.suspended = 0
        self.crashed = False  # an exception reached the top: the exit's check would only add noise


_state = _State()
_installed = False
_orig = {}
_tokens = itertools.count(1)
_local = threading.local()


def _reset_after_fork() -> None:
    global _state
    _state = _State()
    _local.__dict__.clear()


class _inner:
    """``with _inner():`` this thread is inside one of the replacements: the functions of
    ``torch.distributed`` it calls (``all_gather_into_tensor`` calls ``all_gather_single``) run
    as they are, neither recorded nor checked a second time."""

    def __enter__(self):
        _local.depth = getattr(_local, "depth", 0) + 1

    def __exit__(self, *exc):
        _local.depth -= 1


def _nested() -> bool:
    return getattr(_local, "depth", 0) > 0
# ----------------------------------------------------------------------------- vector clocks
# Each thread carries a vector clock; a thread start or join, an Event, a Semaphore and a
# Barrier carry clocks from one thread to another. Operation A happened before operation B
# (something orders them) iff A's clock entry of its own thread is <= B's clock's entry.

def _token() -> int:
    tok = getattr(_local, "token", None)
    if tok is None:
        tok = _local.token = next(_tokens)
        parent = getattr(threading.current_thread(), "_ppbook_start_clock", None)
        _local.clock = dict(parent or {})
        _local.clock[tok] = _local.clock.get(tok, 0)
        threading.current_thread()._ppbook_clock = _local.clock
    return tok


def _clock() -> dict:
    _token()
    return _local.clock


def _tick() -> None:
    tok = _token()
    _local.clock[tok] += 1


def _join_into(target: dict, other: dict | None) -> None:
    for k, v in (other or {}).items():
        if target.get(k, 0) < v:
            target[k] = v


def _starting() -> bool:
    """Whether this thread is still starting (threading's own Event, before the thread is
    registered): no clock then, since asking for the current thread would register a dummy one."""
    return threading.get_ident() not in threading._active


def _acquire_clock(holder) -> None:
    if _starting():
        return
    _join_into(_clock(), getattr(holder, "_ppbook_sync_clock", None))


def _release_clock(holder) -> None:
    if _starting():
        return
    with _state.lock:
        box = holder.__dict__.setdefault("_ppbook_sync_clock", {})
        _join_into(box, _clock())
    _tick()


def _patch_threading() -> None:
    orig_start, orig_join = threading.Thread.start, threading.Thread.join

    def start(self):
        if not _starting():
            self._ppbook_start_clock = dict(_clock())
            _tick()
        return orig_start(self)

    def join(self, timeout=None):
        orig_join(self, timeout)
        if not self.is_alive() and not _starting():
            _join_into(_clock(), getattr(self, "_ppbook_clock", None) or getattr(self, "_ppbook_start_clock", None))

    threading.Thread.start, threading.Thread.join = start, join

    class Event(threading.Event):
        def set(self):
            _release_clock(self)
            super().set()

        def wait(self, timeout=None):
            ok = super().wait(timeout)
            if ok:
                _acquire_clock(self)
            return ok

        def is_set(self):
            ok = super().is_set()
            if ok:
                _acquire_clock(self)
            return ok

    class Semaphore(threading.Semaphore):
        def release(self, n=1):
            _release_clock(self)
            super().release(n)

        def acquire(self, blocking=True, timeout=None):
            ok = super().acquire(blocking, timeout)
            if ok:
                _acquire_clock(self)
            return ok

        __enter__ = acquire

    class BoundedSemaphore(threading.BoundedSemaphore):
        release, acquire = Semaphore.release, Semaphore.acquire
        __enter__ = acquire

    class Barrier(threading.Barrier):
        # the clocks of one generation's parties, joined by all of them on the way out
        def wait(self, timeout=None):
            with _state.lock:
                gens = self.__dict__.setdefault("_ppbook_generations", {})
                arrived = self.__dict__.get("_ppbook_arrived", 0)
                self._ppbook_arrived = arrived + 1
                gen = arrived // self.parties
                _join_into(gens.setdefault(gen, {}), _clock())
            _tick()
            index = super().wait(timeout)
            _join_into(_clock(), gens[gen])
            return index

    threading.Event, threading.Semaphore, threading.BoundedSemaphore, threading.Barrier = (
        Event, Semaphore, BoundedSemaphore, Barrier)


# ----------------------------------------------------------------------------- failing

def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", "0"))


def _fail(line: str, speaker: bool = True) -> None:
    """End this rank with ``line`` on stderr and exit status 1. ``speaker=False``: a rank that
    found what rank ``speaker`` reports lets it speak first (the launcher stops the others when it
    exits), then says it itself after a few seconds if it is still running."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    if not speaker:
        time.sleep(10.0)
    sys.stderr.write(f"{PREFIX}: {line}\n")
    sys.stderr.flush()
    os._exit(1)


# ----------------------------------------------------------------------------- recording

def _group_of(group):
    from torch.distributed import distributed_c10d as c10d

    return group if group is not None else c10d._get_default_group()


def _group_label(group) -> tuple[str, list[int]]:
    import torch.distributed as dist

    g = _group_of(group)
    return g.group_name, dist.get_process_group_ranks(g)


def _global_peer(group, peer, group_peer) -> int:
    from torch.distributed import distributed_c10d as c10d

    return c10d._canonicalize_group_rank(_group_of(group), peer, group_peer, return_global=True)


def _check_tensor(t, what: str) -> None:
    import torch

    if not isinstance(t, torch.Tensor) or _state.suspended:
        return
    if not t.is_contiguous():
        raise RuleError(f"{what}: a non-contiguous tensor (shape {tuple(t.shape)}, strides {t.stride()}); NCCL "
                        f"takes only contiguous tensors: pass t.contiguous()")


def _tensors(value) -> list:
    """The tensors in ``value``: a tensor, a list of them, a list of lists, or ``None``."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return [value]


def _issue(what: str, kind: str, group, messages=()) -> tuple[str, int | None]:
    """Record one operation of this rank on ``group``: ``kind`` is "coll" (a collective),
    "batch" (a ``batch_isend_irecv``) or "lone" (a send or receive of its own); ``messages`` are
    its point-to-point messages, (sender, receiver, tensor, "send" or "recv": which side this
    rank is), global ranks. Refuses an operation
    issued from another thread than the last one with nothing ordering the two. Returns the
    operation's description with its number, and its index in this rank's record (``None``
    inside :class:`suspended`).

    A record is ``{"what", "kind", "group", "events", "msgs", "pair"}``. ``events`` (what
    :func:`order_problem` reads) are ``["coll", group, k]`` for the k-th collective on the group
    and ``["p2p", group, sender, receiver, k]`` for the k-th message between the two on the
    group; ``msgs`` are, per message, ``[role, sender, receiver, k among those of its kind,
    k among all, number of elements, dtype]``; ``pair`` is the two ranks of a lone message."""
    import torch.distributed as dist

    g = _group_of(group)
    name, ranks = g.group_name, dist.get_process_group_ranks(g)
    me = _rank()
    with _state.lock:
        n = _state.counts[what] = _state.counts.get(what, 0) + 1
        label = f"{what} #{n}"
        if _state.suspended:
            return label, None
        tok, thread = _token(), threading.current_thread().name
        if _state.last is not None:
            last_tok, last_clock, last_label, last_name = _state.last
            if last_tok != tok and last_clock[last_tok] > _clock().get(last_tok, 0):
                line = (f"rank {me}: {last_label} (thread {last_name}) and {label} (thread {thread}) were issued "
                        f"from two threads with nothing ordering them: their order differs from run to run and "
                        f"between ranks, and NCCL needs every rank to issue its operations in one order; make the "
                        f"threads take turns in a fixed order (an Event, a Semaphore or a Barrier between them), "
                        f"as torchtitan's HookCoordinator does")
                _fail(line, speaker=me == 0)
        events, msgs = [], []

        def count(key) -> int:
            k = _state.event_counts[key] = _state.event_counts.get(key, 0) + 1
            return k

        if kind == "coll":
            events.append(["coll", name, count(("coll", name))])
        for src, dst, t, role in messages:  # counted per side: a rank may send to itself
            k_all = count(("p2p", name, src, dst, role))
            events.append(["p2p", name, src, dst, k_all])
            k_kind = count(("p2p", name, src, dst, role, kind))
            msgs.append([role, src, dst, k_kind, k_all, t.numel(), str(t.dtype).replace("torch.", "")])
        op = {"what": label, "kind": kind, "group": name, "events": events}
        if msgs:
            op["msgs"] = msgs
        if kind == "lone":
            op["pair"] = sorted({m[0] for m in messages} | {m[1] for m in messages})
        if kind != "lone" and name not in _state.firsts:
            _state.firsts[name] = {"kind": kind, "what": label, "ranks": ranks,
                                   "bound": getattr(g, "bound_device_id", None) is not None}
        _tick()
        _state.last = (tok, dict(_clock()), label, thread)
        _state.launches.append(op)
        return label, len(_state.launches) - 1


def _waited(index: int | None) -> None:
    """Operation ``index`` of this rank was waited on (NCCL: the current stream waits for it, so
    everything issued after this waits too)."""
    if index is not None:
        with _state.lock:
            _state.waits.append([index, len(_state.launches)])


def _pending(work) -> None:
    """A gloo work of a send that NCCL's ``wait()`` would not hold the CPU for: kept, and waited
    on at the end, so that the message is delivered before the group goes."""
    with _state.lock:
        _state.pending_sends = [w for w in _state.pending_sends if not w.is_completed()]
        _state.pending_sends.append(work)


# ----------------------------------------------------------------------------- works

def _poison(t) -> None:
    import torch

    with torch.no_grad():
        if t.is_floating_point() or t.is_complex():
            t.fill_(float("nan"))
        elif t.dtype == torch.bool:
            t.fill_(True)
        else:
            t.fill_(torch.iinfo(t.dtype).min)


def _holds_poison(t) -> bool:
    import torch

    if t.is_floating_point() or t.is_complex():
        return bool(torch.isnan(t).all())
    if t.dtype == torch.bool:
        return bool(t.all())
    return bool((t == torch.iinfo(t.dtype).min).all())


def _unchanged(t, copy) -> bool:
    """Whether ``t`` holds, bit for bit, what ``copy`` does (NaN equals NaN)."""
    import torch

    try:
        return torch.equal(t.reshape(-1).view(torch.uint8), copy.reshape(-1).view(torch.uint8))
    except RuntimeError:  # a dtype that cannot be viewed as bytes
        return torch.equal(t, copy)


def _copy(t):
    return t.detach().clone()


def _work_class():
    import torch
    import torch.distributed as dist

    class Batch(dist.Work):
        """One work for one operation, or for all of a batch (NCCL's coalesced batch). Waiting on
        it waits on the receives and collectives (not on the sends: NCCL's ``wait()`` holds the
        stream, not the CPU, until a send's peer receives), checks that no tensor changed while
        NCCL owned it, and fills the outputs, which hold poison until then."""

        def __init__(self, label, index, works=(), copies=(), snaps=(), sends=(), result=None):
            super().__init__()
            self._label, self._index, self._works = label, index, list(works)
            self._copies = list(copies)  # (what the operation wrote, the caller's tensor)
            self._snaps = list(snaps)  # (a tensor NCCL reads, a copy of it when posted)
            self._result, self._done = result, False
            for w in sends:
                _pending(w)
            with _state.lock:
                if self._copies:
                    _state.unwaited[id(self)] = label
                if self._snaps:
                    _state.open_sends[id(self)] = (label, self._snaps)

        def _finish(self):
            if self._done:
                return
            self._done = True
            with _state.lock:
                _state.unwaited.pop(id(self), None)
                _state.open_sends.pop(id(self), None)
            for t, copy in self._snaps:
                if not _unchanged(t, copy):
                    raise RuleError(f"{self._label}: a tensor it sends changed before its work was waited on; NCCL "
                                    f"reads it until then, and the peer may get the new values or a mix: leave it "
                                    f"alone until wait() returns, or send a copy")
            if not all(_holds_poison(dst) for _, dst in self._copies):  # all checked before any is filled:
                # torch's own warm-up receives twice into one tensor, in one batch
                raise RuleError(f"{self._label}: a tensor it writes was written to before its work was waited on; "
                                f"NCCL writes it until then, and one of the two writes is lost: leave it alone until "
                                f"wait() returns")
            with torch.no_grad():  # the receiver may have made it a leaf that requires grad since
                for tmp, dst in self._copies:
                    dst.copy_(tmp)
            _waited(self._index)

        def wait(self, timeout=timedelta(0)):
            for w in self._works:
                if w is not None:
                    w.wait(timeout) if timeout else w.wait()
            self._finish()
            return True

        def is_completed(self):
            if all(w is None or w.is_completed() for w in self._works):
                self._finish()
                return True
            return False

        def is_success(self):
            return self.is_completed()

        def result(self):
            self.wait()
            return list(self._result or [])

        def get_future(self):
            self.wait()
            fut = torch.futures.Future()
            fut.set_result(list(self._result or []))
            return fut

    return Batch


_Batch = None


def _batch(label, index, **kwargs):
    global _Batch
    if _Batch is None:
        _Batch = _work_class()
    return _Batch(label, index, **kwargs)


# ----------------------------------------------------------------------------- point-to-point

def _is_send(fn) -> bool:
    from torch.distributed import distributed_c10d as c10d

    return fn in (c10d.isend, _orig["isend"], _isend)


def _isend(tensor, dst=None, group=None, tag=0, group_dst=None):
    if _nested():
        return _orig["isend"](tensor, dst, group, tag, group_dst)
    _check_tensor(tensor, "isend")
    peer = _global_peer(group, dst, group_dst)
    label, index = _issue(f"isend to rank {peer}", "lone", group, [(_rank(), peer, tensor, "send")])
    copy = _copy(tensor)  # what travels: the caller may change its tensor once wait() returns
    work = _orig["isend"](copy, dst, group, tag, group_dst)
    return _batch(label, index, snaps=[(tensor, copy)], sends=[work])


def _irecv(tensor, src=None, group=None, tag=0, group_src=None):
    import torch

    if _nested():
        return _orig["irecv"](tensor, src, group, tag, group_src)
    _refuse_any_source(src, group_src, "irecv")
    _check_tensor(tensor, "irecv")
    peer = _global_peer(group, src, group_src)
    label, index = _issue(f"irecv from rank {peer}", "lone", group, [(peer, _rank(), tensor, "recv")])
    tmp = torch.empty_like(tensor)
    work = _orig["irecv"](tmp, src, group, tag, group_src)
    _poison(tensor)
    return _batch(label, index, works=[work], copies=[(tmp, tensor)], result=[tensor])


def _send(tensor, dst=None, group=None, tag=0, group_dst=None):
    if _nested():
        return _orig["send"](tensor, dst, group, tag, group_dst)
    _check_tensor(tensor, "send")
    peer = _global_peer(group, dst, group_dst)
    label, index = _issue(f"send to rank {peer}", "lone", group, [(_rank(), peer, tensor, "send")])
    # NCCL's send returns once enqueued (its wait() holds the stream, not the CPU): the data as it
    # is now travels, the caller goes on; whether the send would wait forever is checked at the end
    _pending(_orig["isend"](_copy(tensor), dst, group, tag, group_dst))
    _waited(index)


def _recv(tensor, src=None, group=None, tag=0, group_src=None):
    if _nested():
        return _orig["recv"](tensor, src, group, tag, group_src)
    _refuse_any_source(src, group_src, "recv")
    _check_tensor(tensor, "recv")
    peer = _global_peer(group, src, group_src)
    _, index = _issue(f"recv from rank {peer}", "lone", group, [(peer, _rank(), tensor, "recv")])
    _orig["irecv"](tensor, src, group, tag, group_src).wait()
    _waited(index)
    return peer


def _refuse_any_source(src, group_src, what):
    if src is None and group_src is None:
        raise RuleError(f"{what} from any source (src=None): NCCL has no such receive; name the sender")


def _batch_isend_irecv(p2p_op_list):
    import torch

    from torch.distributed import distributed_c10d as c10d

    c10d._check_p2p_op_list(p2p_op_list)
    me, messages, peers = _rank(), [], []
    for op in p2p_op_list:
        _check_tensor(op.tensor, "batch_isend_irecv")
        messages.append((me, op.peer, op.tensor, "send") if _is_send(op.op) else (op.peer, me, op.tensor, "recv"))
        peers.append(op.peer)
    label, index = _issue(f"batch_isend_irecv with rank{'s' if len(set(peers)) > 1 else ''} "
                          f"{', '.join(map(str, sorted(set(peers))))}", "batch", p2p_op_list[0].group, messages)
    works, copies, snaps, sends = [], [], [], []
    for op in p2p_op_list:
        if _is_send(op.op):
            copy = _copy(op.tensor)
            sends.append(_orig["isend"](copy, group=op.group, tag=op.tag, group_dst=op.group_peer))
            snaps.append((op.tensor, copy))
        else:
            tmp = torch.empty_like(op.tensor)
            works.append(_orig["irecv"](tmp, group=op.group, tag=op.tag, group_src=op.group_peer))
            copies.append((tmp, op.tensor))
    for _, dst in copies:
        _poison(dst)
    # one work for the batch, as NCCL's coalescing path returns
    return [_batch(label, index, works=works, copies=copies, snaps=snaps, sends=sends,
                   result=[dst for _, dst in copies])]


# ----------------------------------------------------------------------------- collectives

#: name: (the tensors it reads, the tensors it writes) by parameter name; for a collective with a
#: root, (those on the root, those elsewhere, the root's global and group parameters). A tensor
#: both read and written (all_reduce's) counts as written: its copy starts from its values.
COLLECTIVES = {
    "all_reduce": ((), ("tensor",)), "all_reduce_coalesced": ((), ("tensors",)),
    "broadcast": ((("tensor",), ()), ((), ("tensor",)), "src", "group_src"),
    "reduce": (((), ("tensor",)), (("tensor",), ()), "dst", "group_dst"),
    "all_gather": (("tensor",), ("tensor_list",)),
    "all_gather_single": (("input_tensor",), ("output_tensor",)),
    "all_gather_into_tensor": (("input_tensor",), ("output_tensor",)),
    "all_gather_coalesced": (("input_tensor_list",), ("output_tensor_lists",)),
    "reduce_scatter": (("input_list",), ("output",)),
    "reduce_scatter_single": (("input",), ("output",)),
    "reduce_scatter_tensor": (("input",), ("output",)),
    "gather": ((("tensor",), ("gather_list",)), (("tensor",), ()), "dst", "group_dst"),
    "scatter": ((("scatter_list",), ("tensor",)), ((), ("tensor",)), "src", "group_src"),
    "all_to_all": (("input_tensor_list",), ("output_tensor_list",)),
    "all_to_all_single": (("input",), ("output",)),
    "barrier": ((), ()),
}


def _roles(fname: str, args: dict, group) -> tuple[list[str], list[str]]:
    """The parameters of ``fname`` (called with ``args``) that it reads and writes on this rank."""
    spec = COLLECTIVES[fname]
    if len(spec) == 2:
        return list(spec[0]), list(spec[1])
    root, other, global_param, group_param = spec
    root_rank = args.get(global_param)
    if root_rank is None and args.get(group_param) is not None:
        import torch.distributed as dist

        root_rank = dist.get_global_rank(_group_of(group), args[group_param])
    return [list(r) for r in (root if root_rank == _rank() else other)]


def _collective(fname: str):
    """``torch.distributed.<fname>`` recorded and checked: its tensors contiguous; when
    asynchronous, its outputs poisoned and its inputs copied until its work is waited on."""
    import torch
    from torch.distributed import distributed_c10d as c10d

    orig = _orig[fname]
    signature = inspect.signature(orig)

    def wrapper(*args, **kwargs):
        if _nested():
            return orig(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        group = a.get("group")
        if c10d._rank_not_in_group(group):
            return orig(*args, **kwargs)
        reads, writes = _roles(fname, a, group)
        _check_tensors([a.get(p) for p in reads + writes], fname)
        name, ranks = _group_label(group)
        label, index = _issue(f"{fname} on group {name} {ranks}", "coll", group)
        if not a.get("async_op"):
            with _inner():
                out = orig(*args, **kwargs)
            _waited(index)
            return out
        # gloo works on copies: NCCL's outputs hold nothing usable until wait(), and its inputs must
        # not change until then (gloo may also use a reduce's input as scratch space)
        written = {t.untyped_storage().data_ptr() for p in writes for t in _tensors(a.get(p))}
        copies, snaps = [], []
        for p in writes:
            copies += _swap(a, p)
        for p in reads:  # an input inside an output (FSDP2 gathers in place) is checked as the output
            snaps += [(t, c) for c, t in _swap(a, p) if t.untyped_storage().data_ptr() not in written]
        with _inner():
            work = orig(*bound.args, **bound.kwargs)
        for _, dst in copies:
            _poison(dst)
        return _batch(label, index, works=[work], copies=copies, snaps=snaps, result=[d for _, d in copies])

    wrapper.__name__ = wrapper.__qualname__ = fname
    wrapper.__doc__ = orig.__doc__
    wrapper.__wrapped__ = orig
    return wrapper


def _swap(args: dict, param: str) -> list:
    """Replace ``args[param]`` (a tensor, a list of them, or of lists) by copies; the pairs
    (copy, original)."""
    import torch

    value = args.get(param)
    if isinstance(value, torch.Tensor):
        args[param] = _copy(value)
    elif value is not None:
        args[param] = [[_copy(t) for t in v] if isinstance(v, (list, tuple)) else _copy(v) for v in value]
    return list(zip(_tensors(args[param]), _tensors(value)))


def _check_tensors(values, what: str) -> None:
    for t in _tensors(list(values)):
        _check_tensor(t, what)


def _ddp_collective(fname: str):
    """DDP's collectives at start-up (``_broadcast_coalesced``, the parameters' broadcast, and
    ``_verify_params_across_processes``), issued from Python: recorded on their group."""
    orig = _orig[fname]

    def wrapper(process_group, *args, **kwargs):
        if _nested():
            return orig(process_group, *args, **kwargs)
        name, ranks = _group_label(process_group)
        _, index = _issue(f"{fname} on group {name} {ranks}", "coll", process_group)
        with _inner():
            out = orig(process_group, *args, **kwargs)
        _waited(index)
        return out

    wrapper.__name__ = wrapper.__qualname__ = fname
    wrapper.__doc__ = orig.__doc__
    return wrapper


def _destroy_process_group(group=None):
    import torch.distributed as dist

    if group is None and dist.is_initialized():
        check_order()
    return _orig["destroy_process_group"](group)


# ----------------------------------------------------------------------------- functional collectives
# What DTensor (tensor and context parallelism, FSDP2's DTensor parameters when gathered whole)
# runs: ``torch.ops._c10d_functional.*``, called from Python by torch's functional collectives
# and by their backward formulas. Each op on the namespace is replaced by a packet that records
# the call and runs the op; ``wait_tensor`` records the wait of the op whose output it waits for.

FUNCTIONAL = ("all_reduce", "all_reduce_", "all_reduce_coalesced", "all_reduce_coalesced_", "all_gather_into_tensor",
              "all_gather_into_tensor_out", "all_gather_into_tensor_coalesced", "reduce_scatter_tensor",
              "reduce_scatter_tensor_out", "reduce_scatter_tensor_coalesced", "all_to_all_single", "broadcast",
              "broadcast_")


def _functional_packet(packet, waits: bool):
    from torch._ops import OpOverloadPacket

    class Recorded(OpOverloadPacket):
        """``packet``, recorded when called eagerly (not while tracing or compiling)."""

        def __init__(self):
            super().__init__(packet._qualified_op_name, packet.__name__, packet._op, packet._overload_names)
            self._ppbook_packet = packet
            names = [a.name for a in packet.default._schema.arguments]
            self._ppbook_group_at = names.index("group_name") if "group_name" in names else None

        def __getattr__(self, key):  # its overloads are the original packet's (one object per op)
            return getattr(self._ppbook_packet, key)

        def __call__(self, *args, **kwargs):
            from torch.distributed import _functional_collectives as funcol
            from torch.distributed import distributed_c10d as c10d

            if _nested() or funcol._are_we_tracing():
                return self._op(*args, **kwargs)
            if waits:
                out = self._op(*args, **kwargs)
                with _state.lock:
                    index = _state.functional.pop(args[0].data_ptr(), None)
                _waited(index)
                return out
            group_name = kwargs["group_name"] if "group_name" in kwargs else args[self._ppbook_group_at]
            group = c10d._resolve_process_group(group_name)
            name, ranks = _group_label(group)
            _, index = _issue(f"{self} on group {name} {ranks}", "coll", group)
            out = self._op(*args, **kwargs)
            if index is not None:
                with _state.lock:
                    for t in _tensors(out):
                        _state.functional[t.data_ptr()] = index
            return out

    return Recorded()


def _install_functional() -> None:
    import torch

    space = torch.ops._c10d_functional
    for name in (*FUNCTIONAL, "wait_tensor"):
        packet = getattr(space, name)
        _orig[f"functional.{name}"] = packet
        setattr(space, name, _functional_packet(packet, waits=name == "wait_tensor"))
# ----------------------------------------------------------------------------- the checks across ranks

def check_order() -> None:
    """Compare this rank's record with every other rank's (through the job's store) and fail the
    run if the ranks' operations break one of NCCL's rules (:func:`nccl_problem`), or if an
    operation's tensors were left to NCCL unwaited. Run at ``destroy_process_group`` and at exit;
    once."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    with _state.lock:
        if _state.checked or _state.crashed or not dist.is_initialized():
            return
        _state.checked = True
        unwaited, open_sends = dict(_state.unwaited), list(_state.open_sends.values())
        record = {"ops": list(_state.launches), "waits": list(_state.waits), "firsts": dict(_state.firsts)}
    rank, world = dist.get_rank(), dist.get_world_size()
    if unwaited:
        first = next(iter(unwaited.values()))
        _fail(f"rank {rank}: {len(unwaited)} operation(s) that write tensors were never waited on (the first: "
              f"{first}): on NCCL their tensors may not have arrived when read; wait on every work that "
              f"batch_isend_irecv returns for a batch that receives (NCCL returns one work for the batch), and on "
              f"every asynchronous collective's")
    for label, snaps in open_sends:
        if not all(_unchanged(t, copy) for t, copy in snaps):
            _fail(f"rank {rank}: {label}: a tensor it sends changed, and its work was never waited on; NCCL reads "
                  f"it until the work completes: wait on the work before changing the tensor")
    if os.environ.get(RECORD_ENV):
        with open(os.path.join(os.environ[RECORD_ENV], f"rank{rank}.json"), "w") as f:
            json.dump(record, f)
    records = {0: record}
    if world > 1:
        store = c10d._get_default_store()
        prefix = f"{PREFIX}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"  # torchrun keeps its store
        store.set(f"{prefix}/{rank}", json.dumps(record))
        keys = [f"{prefix}/{r}" for r in range(world)]
        try:
            store.wait(keys, timedelta(seconds=STORE_WAIT_S))
        except Exception:  # a rank that never got here has failed already: its own error says why
            sys.stderr.write(f"{PREFIX}: rank {rank}: the other ranks' records did not come within "
                             f"{STORE_WAIT_S:.0f} s; the order across ranks was not checked\n")
            return
        records = {r: json.loads(store.get(k)) for r, k in enumerate(keys)}
    problem = nccl_problem(records)
    if problem:
        _fail(problem, speaker=rank == 0)
    with _state.lock:
        sends = list(_state.pending_sends)
    for work in sends:  # what a send owes: delivered before the group goes
        work.wait()


def nccl_problem(records: dict[int, dict]) -> str | None:
    """What in the ranks' records (``records``: per rank, ``{"ops", "waits", "firsts"}`` as the
    mode records them, see :func:`_issue`) breaks one of NCCL's rules, in one line, or ``None``:
    :func:`message_problem`, then :func:`first_batch_problem`, then :func:`deadlock_problem`."""
    return message_problem(records) or first_batch_problem(records) or deadlock_problem(records)


LAYOUTS = {  # how torch's NCCL process group places a lone message, with a line that says so
    "pairs": "without device_id in init_process_group (torch runs each pair's lone messages on a communicator "
             "of their own)",
    "group": "with device_id in init_process_group (torch runs lone messages on the group's communicator)",
}


def _messages(records, layout: str) -> dict:
    """Per message, as NCCL matches them in ``layout`` (the k-th from a sender to a receiver on
    a communicator): role -> (rank, operation, number of elements, dtype)."""
    found = {}
    for rank, rec in records.items():
        for op in rec["ops"]:
            for role, src, dst, k_kind, k_all, numel, dtype in op.get("msgs", ()):
                key = ((op["group"], src, dst, k_all) if layout == "group"
                       else (op["group"], op["kind"], src, dst, k_kind))
                found.setdefault(key, {})[role] = (rank, op, numel, dtype)
    return found


def message_problem(records: dict[int, dict]) -> str | None:
    """A message without its receive (or a receive without its message), or whose two sides
    disagree on its number of elements or its dtype, in one line; or ``None``. NCCL matches the
    k-th send from one rank to another with the k-th receive on the same communicator, with the
    same count and dtype on both sides; tags are ignored. Checked as torch places messages with
    one communicator per group (lone messages and batches in one order), then with a
    communicator per pair for lone messages: what passes the first and not the second sends alone
    what the peer receives in a batch, or the other way round."""
    for layout in ("group", "pairs"):
        for key, sides in sorted(_messages(records, layout).items(), key=lambda kv: str(kv[0])):
            send, recv = sides.get("send"), sides.get("recv")
            src, dst = key[-3], key[-2]
            if send and recv and (send[2], send[3]) == (recv[2], recv[3]):
                continue
            if send and recv:
                return (f"rank {src}'s {send[1]['what']} sends {send[2]} {send[3]} values and rank {dst}'s "
                        f"{recv[1]['what']} receives {recv[2]} {recv[3]} values: NCCL needs the same count and dtype "
                        f"on both sides (gloo passes it, the rest of the receive holding what it held before); "
                        f"receive into a tensor of the sent tensor's size and dtype")
            if layout == "pairs":
                other = _messages(records, "group")
                mine = send or recv
                k_all = next(m[4] for m in mine[1]["msgs"] if m[1:3] == [src, dst] and m[3] == key[-1])
                peer = other.get((key[0], src, dst, k_all), {}).get("recv" if send else "send")
                if peer:
                    lone, batched = (mine, peer) if mine[1]["kind"] == "lone" else (peer, mine)
                    return (f"rank {lone[0]}'s {lone[1]['what']} is a message of its own and rank {batched[0]}'s "
                            f"{batched[1]['what']} takes it in a batch: {LAYOUTS['pairs']} and batches on the "
                            f"group's, so the two never meet and both wait forever; send and receive each message "
                            f"the same way on both sides")
            if send:
                return (f"rank {src}'s {send[1]['what']} has no matching receive on rank {dst}: on NCCL it never "
                        f"completes (a large one waits for its receive forever); post a receive for every send, "
                        f"in the same order")
            return (f"rank {dst}'s {recv[1]['what']} has no matching send on rank {src}: it waits forever on NCCL; "
                    f"post a send for every receive, in the same order")
    return None


def first_batch_problem(records: dict[int, dict]) -> str | None:
    """A group whose first operation on some rank is a ``batch_isend_irecv`` while another rank
    of the group begins with something else (a collective) or never uses it, in one line; or
    ``None``. NCCL creates a group's communicator at the group's first operation, inside the batch
    when that is one: torch's ``batch_isend_irecv`` requires every rank of the group to take part
    then ("otherwise, the behavior is undefined"). A group created while a device was bound
    (``device_id`` in ``init_process_group``) has its communicator from the start: not checked."""
    groups = {}
    for rank, rec in records.items():
        for name, first in rec.get("firsts", {}).items():
            groups.setdefault(name, {})[rank] = first
    for name, firsts in sorted(groups.items()):
        batched = [r for r, f in sorted(firsts.items()) if f["kind"] == "batch" and not f["bound"]]
        if not batched:
            continue
        starter = batched[0]
        ranks = firsts[starter]["ranks"]
        for r in ranks:
            if r not in firsts or firsts[r]["kind"] != "batch":
                theirs = f"is {firsts[r]['what']}" if r in firsts else "never comes"
                return (f"on group {name} {ranks}, rank {starter}'s first operation is {firsts[starter]['what']} and "
                        f"rank {r}'s {theirs}: NCCL creates the group's communicator inside a first batch, and torch's "
                        f"batch_isend_irecv needs every rank of the group to take part then; begin with a collective "
                        f"on the group on every rank (dist.barrier(group=...)), or pass device_id to "
                        f"init_process_group so that the communicators exist from the start")
    return None


def _streams(op: dict, layout: str) -> list[str]:
    """The queues ``op`` runs in, one after the other with the others in each: its
    communicator's, and for a collective also the one all collectives share (NCCL's guide asks
    for one order of operations across communicators; taken for collectives only)."""
    if op["kind"] == "lone" and layout == "pairs":
        return [f"pair {op['group']} {op['pair']}"]
    return [f"group {op['group']}"] + (["collectives"] if op["kind"] == "coll" else [])


def _event_keys(op: dict, layout: str) -> list[str]:
    keys = [json.dumps(ev) for ev in op["events"] if ev[0] == "coll"]
    for role, src, dst, k_kind, k_all, _, _ in op.get("msgs", ()):
        key = [op["group"], src, dst, k_all] if layout == "group" else [op["group"], op["kind"], src, dst, k_kind]
        keys.append(json.dumps(["msg", *key]))
    return sorted(set(keys))


def deadlock_problem(records: dict[int, dict]) -> str | None:
    """Whether the ranks' operations can wait on each other forever on NCCL, in one line naming
    them; or ``None``. The model: an operation starts once the one before it in each of its
    queues (:func:`_streams`) has completed, and once every operation its rank waited on before
    issuing it has completed (``wait()`` holds the stream, and everything issued after it); it
    completes once it has started and so have its partners (every member's part of a
    collective; a message's other side: every message is taken to be large, so a send waits for
    its receive). A cycle of such needs is a deadlock. Checked in both places torch puts lone
    messages (:data:`LAYOUTS`)."""
    found = {layout: _cycle(records, layout) for layout in LAYOUTS}
    layout = "group" if found["group"] else "pairs"
    if not found[layout]:
        return None
    cycle, lines = found[layout]
    where = "" if found["group"] and found["pairs"] else f", {LAYOUTS[layout]}"
    ranks = sorted({node[1] if node[0] == "w" else node[0] for node in cycle})
    return (f"ranks {', '.join(map(str, ranks))} issued operations in orders that wait on each other on NCCL (a "
            f"collective completes only once every member has started it, a send only once its receive has "
            f"started, as a large message does{where}): {'; '.join(lines[:3])}; NCCL needs operations issued in "
            f"one order on every rank: post both directions of an exchange in one batch_isend_irecv, as torch's "
            f"schedules do, and issue collectives on different groups in the same order everywhere")


def _cycle(records: dict[int, dict], layout: str):
    """A cycle of the model's needs in ``layout`` and the lines that describe it, or ``None``."""
    holders, keys = {}, {}
    for rank, rec in records.items():
        for i, op in enumerate(rec["ops"]):
            keys[rank, i] = _event_keys(op, layout)
            for k in keys[rank, i]:
                holders.setdefault(k, []).append((rank, i))

    def completed(rank, j):  # what operation j's completion needs: its start and its partners'
        return [(rank, j)] + [h for k in keys[rank, j] for h in holders[k] if h != (rank, j)]

    edges, why = {}, {}
    for rank, rec in records.items():
        ops, waits = rec["ops"], sorted(rec.get("waits", ()), key=lambda w: w[1])
        last, passed = {}, 0
        for i, op in enumerate(ops):
            nxt = edges[rank, i] = []
            for s in _streams(op, layout):
                if s in last:
                    j = last[s]
                    for t in completed(rank, j):
                        nxt.append(t)
                        if t != (rank, j):  # a partner's part: the edges a deadlock is told by
                            why[(rank, i), t] = f"rank {rank} issued {ops[j]['what']} before {op['what']}"
                last[s] = i
            while passed < len(waits) and waits[passed][1] <= i:
                passed += 1
            if passed:
                nxt.append(("w", rank, passed - 1))
        for k, (j, pos) in enumerate(waits):
            nxt = edges["w", rank, k] = [("w", rank, k - 1)] if k else []
            after = f"issuing {ops[pos]['what']}" if pos < len(ops) else "going on"
            for t in completed(rank, j):
                nxt.append(t)
                if t != (rank, j):
                    why[("w", rank, k), t] = f"rank {rank} waited on {ops[j]['what']} before {after}"
    cycle = _find_cycle(edges)
    if cycle is None:
        return None
    lines = []
    for node, nxt in zip(cycle, cycle[1:] + cycle[:1]):
        line = why.get((node, nxt))
        if line and line not in lines:
            lines.append(line)
    return cycle, lines


def order_problem(records: dict[int, list[dict]], p2p: bool = False) -> str | None:
    """Whether the ranks' operations (``records``: per rank, its operations in issue order, each
    ``{"what", "events"}``) can wait on each other on NCCL, with every operation of a rank taken
    to run one after the other: the offline model of a record of batches, simpler than the one
    the mode runs (:func:`deadlock_problem`, which knows communicators and waits). There an
    operation completes only once every peer that shares one of its events (a message, or the
    k-th collective on a group) has started its own part. So operation i of a rank starts after
    operation i - 1 completed, which needs the peers' parts of i - 1 to have started: a cycle of
    such needs is ranks waiting on each other forever (two collectives on two groups issued in
    opposite orders, the simplest). Only collectives are compared, unless ``p2p``: then
    point-to-point operations too, each send taken to end only once its receive runs (a large
    message on NCCL). ``p2p=True`` holds code that posts all its messages in batches on one group
    (chapter 14's ``hand_step``; its test). Returns one line naming the operations and their
    ranks, or ``None``."""
    if not p2p:  # collectives only (see above)
        records = {rank: [op for op in ops if any(ev[0] == "coll" for ev in op["events"])]
                   for rank, ops in records.items()}
    holders = {}  # event -> the operations (rank, i) that take part in it
    for rank, ops in records.items():
        for i, op in enumerate(ops):
            for ev in op["events"]:
                holders.setdefault(json.dumps(ev), []).append((rank, i))
    needs = {}  # (rank, i) -> what must have started before it can start
    for rank, ops in records.items():
        for i in range(1, len(ops)):
            before = (rank, i - 1)
            partners = {h for ev in ops[i - 1]["events"] for h in holders[json.dumps(ev)]} - {before}
            needs[rank, i] = [before, *sorted(partners)]
    cycle = _find_cycle(needs)
    if cycle is None:
        return None
    said = []
    for node, nxt in zip(cycle, cycle[1:] + cycle[:1]):
        rank, i = node
        if nxt != (rank, i - 1):  # it waits on a peer's part of its predecessor
            line = f"rank {rank} issued {records[rank][i - 1]['what']} before {records[rank][i]['what']}"
            if line not in said:
                said.append(line)
    ranks = sorted({r for r, _ in cycle})
    return (f"ranks {', '.join(map(str, ranks))} issued operations in orders that wait on each other on NCCL "
            f"(a collective completes only once every member has started it{', a large send once its receive runs' if p2p else ''}): "
            f"{'; '.join(said[:3])}; NCCL needs operations on different communicators issued in one order on every "
            f"rank{', and each message posted where its receiver does not first wait on the sender' if p2p else ''}")


def _find_cycle(edges: dict) -> list | None:
    """A cycle of the directed graph ``edges`` (node -> list of next nodes), or ``None``."""
    color, on_stack, stack = {}, {}, []
    for start in list(edges):
        if color.get(start):
            continue
        todo = [(start, iter(edges.get(start, ())))]
        color[start] = 1
        on_stack[start] = len(stack)
        stack.append(start)
        while todo:
            node, it = todo[-1]
            nxt = next(it, None)
            if nxt is None:
                todo.pop()
                color[node] = 2
                stack.pop()
                on_stack.pop(node, None)
            elif color.get(nxt) == 1:
                return stack[on_stack[nxt]:]
            elif not color.get(nxt):
                color[nxt] = 1
                on_stack[nxt] = len(stack)
                stack.append(nxt)
                todo.append((nxt, iter(edges.get(nxt, ()))))
    return None


# ----------------------------------------------------------------------------- installing

def install() -> None:
    """Put NCCL's rules in place in this process (idempotent): ``torch.distributed``'s
    operations, DDP's start-up collectives and the functional collectives replaced (also where a
    module already imported them by name), thread start/join, ``Event``, ``Semaphore`` and
    ``Barrier`` tracked, and the records compared at ``destroy_process_group`` or at exit."""
    global _installed
    if _installed:
        return
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    for name in ("isend", "irecv", "send", "recv", "batch_isend_irecv", "destroy_process_group", *COLLECTIVES):
        _orig[name] = getattr(c10d, name)
    for name in ("_broadcast_coalesced", "_verify_params_across_processes"):
        _orig[name] = getattr(dist, name)
    new = {"isend": _isend, "irecv": _irecv, "send": _send, "recv": _recv, "batch_isend_irecv": _batch_isend_irecv,
           "destroy_process_group": _destroy_process_group}
    for name in COLLECTIVES:
        new[name] = _collective(name)
    for name in ("_broadcast_coalesced", "_verify_params_across_processes"):
        new[name] = _ddp_collective(name)
    replaced = {id(_orig[name]): fn for name, fn in new.items()}
    for name, fn in new.items():
        if hasattr(c10d, name):
            setattr(c10d, name, fn)
    for module in list(sys.modules.values()):  # and wherever they were imported by name already
        try:
            if module.__name__.startswith("torch._C") or module.__name__ == __name__:
                continue
            found = [(n, replaced[id(v)]) for n, v in list(vars(module).items()) if id(v) in replaced]
        except Exception:  # not a plain module
            continue
        for n, fn in found:
            setattr(module, n, fn)
    _install_functional()
    _patch_threading()
    previous = sys.excepthook

    def excepthook(*args):
        _state.crashed = True
        previous(*args)

    sys.excepthook = excepthook
    os.register_at_fork(after_in_child=_reset_after_fork)
    atexit.register(check_order)
    _installed = True


def install_if_asked() -> bool:
    """:func:`install` when ``PPBOOK_NCCL_RULES`` asks for it; whether the mode is on."""
    if asked():
        install()
    return _installed


def installed() -> bool:
    return _installed


class suspended:
    """``with nccl_rules.suspended():`` a block whose operations the mode neither records nor checks
    for threads or order (a probe of what gloo itself does, chapter 13); its replacements still
    apply."""

    def __enter__(self):
        with _state.lock:
            _state.suspended += 1

    def __exit__(self, *exc):
        with _state.lock:
            _state.suspended -= 1
