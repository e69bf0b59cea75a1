"""Hold gloo to NCCL's rules, on the CPU: the checking mode behind ``PPBOOK_NCCL_RULES=1``.

Introduced in appendix A3 ("Troubleshooting"). gloo forgives what NCCL does not, so a script that
passes every CPU check can still race or hang on GPUs. With ``PPBOOK_NCCL_RULES=1`` in a rank's
environment, :func:`install` (run by the book's launcher, its launch server, and
:func:`ppbook.dist.setup`) replaces ``torch.distributed``'s point-to-point and collective
functions with versions that behave as NCCL does where NCCL is stricter, and check what NCCL
assumes:

- ``batch_isend_irecv`` returns ONE work for the whole batch (NCCL's coalescing path), so code
  that waits on some of the works it got back waits on nothing;
- a received tensor (``irecv``, a batch's receives, an asynchronous ``all_to_all_single``) holds
  poison until its work has been waited on: NaN, or the smallest integer for integer tensors;
  read before ``wait()``, it spoils the result, and ``--check`` sees it on every run;
- a blocking ``send`` returns at once (NCCL's returns once enqueued; gloo's waits for the
  receiver); a receive from any source (``src=None``) is refused, as NCCL has none;
- every rank records the operations it issues; at the end (``destroy_process_group``, or exit)
  the ranks compare their records through the job's store, and collectives that two ranks issued
  in orders that wait on each other (two groups' collectives in opposite orders) fail the run
  with one line naming the operations and the ranks; so does a receive never waited on;
- operations issued from two threads with nothing ordering them (no thread start or join, no
  ``Event``, ``Semaphore`` or ``Barrier`` between them) are refused at once: the order two
  threads take differs between ranks from run to run, and NCCL needs one order on every rank.
  A lock does not count: it keeps two threads apart but lets either go first;
- tensors handed to any of these must be contiguous and on the rank's device.

Every check depends on what the program does, not on how its threads happen to interleave: a
violation fails every run. Set ``PPBOOK_NCCL_RULES=0`` (or leave it unset) for gloo as it is.
Not covered: collectives issued from C++ (DDP's reducer, functional collectives), a semaphore
used as a lock (it orders two threads in whichever order they arrive), and whether point-to-point
batches can wait on each other on NCCL (see :func:`order_problem`'s ``p2p``, which checks a
record of batches offline).
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import sys
import threading
import time
from datetime import timedelta

ENV = "PPBOOK_NCCL_RULES"
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
        self.launches = []  # this rank's operations in issue order: {"what", "events"}
        self.counts = {}  # per description kind: how many so far (for "#n" in messages)
        self.event_counts = {}  # per event key without its index: how many so far
        self.last = None  # (thread token, its clock at the op, description, thread name)
        self.pending_sends = []  # works of blocking sends, made asynchronous
        self.unwaited = {}  # id -> (description) of works that receive, not waited on yet
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


def _expected_device():
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _check_tensor(t, what: str) -> None:
    import torch

    if not isinstance(t, torch.Tensor) or _state.suspended:
        return
    if not t.is_contiguous():
        raise RuleError(f"{what}: a non-contiguous tensor (shape {tuple(t.shape)}, strides {t.stride()}); NCCL "
                        f"takes only contiguous tensors: pass t.contiguous()")
    device = _expected_device()
    if t.device != device:
        raise RuleError(f"{what}: a tensor on {t.device}, but this rank's device is {device}; NCCL takes only "
                        f"tensors on the rank's own device: move it with .to(device)")


def _check_tensors(tensors, what: str) -> None:
    for t in tensors:
        if isinstance(t, (list, tuple)):
            _check_tensors(t, what)
        else:
            _check_tensor(t, what)


def _issue(what: str, events: list[tuple]) -> str:
    """Record one operation of this rank: ``events`` are ("coll", group name) or
    ("p2p", group name, src, dst); each gets its index among those like it. Refuses an operation
    issued from another thread than the last one with nothing ordering the two. Returns the
    operation's description with its number."""
    with _state.lock:
        n = _state.counts[what] = _state.counts.get(what, 0) + 1
        label = f"{what} #{n}"
        if _state.suspended:
            return label
        tok, me = _token(), threading.current_thread().name
        if _state.last is not None:
            last_tok, last_clock, last_label, last_name = _state.last
            if last_tok != tok and last_clock[last_tok] > _clock().get(last_tok, 0):
                line = (f"rank {_rank()}: {last_label} (thread {last_name}) and {label} (thread {me}) were issued "
                        f"from two threads with nothing ordering them: their order differs from run to run and "
                        f"between ranks, and NCCL needs every rank to issue its operations in one order; make the "
                        f"threads take turns in a fixed order (an Event, a Semaphore or a Barrier between them), "
                        f"as torchtitan's HookCoordinator does")
                _fail(line, speaker=_rank() == 0)
        keyed = []
        for ev in events:
            n_ev = _state.event_counts[ev] = _state.event_counts.get(ev, 0) + 1
            keyed.append([*ev, n_ev])
        _tick()
        _state.last = (tok, dict(_clock()), label, me)
        _state.launches.append({"what": label, "events": keyed})
        return label


# ----------------------------------------------------------------------------- works

def _poison(t) -> None:
    import torch

    with torch.no_grad():
        _fill_poison(t)


def _fill_poison(t) -> None:
    import torch

    if t.is_floating_point() or t.is_complex():
        t.fill_(float("nan"))
    elif t.dtype == torch.bool:
        t.fill_(True)
    else:
        t.fill_(torch.iinfo(t.dtype).min)


def _work_class():
    import torch.distributed as dist

    class Batch(dist.Work):
        """One work for several operations (NCCL's coalesced batch): waiting on it waits on all
        of them, then fills the receivers' tensors, which hold poison until then."""

        def __init__(self, works, copies, label, sends=()):
            super().__init__()
            self._works, self._copies, self._label, self._done = works, copies, label, False
            # the batch's sends: NCCL's wait() does not hold the CPU until a send's peer has
            # received (the GPU's stream waits instead), so neither does this one; they are
            # waited on at the end (check_order)
            with _state.lock:
                _state.pending_sends.extend(sends)
            if copies:
                with _state.lock:
                    _state.unwaited[id(self)] = label

        def _finish(self):
            if not self._done:
                import torch

                with torch.no_grad():  # the receiver may have made it a leaf that requires grad since
                    for tmp, dst in self._copies:
                        dst.copy_(tmp)
                self._done = True
                with _state.lock:
                    _state.unwaited.pop(id(self), None)

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

    return Batch


_Batch = None


def _batch(works, copies, label, sends=()):
    global _Batch
    if _Batch is None:
        _Batch = _work_class()
    return _Batch(works, copies, label, sends)


# ----------------------------------------------------------------------------- the replacements

def _isend(tensor, dst=None, group=None, tag=0, group_dst=None):
    _check_tensor(tensor, "isend")
    peer = _global_peer(group, dst, group_dst)
    name, _ = _group_label(group)
    _issue(f"isend to rank {peer}", [("p2p", name, _rank(), peer)])
    return _orig["isend"](tensor, dst, group, tag, group_dst)


def _irecv(tensor, src=None, group=None, tag=0, group_src=None):
    import torch

    _refuse_any_source(src, group_src, "irecv")
    _check_tensor(tensor, "irecv")
    peer = _global_peer(group, src, group_src)
    name, _ = _group_label(group)
    label = _issue(f"irecv from rank {peer}", [("p2p", name, peer, _rank())])
    tmp = torch.empty_like(tensor)
    work = _orig["irecv"](tmp, src, group, tag, group_src)
    _poison(tensor)
    return _batch([work], [(tmp, tensor)], label)


def _send(tensor, dst=None, group=None, tag=0, group_dst=None):
    _check_tensor(tensor, "send")
    peer = _global_peer(group, dst, group_dst)
    name, _ = _group_label(group)
    _issue(f"send to rank {peer}", [("p2p", name, _rank(), peer)])
    # NCCL's send returns once enqueued: the data as it is now travels, the caller goes on
    work = _orig["isend"](tensor.clone(), dst, group, tag, group_dst)
    with _state.lock:
        _state.pending_sends.append(work)


def _recv(tensor, src=None, group=None, tag=0, group_src=None):
    _refuse_any_source(src, group_src, "recv")
    _check_tensor(tensor, "recv")
    peer = _global_peer(group, src, group_src)
    name, _ = _group_label(group)
    _issue(f"recv from rank {peer}", [("p2p", name, peer, _rank())])
    return _orig["recv"](tensor, src, group, tag, group_src)


def _refuse_any_source(src, group_src, what):
    if src is None and group_src is None:
        raise RuleError(f"{what} from any source (src=None): NCCL has no such receive; name the sender")


def _batch_isend_irecv(p2p_op_list):
    import torch

    from torch.distributed import distributed_c10d as c10d

    c10d._check_p2p_op_list(p2p_op_list)
    events, peers = [], []
    for op in p2p_op_list:
        _check_tensor(op.tensor, "batch_isend_irecv")
        name, _ = _group_label(op.group)
        sending = op.op in (c10d.isend, _orig["isend"])
        events.append(("p2p", name, _rank(), op.peer) if sending else ("p2p", name, op.peer, _rank()))
        peers.append(op.peer)
    label = _issue(f"batch_isend_irecv with rank{'s' if len(set(peers)) > 1 else ''} "
                   f"{', '.join(map(str, sorted(set(peers))))}", events)
    works, copies, sends = [], [], []
    for op in p2p_op_list:
        if op.op in (c10d.isend, _orig["isend"]):
            sends.append(_orig["isend"](op.tensor, group=op.group, tag=op.tag, group_dst=op.group_peer))
        else:
            tmp = torch.empty_like(op.tensor)
            works.append(_orig["irecv"](tmp, group=op.group, tag=op.tag, group_src=op.group_peer))
            copies.append((tmp, op.tensor))
    for _, dst in copies:
        _poison(dst)
    return [_batch(works, copies, label, sends)]  # one work for the batch, as NCCL's coalescing path returns


def _all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, group=None,
                       async_op=False):
    import torch

    _check_tensors((output, input), "all_to_all_single")
    name, ranks = _group_label(group)
    label = _issue(f"all_to_all_single on group {name} {ranks}", [("coll", name)])
    if not async_op:
        return _orig["all_to_all_single"](output, input, output_split_sizes, input_split_sizes, group, False)
    tmp = torch.empty_like(output)
    work = _orig["all_to_all_single"](tmp, input, output_split_sizes, input_split_sizes, group, True)
    _poison(output)
    return _batch([work], [(tmp, output)], label)


def _collective(fname: str, tensor_args: tuple[int, ...], group_arg: int):
    """A collective ``fname`` whose positional arguments ``tensor_args`` hold tensors (or lists of
    them) and argument ``group_arg`` the group (also taken by keyword ``group``)."""
    import inspect

    orig = _orig[fname]
    params = list(inspect.signature(orig).parameters)

    def wrapper(*args, **kwargs):
        bound = dict(zip(params, args))
        bound.update(kwargs)
        _check_tensors([bound.get(params[i]) for i in tensor_args if params[i] in bound], fname)
        name, ranks = _group_label(bound.get("group"))
        _issue(f"{fname} on group {name} {ranks}", [("coll", name)])
        return orig(*args, **kwargs)

    wrapper.__name__ = wrapper.__qualname__ = fname
    wrapper.__doc__ = orig.__doc__
    return wrapper


COLLECTIVES = {  # name: (positions of tensor arguments, position of the group)
    "all_reduce": ((0,), 2), "broadcast": ((0,), 2), "reduce": ((0,), 3), "all_gather": ((0, 1), 2),
    "all_gather_into_tensor": ((0, 1), 2), "reduce_scatter_tensor": ((0, 1), 3), "reduce_scatter": ((0, 1), 3),
    "gather": ((0, 1), 3), "scatter": ((0, 1), 3), "all_to_all": ((0, 1), 2), "barrier": ((), 0),
}


def _destroy_process_group(group=None):
    import torch.distributed as dist

    if group is None and dist.is_initialized():
        check_order()
    return _orig["destroy_process_group"](group)


# ----------------------------------------------------------------------------- the order across ranks

def check_order() -> None:
    """Compare this rank's record with every other rank's (through the job's store) and fail the
    run if two ranks issued operations in orders that can wait on each other on NCCL, or if a
    receive was never waited on. Run at ``destroy_process_group`` and at exit; once."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    with _state.lock:
        if _state.checked or _state.crashed or not dist.is_initialized():
            return
        _state.checked = True
        sends, unwaited = list(_state.pending_sends), dict(_state.unwaited)
    for work in sends:  # what a blocking send owes: delivered before the group goes
        work.wait()
    rank, world = dist.get_rank(), dist.get_world_size()
    if unwaited:
        first = next(iter(unwaited.values()))
        _fail(f"rank {rank}: {len(unwaited)} operation(s) that receive were never waited on (the first: "
              f"{first}): on NCCL their tensors may not have arrived when read; wait on every work that "
              f"batch_isend_irecv returns for a batch that receives (NCCL returns one work for the batch)")
    if world == 1:
        return
    store = c10d._get_default_store()
    prefix = f"{PREFIX}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"  # torchrun keeps its store
    store.set(f"{prefix}/{rank}", json.dumps(_state.launches))
    keys = [f"{prefix}/{r}" for r in range(world)]
    try:
        store.wait(keys, timedelta(seconds=STORE_WAIT_S))
    except Exception:  # a rank that never got here has failed already: its own error says why
        sys.stderr.write(f"{PREFIX}: rank {rank}: the other ranks' records did not come within {STORE_WAIT_S:.0f} s; "
                         f"the order across ranks was not checked\n")
        return
    records = {r: json.loads(store.get(k)) for r, k in enumerate(keys)}
    problem = order_problem(records)
    if problem:
        _fail(problem, speaker=rank == 0)


def order_problem(records: dict[int, list[dict]], p2p: bool = False) -> str | None:
    """Whether the ranks' operations (``records``: per rank, its operations in issue order, each
    ``{"what", "events"}``) can wait on each other on NCCL. There a rank runs its operations one
    after the other, and an operation completes only once every peer that shares one of its
    events (a message, or the k-th collective on a group) has started its own part. So operation
    i of a rank starts after operation i - 1 completed, which needs the peers' parts of i - 1 to
    have started: a cycle of such needs is ranks waiting on each other forever (two collectives
    on two groups issued in opposite orders, the simplest). Only collectives are compared, unless
    ``p2p``: then point-to-point operations too, each send taken to end only once its receive
    runs (a large message on NCCL) and all of a rank's operations to run one after the other (a
    rank's ``batch_isend_irecv`` batches do, on its group's communicator). The mode at run time
    compares collectives only: torch's own schedules mix batches with lone ``isend``/``irecv``
    and object sends, which NCCL puts on other communicators, and this model, which cannot tell
    them apart from a gloo run, would flag them. ``p2p=True`` holds code that posts all its
    messages in batches (chapter 14's ``hand_step``; its test). Returns one line naming the
    operations and their ranks, or ``None``."""
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
    operations replaced, thread start/join, ``Event``, ``Semaphore`` and ``Barrier`` tracked, and
    the order across ranks compared at ``destroy_process_group`` or at exit."""
    global _installed
    if _installed:
        return
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    for name in ("isend", "irecv", "send", "recv", "batch_isend_irecv", "all_to_all_single",
                 "destroy_process_group", *COLLECTIVES):
        _orig[name] = getattr(c10d, name)
    new = {"isend": _isend, "irecv": _irecv, "send": _send, "recv": _recv, "batch_isend_irecv": _batch_isend_irecv,
           "all_to_all_single": _all_to_all_single, "destroy_process_group": _destroy_process_group}
    for name, (tensors, group) in COLLECTIVES.items():
        new[name] = _collective(name, tensors, group)
    for name, fn in new.items():
        setattr(c10d, name, fn)
        if getattr(dist, name, None) is _orig[name]:
            setattr(dist, name, fn)
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
    for threads (a probe of what gloo itself does, chapter 13); its replacements still apply."""

    def __enter__(self):
        with _state.lock:
            _state.suspended += 1

    def __exit__(self, *exc):
        with _state.lock:
            _state.suspended -= 1
