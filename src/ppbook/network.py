"""Links between GPUs as latency + bytes / bandwidth, and the time a layout spends communicating.

Introduced in "Choosing a pipeline". A hand-off of ``n`` bytes over a link costs
``latency + n / bandwidth`` (the alpha-beta model of Hockney, 1994); a ring all-reduce among
``k`` ranks costs ``2 (k - 1)`` latencies plus the bytes of :func:`ppbook.traffic.allreduce_bytes_per_rank`
over the bandwidth. The presets are vendors' per-direction link rates; their latencies are
assumptions of the right order, not measurements: measure yours (``nccl-tests``'
``sendrecv_perf``) and pass a :class:`Link` of your own. :func:`fit_link` turns timed ping-pongs
into a link, which is how the book checks the model on CPU with gloo.
"""

from __future__ import annotations

from dataclasses import dataclass

from ppbook import traffic


@dataclass(frozen=True)
class Link:
    name: str
    latency: float    # seconds per message
    bandwidth: float  # bytes per second, one direction
    source: str = ""

    def time(self, nbytes: float) -> float:
        """Seconds to send ``nbytes`` in one message."""
        return self.latency + nbytes / self.bandwidth

    def allreduce(self, nbytes: float, n: int) -> float:
        """Seconds for a ring all-reduce of ``nbytes`` among ``n`` ranks over this link (0 if n = 1)."""
        if n <= 1:
            return 0.0
        return 2 * (n - 1) * self.latency + traffic.allreduce_bytes_per_rank(nbytes, n) / self.bandwidth


LINKS: dict[str, Link] = {
    # NVIDIA H100 SXM datasheet: fourth-generation NVLink, 900 GB/s per GPU in total, 450 each way.
    "nvlink-h100": Link("nvlink-h100", 3e-6, 450e9,
                        "NVIDIA H100 Tensor Core GPU datasheet (NVLink 900 GB/s bidirectional); latency assumed"),
    # One 400 Gb/s NDR InfiniBand adapter per GPU (ConnectX-7, as in a DGX H100): 50 GB/s each way.
    "ib-ndr400": Link("ib-ndr400", 8e-6, 50e9,
                      "NVIDIA ConnectX-7 / Quantum-2 NDR 400 Gb/s, one adapter per GPU (DGX H100); latency assumed"),
    # The same rate over Ethernet (RoCE v2, 400 GbE); a little more latency than InfiniBand.
    "roce-400g": Link("roce-400g", 1e-5, 50e9, "400 GbE RoCE v2, one adapter per GPU; latency assumed"),
}


def fit_link(sizes: list[float], seconds: list[float], name: str = "measured") -> Link:
    """Least-squares fit of ``seconds = latency + size / bandwidth`` to one-way message times."""
    n = len(sizes)
    if n < 2 or len(seconds) != n or len(set(sizes)) < 2:
        raise ValueError("fit_link needs one-way times at two or more different message sizes")
    mx, my = sum(sizes) / n, sum(seconds) / n
    slope = sum((x - mx) * (y - my) for x, y in zip(sizes, seconds)) / sum((x - mx) ** 2 for x in sizes)
    if slope <= 0:
        raise ValueError("message times do not grow with size: cannot fit a bandwidth")
    return Link(name, max(0.0, my - slope * mx), 1.0 / slope, "fitted to timed ping-pongs")


def node_of(pp_rank: int, dp: int, tp: int, gpus_per_node: int) -> int:
    """The node that holds pipeline rank ``pp_rank``'s first GPU when ranks are laid out as
    Megatron-LM and torchtitan do: tensor parallel innermost, then data parallel, pipeline
    outermost (global rank = pp_rank * dp * tp + dp_rank * tp + tp_rank)."""
    return pp_rank * dp * tp // gpus_per_node


def handoff_latency(boundary_bytes: int, rank_of_stage: dict[int, int], dp: int, tp: int, gpus_per_node: int,
                    intra: Link, inter: Link):
    """A ``latency`` callable for :func:`ppbook.simulate.simulate`: each hand-off between stages
    on different pipeline ranks costs ``link.time(boundary_bytes)`` over NVLink when both ranks'
    GPUs share a node, over the network otherwise."""
    def latency(dep, action) -> float:
        a, b = rank_of_stage[dep.stage], rank_of_stage[action.stage]
        same = node_of(a, dp, tp, gpus_per_node) == node_of(b, dp, tp, gpus_per_node)
        return (intra if same else inter).time(boundary_bytes)
    return latency


def group_link(group_span: int, gpus_per_node: int, intra: Link, inter: Link) -> Link:
    """The link a collective runs over when its ranks lie within ``group_span`` consecutive GPUs
    (a data-parallel group spans dp x tp): NVLink if they fit in one node, else the network."""
    return intra if group_span <= gpus_per_node else inter
