"""Collectives: allreduce, allgather, reducescatter, alltoall, sendrecv.

`msg_bytes` is nccl-tests' "size": the per-rank buffer for allreduce and
alltoall, the full (gathered) buffer for allgather and reducescatter, the
message for sendrecv. nccl-tests' conventions:
  algbw = msg_bytes / time,  busbw = algbw * factor,
  factor = 2(n-1)/n (allreduce), (n-1)/n (allgather, reducescatter, alltoall), 1 (sendrecv).
`bytes` of the cost model is the bus traffic per rank, msg_bytes * factor.

The bound (roofline) is latency-bandwidth (alpha-beta) per link PATH, the path coming from the catalog:
  nvswitch   link 'nvlink' on a GPU with NVLink (nvlink_gbs_per_dir > 0): every GPU at its NVLink rate;
  pcie_p2p   link 'pcie' (or 'nvlink' on a GPU without it) and pcie_p2p true: P2P DMA hops, each GPU at
             its x16 rate (pcie_gbs_per_dir = the pcie_gen lane rate x 16);
  pcie_host  the same without P2P (pcie_p2p false or not known): every hop staged through host memory
             across the host bridge. Rule: a ring of 2 GPUs under one PCIe switch runs at the x16 rate; each
             doubling of the ring crosses one more shared host level (switch -> root complex -> the
             inter-socket link of a 2-socket 8-GPU server) that halves the aggregate while the flows
             double, so the per-GPU bus bandwidth is  pcie_gbs_per_dir * (2 / n)^2;
  net        link 'net': the deployment's scale-out bandwidth per GPU (Hardware.net_gbs_per_gpu).
  t = alpha_launch(path) + hops * alpha_hop(path) + bus bytes / bandwidth(path, n),
with the algorithm NCCL would pick for the size: a ring (hops 2(n-1) for allreduce, n-1 for the
others, 1 for sendrecv; bus bytes as above) or, for allreduce, a tree (hops 2 ceil(log2 n), 2 x
msg_bytes per rank), whichever is faster. alpha (ALPHA_LAUNCH_S, ALPHA_HOP_S) is a floor fitted once
under the public rows' smallest messages (<= 4 KiB, 10 % quantile per GPU, op and world size, the
least-squares line in hops scaled down until it passes under all of them): NVLink rows of aiconfigurator
(A100, H100, H200, B200, GB200) and Vidur (A100, H100 DGX) for nvswitch and both PCIe paths (the only
PCIe-only rows are L40S's, which the leave-one-GPU-out figure holds out), Vidur's A100 network rows for
net. The η models learn the rest.
"""
from dataclasses import dataclass

import numpy as np

from .base import Cost, Family, Field, Shape, elem_bytes

LINKS = ("nvlink", "pcie", "net")
PATHS = ("nvswitch", "pcie_p2p", "pcie_host", "net")
ALPHA_LAUNCH_S = {"nvswitch": 3.8e-6, "pcie_p2p": 3.8e-6, "pcie_host": 3.8e-6, "net": 16e-6}
ALPHA_HOP_S = {"nvswitch": 0.48e-6, "pcie_p2p": 0.48e-6, "pcie_host": 0.48e-6, "net": 0.9e-6}
RING_HOPS = {"allreduce": lambda n: 2 * (n - 1), "allgather": lambda n: n - 1, "reducescatter": lambda n: n - 1,
             "alltoall": lambda n: n - 1, "sendrecv": lambda n: np.ones_like(n)}
# Links that belong to the cluster, not the GPU: the hardware catalog cannot describe them, so another GPU's
# rows over them say nothing about this one (cross tier: predictor/transfer.py prices them at the roofline).
CLUSTER_LINKS = ("net",)


def cluster_link_rows(cols, n: int) -> np.ndarray:
    """Mask of the n rows of shape columns `cols` that cross a CLUSTER_LINKS link (none without a link column)."""
    if "link" not in cols:
        return np.zeros(n, dtype=bool)
    return np.isin(np.asarray(cols["link"]).reshape(-1), CLUSTER_LINKS)


def busbw_factor(op: str, world_size):
    n = np.asarray(world_size, dtype=np.float64)
    if op == "allreduce":
        return 2.0 * (n - 1) / n
    if op in ("allgather", "reducescatter", "alltoall"):
        return (n - 1) / n
    if op == "sendrecv":
        return np.ones_like(n)
    raise ValueError(f"not a collective: {op!r}")


def algbw(msg_bytes, seconds):
    """nccl-tests algorithm bandwidth, bytes/s."""
    return np.asarray(msg_bytes, dtype=np.float64) / np.asarray(seconds, dtype=np.float64)


def busbw(op: str, msg_bytes, seconds, world_size):
    """nccl-tests bus bandwidth, bytes/s: comparable to the link's peak."""
    return algbw(msg_bytes, seconds) * busbw_factor(op, world_size)


@dataclass(frozen=True)
class CollectiveShape(Shape):
    msg_bytes: int
    world_size: int
    link: str = "nvlink"
    dtype: str = "bf16"


def _make(op: str) -> Family:
    reduces = op in ("allreduce", "reducescatter")

    def cost(c):
        n = c["world_size"]
        factor = busbw_factor(op, n)
        elems = c["msg_bytes"] / elem_bytes(c["dtype"])
        return Cost(flops=elems * (n - 1) / n if reduces else np.zeros_like(n),
                    bytes=c["msg_bytes"] * factor, blocks=np.zeros_like(n))

    shape = dataclass(frozen=True)(type(f"{op.capitalize()}Shape", (CollectiveShape,), {}))
    return Family(
        name=op,
        fields=(Field("msg_bytes", "pos", doc="nccl-tests size in bytes"),
                Field("world_size", "pos"), Field("link", "choice", choices=LINKS), Field("dtype", "dtype")),
        unit="link", dominant="msg_bytes", tile="n/a (bandwidth over the link)", cost_fn=cost, shape=shape,
        checks=((lambda c: np.asarray(c["world_size"]) < 2, "world_size must be >= 2"),))


def link_path(link: str, hw) -> str:
    """The PATHS entry a collective over `link` takes on GPU `hw` (the module doc states the rule)."""
    if link == "net":
        return "net"
    if link == "nvlink" and hw.nvlink_gbs_per_dir:
        return "nvswitch"
    hw.link_bw("pcie")  # a GPU without a PCIe host link (Grace-attached) is refused in one line
    return "pcie_p2p" if hw.pcie_p2p else "pcie_host"


def path_bandwidth(path: str, hw, world_size) -> np.ndarray:
    """Bus bandwidth bound per GPU and direction in bytes/s of `path` at `world_size` GPUs."""
    n = np.asarray(world_size, dtype=np.float64)
    if path == "nvswitch":
        return np.full_like(n, hw.link_bw("nvlink"))
    if path == "net":
        return np.full_like(n, hw.link_bw("net"))
    share = (2.0 / np.maximum(n, 2.0)) ** 2 if path == "pcie_host" else 1.0
    return hw.link_bw("pcie") * share * np.ones_like(n)


def link_terms(op: str, cols, cost: Cost, hw) -> tuple[np.ndarray, np.ndarray]:
    """(alpha, beta) seconds per row of collective `op` with the faster algorithm (ring, or tree for
    allreduce): t = alpha + beta."""
    links = np.asarray(cols["link"]).reshape(-1).tolist()
    n = np.asarray(cols["world_size"], dtype=np.float64).reshape(-1) * np.ones(len(links))
    paths = {x: link_path(x, hw) for x in set(links)}
    path = np.asarray([paths[x] for x in links], dtype=object)
    bw, launch, hop = np.empty(len(links)), np.empty(len(links)), np.empty(len(links))
    for p in set(paths.values()):
        rows = path == p
        bw[rows] = path_bandwidth(p, hw, n[rows])
        launch[rows], hop[rows] = ALPHA_LAUNCH_S[p], ALPHA_HOP_S[p]
    alpha = launch + RING_HOPS[op](n) * hop
    beta = np.asarray(cost.bytes, dtype=np.float64).reshape(-1) / bw
    if op == "allreduce":
        tree_alpha = launch + 2.0 * np.ceil(np.log2(n)) * hop
        tree_beta = 2.0 * np.asarray(cols["msg_bytes"], dtype=np.float64).reshape(-1) / bw
        tree = tree_alpha + tree_beta < alpha + beta
        alpha, beta = np.where(tree, tree_alpha, alpha), np.where(tree, tree_beta, beta)
    return alpha, beta


def link_time(op: str, cols, cost: Cost, hw) -> np.ndarray:
    """Latency-bandwidth bound per row of collective `op`: alpha(path, hops) + bus bytes / path bandwidth."""
    alpha, beta = link_terms(op, cols, cost, hw)
    return alpha + beta


FAMILIES = [_make(op) for op in ("allreduce", "allgather", "reducescatter", "alltoall", "sendrecv")]
