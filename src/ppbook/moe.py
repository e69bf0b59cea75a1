"""A mixture-of-experts variant of the book's Llama, and expert parallelism over a process group.

Introduced in chapter 13 ("Mixture of experts through a pipeline"); the planner chapter sizes
the same layers. The model is :class:`ppbook.models.Llama` with every block's SwiGLU feed-forward
replaced by :class:`MoEFeedForward`: a router picks ``top_k`` of ``n_experts`` small SwiGLU
experts per token (Mixtral's top-k softmax), each expert takes at most ``capacity`` tokens of a
sequence (GShard's capacity; the rest are dropped and pass through the residual only), and a
load-balancing loss (Switch Transformer's, computed per sequence as DeepSeek-V3's sequence-wise
loss) pushes the router towards equal loads.

Capacity and the balancing loss are both computed **per sequence**, so cutting a batch into
microbatches, or sharding it over expert-parallel ranks by sequences, changes neither which
tokens are dropped nor the loss: every layout computes what one process computes.

Expert parallelism (:class:`ExpertParallel`): expert ``j`` of ``E`` lives on rank
``j // (E / e)`` of an ``e``-rank group; every rank routes its own sequences, sends each
expert's tokens to that expert's rank with one ``all_to_all_single`` (the *dispatch*), runs its
own experts on what it received, and sends the results back with a second one (the *combine*).
The buffers have a fixed shape (experts x sequences x capacity x dim, padded with zeros), so
the splits are equal and the shapes static, as a pipeline stage needs.

The balancing loss does not reach a pipeline's ``loss_fn``, which sees only the last stage's
output. :class:`AuxLossToBackward` (Megatron-LM's ``MoEAuxLossAutoScaler``) attaches it to the
layer's output instead: the output passes unchanged, and the backward through the layer adds
the loss's gradient, whichever stage the layer is on.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from ppbook.models import Llama, LlamaBlock, LlamaConfig, SwiGLU, init_weights


@dataclass(frozen=True)
class MoEConfig(LlamaConfig):
    n_experts: int = 4
    top_k: int = 2
    expert_hidden_dim: int = 64  # each expert is a SwiGLU this wide
    capacity_factor: float = 1.25  # <= 0: no capacity limit (no token is dropped)
    aux_loss_coef: float = 0.01  # weight of the load-balancing loss in the training loss

    def __post_init__(self):
        if not 1 <= self.top_k <= self.n_experts:
            raise ValueError(f"top_k={self.top_k} must be between 1 and n_experts={self.n_experts}")


def capacity(seq_len: int, top_k: int, n_experts: int, factor: float) -> int:
    """Most tokens of one sequence an expert takes: ``ceil(factor * T * k / E)``, at most ``T``
    (a token picks an expert once); ``factor <= 0`` means no limit (``T``). At ``factor = 1`` a
    perfectly balanced router fills every expert exactly."""
    if factor <= 0:
        return seq_len
    return max(1, min(seq_len, math.ceil(factor * seq_len * top_k / n_experts)))


@dataclass
class Routing:
    """Where each of a microbatch's ``B * T * k`` token-to-expert assignments goes.

    Assignments are numbered choice-major within a sequence (every token's first choice, then
    every token's second): an expert fills its ``capacity`` slots in that order, so second
    choices are the first dropped (GShard's priority)."""
    expert: torch.Tensor  # (B, kT) the chosen expert
    slot: torch.Tensor  # (B, kT) its place in that expert's queue for this sequence
    gate: torch.Tensor  # (B, kT) its weight in the combined output
    kept: torch.Tensor  # (B, kT) bool: slot < capacity
    probs: torch.Tensor  # (B, T, E) the router's softmax, for the balancing loss


def route(logits: torch.Tensor, top_k: int, cap: int) -> Routing:
    """Top-k routing with a per-sequence capacity, from the router's ``logits`` (B, T, E)."""
    B, T, E = logits.shape
    probs = logits.softmax(-1)  # (B, T, E)
    gate, chosen = probs.topk(top_k, dim=-1)  # (B, T, k) each
    gate = gate / gate.sum(-1, keepdim=True)  # Mixtral: softmax over the chosen k
    expert = chosen.transpose(1, 2).reshape(B, top_k * T)  # (B, kT) choice-major
    onehot = F.one_hot(expert, E)  # (B, kT, E)
    slot = ((onehot.cumsum(1) - 1) * onehot).sum(-1)  # (B, kT) place in its expert's queue
    gate = gate.transpose(1, 2).reshape(B, top_k * T)  # (B, kT)
    return Routing(expert, slot, gate, slot < cap, probs)


def balancing_loss(r: Routing, n_experts: int) -> torch.Tensor:
    """Switch Transformer's load-balancing loss ``E * sum_i f_i P_i`` per sequence (``f_i`` the
    share of the sequence's assignments that chose expert ``i``, ``P_i`` the router's mean
    probability for it), averaged over the sequences; 1 when perfectly balanced."""
    counts = F.one_hot(r.expert, n_experts).sum(1).to(r.probs.dtype)  # (B, E)
    f = counts / r.expert.shape[1]  # (B, E) share of assignments
    P = r.probs.mean(1)  # (B, E)
    return (n_experts * (f * P).sum(-1)).mean()


class AuxLossToBackward(torch.autograd.Function):
    """Return ``output`` unchanged; in the backward, give ``aux`` the gradient
    ``weight``.

    The balancing loss then trains the router through the backward that the stage runs
    for the main loss, on whichever stage the layer sits (Megatron-LM's
    ``MoEAuxLossAutoScaler``). ``weight`` is the loss's coefficient. Megatron multiplies
    it by ``1/m`` because Megatron scales every microbatch's loss by ``1/m``; torch's
    schedules divide the summed gradients by ``m`` at the end (``scale_grads``)."""

    @staticmethod
    def forward(ctx, output: torch.Tensor, aux: torch.Tensor, weight: float):
        ctx.save_for_backward(aux)
        ctx.weight = weight
        return output.view_as(output)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        (aux,) = ctx.saved_tensors
        return grad_output, torch.full_like(aux, ctx.weight), None


# ---------------------------------------------------------------------------------------------
# Expert parallelism
# ---------------------------------------------------------------------------------------------
class Turns:
    """Two threads' all-to-alls (a forward's ``"fwd"``, a backward's
    ``"bwd"``) in one fixed order, the same on every rank: the
    backward's first, then one of each in turn; once a side has issued
    all of its own, the other goes on alone.

    NCCL needs every rank to issue its operations on different
    communicators in one order: two threads left to themselves take one
    order on one rank and the other on its peer, and both wait forever.
    torchtitan's ``HookCoordinator`` makes its two threads meet at a
    barrier around every dispatch and combine for this reason; here each
    all-to-all waits for its turn (a semaphore per side), and hands the
    turn on once issued. ``fwd`` and ``bwd``: how many each side issues.
    :meth:`abort` (a side failed) lets the other go on unordered."""

    def __init__(self, fwd: int, bwd: int):
        self.order = [side for k in range(max(fwd, bwd))
                      for side, n in (("bwd", bwd), ("fwd", fwd)) if k < n]
        self.gates = {"fwd": threading.Semaphore(0), "bwd": threading.Semaphore(0)}
        self.done, self.aborted = 0, False
        if self.order:
            self.gates[self.order[0]].release()

    @contextlib.contextmanager
    def turn(self, side: str):
        ordered = not self.aborted and self.done < len(self.order)
        if ordered:
            self.gates[side].acquire()  # wait for this side's turn
        try:
            yield
        finally:
            if ordered:
                self.done += 1
                if self.done < len(self.order):
                    self.gates[self.order[self.done]].release()  # hand the turn on

    def abort(self) -> None:
        self.aborted = True
        for gate in self.gates.values():
            gate.release(len(self.order) + 1)


@dataclass
class ExpertParallel:
    """This rank's place in an expert-parallel group of ``size`` ranks.

    ``fwd_group`` carries the forward's all-to-alls and ``bwd_group`` the backward's: two
    groups over the same ranks, so that a forward and a backward running at once in two
    threads (the overlap of chapter 13) never interleave their collectives on one group.
    ``trace``, when a list, receives ``(kind, start, end, bytes sent)`` for every all-to-all this
    rank runs (``perf_counter`` seconds; kind ``"dispatch"`` or ``"combine"``, with ``"-grad"``
    in the backward; bytes of the whole buffer, this rank's own chunk included)."""
    rank: int
    size: int
    fwd_group: object = None
    bwd_group: object = None
    trace: list | None = field(default=None)
    turns: Turns | None = None  # while two threads share this rank's all-to-alls (chapter 13's overlap)

    def experts_of(self, n_experts: int) -> range:
        per = n_experts // self.size
        return range(self.rank * per, (self.rank + 1) * per)

    def all_to_all(self, x: torch.Tensor, kind: str, backward: bool = False) -> torch.Tensor:
        """``x`` (size * n, ...) cut into ``size`` equal chunks along dim 0, chunk ``k`` to rank
        ``k``; returns the chunks received, chunk ``k`` from rank ``k``."""
        x = x.contiguous()  # gloo and NCCL refuse non-contiguous tensors
        out = torch.empty_like(x)
        turn = self.turns.turn("bwd" if backward else "fwd") if self.turns else contextlib.nullcontext()
        with turn:  # two threads: one fixed order on every rank (Turns)
            start = time.perf_counter()
            dist.all_to_all_single(out, x, group=self.bwd_group if backward else self.fwd_group)
            if x.is_cuda and self.trace is not None:
                # NCCL's call returns once enqueued: wait for the exchange itself, or the
                # trace would time the enqueueing
                torch.cuda.current_stream(x.device).synchronize()
        if self.trace is not None:
            self.trace.append((kind + ("-grad" if backward else ""), start, time.perf_counter(),
                               x.numel() * x.element_size()))
        return out


class _AllToAll(torch.autograd.Function):
    """An all-to-all with equal splits; its backward is the same exchange, on the
    backward's group."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, ep: ExpertParallel, kind: str) -> torch.Tensor:
        ctx.ep, ctx.kind = ep, kind
        return ep.all_to_all(x, kind)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return ctx.ep.all_to_all(grad, ctx.kind, backward=True), None, None


# ---------------------------------------------------------------------------------------------
# The layer and the model
# ---------------------------------------------------------------------------------------------
class MoEFeedForward(nn.Module):
    """Router plus ``n_experts`` SwiGLU experts (a ``ModuleDict`` keyed "0", "1", ...: an
    expert-parallel rank deletes the others and keeps the names)."""

    def __init__(self, cfg: MoEConfig):
        super().__init__()
        self.cfg = cfg
        self.router = nn.Linear(cfg.dim, cfg.n_experts, bias=False)
        self.experts = nn.ModuleDict({str(j): SwiGLU(cfg.dim, cfg.expert_hidden_dim)
                                      for j in range(cfg.n_experts)})
        self.ep: ExpertParallel | None = None
        self.aux_weight: float | None = None  # None: the balancing loss is only stored (aux_loss)
        self.aux_loss: torch.Tensor | None = None  # the last forward's, with its graph
        self.reset_counts()

    def reset_counts(self) -> None:
        """Zero the tallies of routed and kept assignments per expert (this rank's tokens)."""
        self.routed = torch.zeros(self.cfg.n_experts, dtype=torch.long)
        self.kept = torch.zeros(self.cfg.n_experts, dtype=torch.long)
        self.aux_sum = 0.0  # the balancing losses of the forwards since, summed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, D = x.shape  # (B, T, D): B sequences of T tokens
        E, k = self.cfg.n_experts, self.cfg.top_k
        C = capacity(T, k, E, self.cfg.capacity_factor)  # slots per expert and sequence
        r = route(self.router(x), k, C)
        self.aux_loss = balancing_loss(r, E)
        self.tally(r)
        b, a = r.kept.nonzero(as_tuple=True)  # every kept assignment: sequence, number
        e, s, t = r.expert[b, a], r.slot[b, a], a % T  # its expert, slot and token
        # dispatch: each expert's tokens in its slots, zeros in the slots left empty
        slots = x.new_zeros(E, B, C, D).index_put((e, b, s), x[b, t])  # (E, B, C, D)
        out = self.run_experts(slots)  # (E, B, C, D)
        # combine: each kept assignment's output, times its gate, added to its token
        weighted = out[e, b, s] * r.gate[b, a, None]  # (kept, D)
        y = x.new_zeros(B * T, D).index_add(0, b * T + t, weighted).view(B, T, D)
        # a dropped assignment adds nothing: the block's residual carries the token on
        if self.aux_weight is not None:  # the balancing loss rides the backward
            y = AuxLossToBackward.apply(y, self.aux_loss, self.aux_weight)
        return y

    @torch.no_grad()
    def tally(self, r: Routing) -> None:
        self.aux_sum += self.aux_loss.item()
        self.routed += torch.bincount(r.expert.flatten().cpu(), minlength=self.cfg.n_experts)
        self.kept += torch.bincount(r.expert[r.kept].cpu(), minlength=self.cfg.n_experts)

    def run_experts(self, slots: torch.Tensor) -> torch.Tensor:
        """Every expert on its slots (E, B, C, D). With expert parallelism, ``B`` is
        this rank's sequences, and each expert runs where it lives, on every rank's
        slots."""
        E, B, C, D = slots.shape
        if self.ep is None:  # one process: every expert is here
            return torch.stack([self.experts[str(j)](slots[j].reshape(B * C, D))
                                for j in range(E)]).view_as(slots)
        ep, mine = self.ep, self.ep.experts_of(E)
        n = len(mine)  # experts on this rank
        # comm: chunk k of the experts (those of rank k) to rank k
        got = _AllToAll.apply(slots, ep, "dispatch")  # (e * n, B, C, D), by source
        got = got.view(ep.size, n, B, C, D).transpose(0, 1)  # (n, e, B, C, D)
        # compute: each of this rank's experts on the slots of every rank's sequences
        done = torch.stack([self.experts[str(j)](got[i].reshape(ep.size * B * C, D))
                            for i, j in enumerate(mine)])  # (n, e * B * C, D)
        done = done.view(n, ep.size, B, C, D).transpose(0, 1)  # (e, n, B, C, D)
        # comm: the results back to the ranks whose sequences they belong to
        return _AllToAll.apply(done, ep, "combine").view(E, B, C, D)


class MoEBlock(LlamaBlock):
    """A Llama block whose feed-forward is a mixture of experts (the rest, and
    ``forward``, are :class:`ppbook.models.LlamaBlock`'s)."""

    def __init__(self, cfg: MoEConfig):
        super().__init__(cfg)
        self.feed_forward = MoEFeedForward(cfg)


class MoELlama(Llama):
    """The book's Llama with a mixture of experts in every block."""

    def __init__(self, cfg: MoEConfig):
        super().__init__(cfg)
        self.layers = nn.ModuleDict({str(i): MoEBlock(cfg) for i in range(cfg.n_layers)})


def build_moe_model(cfg: MoEConfig, seed: int = 0, dtype: torch.dtype = torch.float32) -> MoELlama:
    """The full model, deterministic from ``seed`` (weights keyed by parameter name, as every
    model of the book), on the CPU."""
    return init_weights(MoELlama(cfg), seed).to(dtype)


def moe_layers(model: nn.Module) -> dict[str, MoEFeedForward]:
    """Every mixture-of-experts layer of ``model`` (a full model or a stage), by its block's name."""
    return {name: block.feed_forward for name, block in model.layers.items()
            if isinstance(block.feed_forward, MoEFeedForward)}


def keep_experts(model: nn.Module, ep: ExpertParallel) -> nn.Module:
    """Delete, in place, every expert this expert-parallel rank does not own, and set ``ep`` on
    every layer; the experts kept keep their names (``experts.3`` stays ``experts.3``)."""
    for layer in moe_layers(model).values():
        E = layer.cfg.n_experts
        if E % ep.size:
            raise ValueError(f"{E} experts cannot be split evenly over {ep.size} expert-parallel ranks; "
                             f"pick --experts as a multiple of the expert-parallel size")
        for j in set(range(E)) - set(ep.experts_of(E)):
            del layer.experts[str(j)]
        layer.ep = ep if ep.size > 1 else None  # one rank: all experts here, nothing to exchange
    return model


def all_to_all_bytes(tokens: int, dim: int, top_k: int, capacity_factor: float, n_experts: int,
                     seq_len: int, bytes_per_value: int = 4) -> int:
    """Bytes one rank's buffer holds in one all-to-all of one layer, for ``tokens`` of its
    tokens (whole sequences of ``seq_len``): experts x sequences x capacity slots x dim values,
    about ``capacity_factor * top_k * dim`` values per token. A forward runs two such exchanges
    per layer (dispatch, combine) and the backward two more; ``(ep - 1) / ep`` of each buffer
    leaves the rank."""
    per_seq = n_experts * capacity(seq_len, top_k, n_experts, capacity_factor)  # slots of a sequence
    return (tokens // seq_len) * per_seq * dim * bytes_per_value


def set_aux_weight(model: nn.Module, weight: float | None) -> None:
    """Attach every layer's balancing loss to its output with gradient ``weight``
    (:class:`AuxLossToBackward`); ``None``: only store it in ``aux_loss``."""
    for layer in moe_layers(model).values():
        layer.aux_weight = weight


def aux_loss(model: nn.Module) -> torch.Tensor:
    """The sum over ``model``'s layers of the balancing losses of their last forward."""
    return sum(layer.aux_loss for layer in moe_layers(model).values())


def is_expert_param(name: str) -> bool:
    """Whether a parameter name belongs to an expert (sharded by expert parallelism) rather than
    to the rest of the model (replicated over the expert-parallel ranks)."""
    return ".experts." in name


def counts(model: nn.Module) -> dict[str, dict[str, list[int]]]:
    """Per layer, the assignments routed to and kept by each expert since the last reset (this
    rank's tokens); dropped = routed - kept."""
    return {name: {"routed": layer.routed.tolist(), "kept": layer.kept.tolist()}
            for name, layer in moe_layers(model).items()}


def reset_counts(model: nn.Module) -> None:
    for layer in moe_layers(model).values():
        layer.reset_counts()
