"""GPUs and the links between them: presets from vendors' datasheets, or a reader's own numbers.

Introduced in "Choosing a pipeline". A :class:`GPU` is its memory (the bytes the device reports to
the allocator, with where each figure comes from in :data:`MEMORY`), its dense bf16 peak (without
structured sparsity) and its memory bandwidth; a :class:`Link` moves ``n`` bytes in
``latency + n / bandwidth`` seconds (the alpha-beta model of Hockney, 1994), with the bandwidth
per GPU and per direction. The latencies are assumptions of the right order, not measurements:
measure yours (``nccl-tests``' ``sendrecv_perf``) and pass them with ``--intra-latency`` and
``--inter-latency``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ppbook.planner import traffic

INTER_DEFAULT = "ib-ndr400"  # the network of a GPU given without one


@dataclass(frozen=True)
class GPU:
    name: str
    memory_gb: float       # the bytes the device reports to the allocator, in decimal GB (1e9 bytes): see MEMORY
    bf16_tflops: float     # dense peak, without sparsity
    hbm_tb_s: float        # memory bandwidth
    nvlink: str            # the intra-node link preset of its usual server
    source: str = ""
    network: str = INTER_DEFAULT  # the inter-node link preset of its usual server (one adapter per GPU)


@dataclass(frozen=True)
class Link:
    name: str
    latency: float    # seconds per message
    bandwidth: float  # bytes per second, per GPU, one direction
    source: str = ""

    def time(self, nbytes: float) -> float:
        """Seconds to send ``nbytes`` in one message."""
        return self.latency + nbytes / self.bandwidth

    def allreduce(self, nbytes: float, n: int) -> float:
        """Seconds for a ring all-reduce of ``nbytes`` among ``n`` ranks over this link (0 if n = 1)."""
        if n <= 1:
            return 0.0
        return 2 * (n - 1) * self.latency + traffic.allreduce_bytes_per_rank(nbytes, n) / self.bandwidth

    def alltoall(self, nbytes: float, n: int) -> float:
        """Seconds for an all-to-all among ``n`` ranks, each sending its ``nbytes`` spread evenly
        (``(n - 1) / n`` of them leave the rank; 0 if n = 1)."""
        if n <= 1:
            return 0.0
        return (n - 1) * self.latency + traffic.alltoall_bytes_per_rank(nbytes, n) / self.bandwidth

    def gather(self, nbytes: float, n: int) -> float:
        """Seconds for a ring all-gather (or reduce-scatter) of a tensor of ``nbytes`` in all
        among ``n`` ranks: each sends ``(n - 1) / n`` of it (0 if n = 1)."""
        if n <= 1:
            return 0.0
        return (n - 1) * self.latency + traffic.gather_bytes_per_rank(nbytes, n) / self.bandwidth


_DS = "NVIDIA {} datasheet"
GiB = 2 ** 30
# Each preset's memory is the bytes the device reports to the allocator (torch.cuda.get_device_properties(0)
# .total_memory, the "total capacity" of torch's out-of-memory message), not the "80 GB" it is sold as: an
# H100 80GB reports 79.11 GiB = 84.9e9 bytes, not 80e9 (nvidia-smi shows 81559 MiB, part of it the driver's).
# Where no reported figure was found, the datasheet's gigabytes are taken as GiB of HBM (as HBM is built), and
# the source says so. The planner keeps Request.headroom (10% unless given) of these bytes free for the CUDA
# context, NCCL's buffers and fragmentation: usable = memory_gb * 1e9 * (1 - headroom).
MEMORY: dict[str, tuple[float, str]] = {  # preset: (bytes, where the figure comes from)
    "a100-40gb": (42298834944, "reported: cudaGetDeviceProperties on an A100-SXM4-40GB, 42298834944 bytes "
                               "(deviceQuery in bottlerocket-os/bottlerocket#3873)"),
    "a100-80gb": (80 * GiB, "no reported figure: the datasheet's 80 GB taken as 80 GiB of HBM2e"),
    "h100-sxm": (79.11 * GiB, "reported: torch's total capacity on an H100 80GB, 79.11 GiB "
                              "(vllm-project/vllm#27508); this project's lent H100 is described as about 78 GiB"),
    "h100-pcie": (80 * GiB, "no reported figure: the datasheet's 80 GB taken as 80 GiB of HBM2e"),
    "h800": (80 * GiB, "no reported figure: the 80 GB as sold taken as 80 GiB of HBM3"),
    "h200": (150109880320, "reported: torch's total_memory on the NVIDIA H200 of the book's GPU record, 150109880320 "
                           "bytes = 139.8 GiB (gpu_memory_bytes of data/gpu/h200-2026-11-28/bench.json; the datasheet sells 141 GB)"),
    "b200": (180 * GiB, "no reported figure: the datasheet's 180 GB taken as 180 GiB of HBM3e"),
    "mi300x": (192 * GiB, "no reported figure: the data sheet's 192 GB taken as 192 GiB of HBM3"),
}


def _gb(name: str) -> float:
    """A preset's reported memory in decimal GB, to 10 MB (what a reader reads and types: 84.94, not
    84.9437156966)."""
    return round(MEMORY[name][0] / 1e9, 2)


# The network of each GPU's usual server: DGX A100's HDR InfiniBand (200 Gb/s per GPU), DGX H100's,
# H200's and B200's ConnectX-7 (NDR, 400 Gb/s per GPU; DeepSeek's H800 cluster likewise), and the
# 400 GbE RoCE adapters of MI300X platforms.
GPUS: dict[str, GPU] = {g.name: g for g in [
    GPU("a100-40gb", _gb("a100-40gb"), 312, 1.555, "nvlink-a100", _DS.format("A100 Tensor Core GPU (SXM4 40GB)"), "ib-hdr200"),
    GPU("a100-80gb", _gb("a100-80gb"), 312, 2.039, "nvlink-a100", _DS.format("A100 Tensor Core GPU (SXM4 80GB)"), "ib-hdr200"),
    GPU("h100-sxm", _gb("h100-sxm"), 989.4, 3.35, "nvlink-h100", _DS.format("H100 Tensor Core GPU (SXM5)") + "; 989.4 "
        "TFLOP/s dense bf16 (the H100 architecture whitepaper's; 1,979 with sparsity)", "ib-ndr400"),
    GPU("h100-pcie", _gb("h100-pcie"), 756, 2.0, "pcie-gen5", _DS.format("H100 Tensor Core GPU (PCIe)"), "ib-ndr400"),
    GPU("h800", _gb("h800"), 989.4, 3.35, "nvlink-h800", "NVIDIA H800 (SXM5): H100 compute, NVLink at 400 GB/s", "ib-ndr400"),
    GPU("h200", _gb("h200"), 989.4, 4.8, "nvlink-h100", _DS.format("H200 Tensor Core GPU (SXM)") + ": 141 GB of HBM3e at "
        "4.8 TB/s; bf16 1,979 TFLOP/s with sparsity, 989.4 dense, the H100 SXM's (the same GH100 tensor cores)",
        "ib-ndr400"),
    GPU("b200", _gb("b200"), 2250, 8.0, "nvlink-b200", _DS.format("HGX B200 / DGX B200"), "ib-ndr400"),
    GPU("mi300x", _gb("mi300x"), 1307, 5.3, "xgmi-mi300x", "AMD Instinct MI300X data sheet", "roce-400g"),
]}

LINKS: dict[str, Link] = {k.name: k for k in [
    # intra-node: the per-GPU NVLink (or fabric) rate, each way
    Link("nvlink-a100", 3e-6, 300e9, "NVLink 3: 600 GB/s per GPU in total, 300 each way (A100 SXM4); latency assumed"),
    Link("nvlink-h100", 3e-6, 450e9, "NVLink 4: 900 GB/s per GPU in total, 450 each way (H100/H200 SXM); latency assumed"),
    Link("nvlink-h800", 3e-6, 200e9, "H800 NVLink: 400 GB/s per GPU in total, 200 each way; latency assumed"),
    Link("nvlink-b200", 3e-6, 900e9, "NVLink 5: 1.8 TB/s per GPU in total, 900 GB/s each way (B200); latency assumed"),
    Link("xgmi-mi300x", 4e-6, 448e9, "AMD Infinity Fabric: 7 links, 896 GB/s per GPU in total, 448 each way; "
                                     "latency assumed"),
    Link("pcie-gen5", 5e-6, 64e9, "PCIe 5.0 x16: 64 GB/s each way; latency assumed"),
    # inter-node: one adapter per GPU
    Link("ib-hdr200", 8e-6, 25e9, "InfiniBand HDR 200 Gb/s, one adapter per GPU (DGX A100); latency assumed"),
    Link("ib-ndr400", 8e-6, 50e9, "InfiniBand NDR 400 Gb/s, one adapter per GPU (ConnectX-7, DGX H100); "
                                  "latency assumed"),
    Link("roce-400g", 1e-5, 50e9, "400 GbE RoCE v2, one adapter per GPU; latency assumed"),
    Link("ib-xdr800", 8e-6, 100e9, "InfiniBand XDR 800 Gb/s, one adapter per GPU (ConnectX-8); latency assumed"),
]}


def fit_link(sizes: list[float], seconds: list[float], name: str = "measured") -> Link:
    """Least-squares fit of ``seconds = latency + size / bandwidth`` to one-way message times
    (how the book checks the link model on CPU with gloo: ``make bench-plan``)."""
    n = len(sizes)
    if n < 2 or len(seconds) != n or len(set(sizes)) < 2:
        raise ValueError("fit_link needs one-way times at two or more different message sizes")
    mx, my = sum(sizes) / n, sum(seconds) / n
    slope = sum((x - mx) * (y - my) for x, y in zip(sizes, seconds)) / sum((x - mx) ** 2 for x in sizes)
    if slope <= 0:
        raise ValueError("message times do not grow with size: cannot fit a bandwidth")
    return Link(name, max(0.0, my - slope * mx), 1.0 / slope, "fitted to timed ping-pongs")


def gpu(name: str) -> GPU:
    if name not in GPUS:
        raise ValueError(f"--gpu {name!r} is not a preset; use one of {', '.join(GPUS)}, or give --gpu-memory, "
                         "--gpu-tflops and --gpu-bandwidth for your own")
    return GPUS[name]


def link(name: str) -> Link:
    if name not in LINKS:
        raise ValueError(f"unknown link {name!r}; use one of {', '.join(LINKS)}, or give its bandwidth and latency")
    return LINKS[name]


def custom_gpu(memory_gb: float, bf16_tflops: float, hbm_tb_s: float, nvlink: str = "nvlink-h100",
               network: str = INTER_DEFAULT) -> GPU:
    return GPU("custom", memory_gb, bf16_tflops, hbm_tb_s, nvlink, "given on the command line", network)


def custom_link(name: str, bandwidth_gb_s: float, latency_us: float) -> Link:
    return Link(name, latency_us * 1e-6, bandwidth_gb_s * 1e9, "given on the command line")
