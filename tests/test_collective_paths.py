"""Collectives by topology: the link path comes from the catalog (NVLink, PCIe with or without P2P, network),
the bound is alpha-beta with the algorithm NCCL would pick (predictor/families/collectives.py)."""
import dataclasses

import numpy as np
import pytest

from kernelsight.predictor.errors import KernelsightError
from kernelsight.predictor.families import get_family
from kernelsight.predictor.families.collectives import (ALPHA_HOP_S, ALPHA_LAUNCH_S, PATHS, link_path, link_terms,
                                                        path_bandwidth)
from kernelsight.predictor.features import feature_matrix, feature_names
from kernelsight.predictor.hardware import load_hardware
from kernelsight.predictor.roofline import roofline_columns

L40S, H100, GB200 = (load_hardware(k) for k in ("l40s", "h100_sxm", "gb200"))


def _cols(op, msg, n, link):
    size = len(np.atleast_1d(msg))
    return {"msg_bytes": np.broadcast_to(np.asarray(msg, dtype=np.int64), (size,)),
            "world_size": np.full(size, n), "link": np.full(size, link, dtype=object),
            "dtype": np.full(size, "bf16", dtype=object)}


def test_catalog_states_pcie_p2p_and_paths_follow_it():
    assert L40S.pcie_p2p is False and H100.pcie_p2p is None
    assert link_path("nvlink", H100) == "nvswitch"
    assert link_path("nvlink", L40S) == "pcie_host"  # no NVLink: NCCL takes PCIe, here without P2P
    assert link_path("pcie", L40S) == "pcie_host"
    assert link_path("pcie", dataclasses.replace(L40S, pcie_p2p=True)) == "pcie_p2p"
    assert link_path("pcie", H100) == "pcie_host"  # P2P not stated in the catalog: the path without it
    assert link_path("net", L40S) == "net"
    assert set(ALPHA_LAUNCH_S) == set(ALPHA_HOP_S) == set(PATHS)
    with pytest.raises(KernelsightError, match="no PCIe bandwidth"):
        link_path("pcie", GB200)  # Grace-attached: the host link is not PCIe


def test_host_bridge_bandwidth_falls_with_the_ring_and_p2p_does_not():
    n = np.array([2, 4, 8])
    assert path_bandwidth("pcie_host", L40S, n) == pytest.approx(np.array([32e9, 8e9, 2e9]))
    assert path_bandwidth("pcie_p2p", L40S, n) == pytest.approx(np.full(3, 32e9))
    assert path_bandwidth("nvswitch", H100, n) == pytest.approx(np.full(3, 450e9))


@pytest.mark.parametrize("op", ["allreduce", "allgather", "reducescatter", "alltoall"])
def test_bound_is_alpha_beta_of_the_ring_for_large_messages(op):
    fam = get_family(op)
    cols = _cols(op, [1 << 30], 4, "pcie")
    alpha, beta = link_terms(op, cols, fam.cost(cols), L40S)
    hops = 2 * 3 if op == "allreduce" else 3
    assert alpha[0] == pytest.approx(ALPHA_LAUNCH_S["pcie_host"] + hops * ALPHA_HOP_S["pcie_host"])
    assert beta[0] == pytest.approx(fam.cost(cols).bytes[0] / 8e9)
    assert roofline_columns(op, cols, L40S)["t_roof"][0] == pytest.approx(alpha[0] + beta[0])


def test_small_allreduce_takes_the_tree_large_the_ring():
    fam = get_family("allreduce")
    cols = _cols("allreduce", [1 << 10, 1 << 30], 8, "nvlink")
    alpha, beta = link_terms("allreduce", cols, fam.cost(cols), H100)
    hop, launch = ALPHA_HOP_S["nvswitch"], ALPHA_LAUNCH_S["nvswitch"]
    assert alpha[0] == pytest.approx(launch + 2 * 3 * hop)  # tree: 2 log2(8) hops
    assert beta[0] == pytest.approx(2 * (1 << 10) / 450e9)
    assert alpha[1] == pytest.approx(launch + 2 * 7 * hop)  # ring: 2 (n - 1) hops
    assert beta[1] == pytest.approx(fam.cost(cols).bytes[1] / 450e9)


def test_cross_features_see_the_path_bandwidth():
    cols = _cols("allgather", [1 << 20] * 3, 2, "pcie")
    cols["world_size"] = np.array([2, 4, 8])
    x = feature_matrix("allgather", "cross", cols, L40S, roofline_columns("allgather", cols, L40S))
    j = feature_names("allgather", "cross").index("hw_log2_link_gbs")
    assert x[:, j] == pytest.approx(np.log2([32, 8, 2]))
