"""Collectives: allreduce, allgather, reducescatter, alltoall, sendrecv.

`msg_bytes` is nccl-tests' "size": the per-rank buffer for allreduce and
alltoall, the full (gathered) buffer for allgather and reducescatter, the
message for sendrecv. nccl-tests' conventions:
  algbw = msg_bytes / time,  busbw = algbw * factor,
  factor = 2(n-1)/n (allreduce), (n-1)/n (allgather, reducescatter, alltoall), 1 (sendrecv).
`bytes` of the cost model is the bus traffic per rank, msg_bytes * factor, so
the latency-bandwidth form reads  t = alpha(link) + bytes / link_bw,  with
link_bw the hardware entry's per-direction bandwidth of that link. alpha is a
stated floor per launch (not fitted): 2 us NVLink, 5 us PCIe, 10 us network.
"""
from dataclasses import dataclass

import numpy as np

from .base import Cost, Family, Field, Shape, elem_bytes

LINKS = ("nvlink", "pcie", "net")
ALPHA_S = {"nvlink": 2e-6, "pcie": 5e-6, "net": 10e-6}
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


def link_time(cols, cost: Cost, hw) -> np.ndarray:
    """Latency-bandwidth lower bound: alpha(link) + bus bytes / link bandwidth."""
    links = np.asarray(cols["link"]).reshape(-1).tolist()
    link_bw = {x: hw.link_bw(x) for x in set(links)}
    alpha = np.asarray([ALPHA_S[x] for x in links])
    bw = np.asarray([link_bw[x] for x in links])
    return alpha + cost.bytes / bw


FAMILIES = [_make(op) for op in ("allreduce", "allgather", "reducescatter", "alltoall", "sendrecv")]
