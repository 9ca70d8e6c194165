"""η model features: ONE definition used by calibration (fitting) and by prediction.

Each family gets an explicit, named feature list per tier:

* shape features, one per shape field: log2(x) for counts ('log2_m'),
  log2(1 + x) for fields that may be 0 ('log2p1_window'), 0/1 for flags,
  bytes per element for dtypes ('dtype_bytes'), the index in the field's
  choices for enumerations ('op_code');
* roofline features on the device (from the cost model and the catalog entry):
  log2 FLOPs and bytes, arithmetic intensity relative to the device's ridge
  point, log2 roofline time, waves of thread blocks over the SMs, tail-wave
  fill, wave-quantization factor, working set relative to L2 (GEMMs: how much
  wave quantization raises the roofline instead of the fill and the factor);
  collectives instead get bus bytes, roofline time and the share of it that
  is bandwidth;
* cross-device tier only, hardware features of the catalog entry, for vector
  kernels (norm, activation, RoPE, element-wise, KV write): peaks (the row's
  dtype and fp32), memory bandwidth, ridge point, SMs, L2, clock; for
  collectives the link bandwidths. Tensor-core kernels (GEMM, attention, MoE,
  MLA) see the GPU only through the roofline and the features relative to it:
  a tree cannot extrapolate an absolute value it never saw (a new generation's
  bandwidth is clamped to the fastest GPU in training), while intensity over
  the ridge point, waves per SM and working set over L2 carry over
  (docs/experiments.md, "Cross tier without absolute hardware features").

Categorical features (flags, dtypes, enumerations) are codes: a value not seen
in training means extrapolation, never interpolation. Numbers are float64;
unknown catalog values (e.g. L2 of a GPU that does not publish it) are NaN.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

from .dtypes import BYTES
from .families import Family, get_family
from .families import attention, gemm
from .families.collectives import link_path, link_terms, path_bandwidth
from .roofline import _peaks, roofline_columns

TIERS = ("target", "cross")
_TINY = 2.0 ** -30  # floor for logs of quantities that can be 0 (FLOP-free kernels)


@dataclass(frozen=True)
class FeatureInput:
    """What a feature is computed from: validated shape columns, their roofline, the GPU."""

    family: Family
    arrays: Mapping[str, np.ndarray]
    roof: Mapping[str, np.ndarray]
    hw: object  # predictor.hardware.Hardware


@dataclass(frozen=True)
class Feature:
    """One named model input. categorical: a code, whose unseen values are flagged, not clamped."""

    name: str
    doc: str
    compute: Callable[[FeatureInput], np.ndarray]
    categorical: bool = False


def _log2(x) -> np.ndarray:
    return np.log2(np.maximum(np.asarray(x, dtype=np.float64), _TINY))


def _const(value, x: FeatureInput) -> np.ndarray:
    return np.full(len(x.roof["t_roof"]), np.nan if value is None else float(value))


# -- shape features: derived from the family's fields, so adding a field adds its feature ----

def _shape_feature(field) -> Feature:
    name = field.name
    if field.kind == "pos":
        return Feature(f"log2_{name}", f"log2 of {name}", lambda x: _log2(x.arrays[name]))
    if field.kind == "nonneg":
        return Feature(f"log2p1_{name}", f"log2(1 + {name})", lambda x: np.log2(1.0 + x.arrays[name]))
    if field.kind == "bool":
        return Feature(name, f"{name} as 0/1", lambda x: x.arrays[name].astype(np.float64), categorical=True)
    if field.kind == "dtype":
        return Feature(f"{name}_bytes", f"bytes per element of {name}",
                       lambda x: np.asarray([BYTES[d] for d in x.arrays[name].tolist()], dtype=np.float64),
                       categorical=True)
    if field.kind == "choice":
        index = {c: float(i) for i, c in enumerate(field.choices)}
        return Feature(f"{name}_code", f"index of {name} in {list(field.choices)}",
                       lambda x: np.asarray([index[v] for v in x.arrays[name].tolist()], dtype=np.float64),
                       categorical=True)
    raise ValueError(f"no feature rule for field kind {field.kind!r}")


# -- roofline features of compute kernels ----------------------------------------------

def _intensity_rel_ridge(x: FeatureInput) -> np.ndarray:
    """(FLOPs/byte) / ridge point = t_compute / (t_memory * wave factor) of the roofline."""
    r = x.roof
    return _log2(r["t_compute"] / (np.maximum(r["t_memory"], _TINY) * r["wave_factor"]))


def _tail_fill(x: FeatureInput) -> np.ndarray:
    """Fraction of the SMs busy in the last wave (1 for whole waves)."""
    rest = np.mod(x.roof["blocks"], x.hw.num_sms)
    return np.where(rest > 0, rest / x.hw.num_sms, 1.0)


KERNEL_FEATURES = (
    Feature("log2_flops", "log2 FLOPs (cost model)", lambda x: _log2(x.roof["flops"])),
    Feature("log2_bytes", "log2 DRAM bytes (cost model)", lambda x: _log2(x.roof["bytes"])),
    Feature("log2_intensity_rel_ridge", "log2 of arithmetic intensity over the device's ridge point "
            "(at the row's dtype peak)", _intensity_rel_ridge),
    Feature("log2_t_roof_us", "log2 roofline time in microseconds", lambda x: _log2(x.roof["t_roof"] * 1e6)),
    Feature("log2_waves", "log2 of thread blocks per SM", lambda x: _log2(x.roof["blocks"] / x.hw.num_sms)),
    Feature("tail_fill", "fraction of SMs busy in the last wave", _tail_fill),
    Feature("wave_factor", "wave-quantization factor ceil(B/n_sm)*n_sm/B", lambda x: x.roof["wave_factor"]),
    Feature("log2_bytes_rel_l2", "log2 of the working set over the L2 size",
            lambda x: _log2(x.roof["bytes"]) - np.log2(x.hw.l2_bytes)),
)


def _row_peaks(x: FeatureInput) -> np.ndarray:
    return _peaks(x.arrays["dtype"].tolist(), x.family.unit, x.hw)


KERNEL_HW_FEATURES = (
    Feature("hw_log2_peak_tflops", "log2 dense peak TFLOPS at the row's dtype (fp32 for vector kernels)",
            lambda x: np.log2(_row_peaks(x) / 1e12)),
    Feature("hw_log2_fp32_tflops", "log2 fp32 (CUDA-core) peak TFLOPS",
            lambda x: _const(np.log2(x.hw.peak_flops("fp32") / 1e12), x)),
    Feature("hw_log2_mem_bw_gbs", "log2 DRAM bandwidth in GB/s", lambda x: _const(np.log2(x.hw.mem_bw_gbs), x)),
    Feature("hw_log2_ridge", "log2 ridge point (FLOP/byte) at the row's dtype",
            lambda x: np.log2(_row_peaks(x) / x.hw.mem_bw)),
    Feature("hw_num_sms", "SMs (compute units)", lambda x: _const(x.hw.num_sms, x)),
    Feature("hw_log2_l2_mb", "log2 L2 size in MiB",
            lambda x: _const(None if x.hw.l2_mb is None else np.log2(x.hw.l2_mb), x)),
    Feature("hw_clock_ghz", "boost clock in GHz",
            lambda x: _const(None if x.hw.boost_clock_mhz is None else x.hw.boost_clock_mhz / 1e3, x)),
)

# -- collectives ---------------------------------------------------------------------

def _alpha(x: FeatureInput) -> np.ndarray:
    """The latency term of the bound: launch + hops of the algorithm the bound chose (collectives.link_terms)."""
    cost = x.family.cost(x.arrays)
    return link_terms(x.family.name, x.arrays, cost, x.hw)[0]


def _link_bw(x: FeatureInput) -> np.ndarray:
    """Bus bandwidth bound of the row's path at its world size (collectives.path_bandwidth)."""
    links = np.asarray(x.arrays["link"]).reshape(-1)
    n = np.asarray(x.arrays["world_size"], dtype=np.float64).reshape(-1) * np.ones(len(links))
    out = np.empty(len(links))
    for link in set(links.tolist()):
        rows = links == link
        out[rows] = path_bandwidth(link_path(link, x.hw), x.hw, n[rows])
    return out


LINK_FEATURES = (
    Feature("log2_bus_bytes", "log2 bus bytes per rank (nccl-tests busbw convention)",
            lambda x: _log2(x.roof["bytes"])),
    Feature("log2_t_roof_us", "log2 latency-bandwidth bound in microseconds",
            lambda x: _log2(x.roof["t_roof"] * 1e6)),
    Feature("bandwidth_share", "share of the bound spent moving bytes (vs the fixed launch latency)",
            lambda x: 1.0 - _alpha(x) / x.roof["t_roof"]),
)

# The link rates reach the model through the row's path only (hw_log2_link_gbs): the GPU's NVLink and PCIe rates
# as constants of every row named the GPU (each training GPU has its own pair), so held-out GPUs landed on the
# nearest training GPU's branch whatever their path (leave-one-GPU-out, docs/experiments.md).
LINK_HW_FEATURES = (
    Feature("hw_log2_link_gbs", "log2 bus bandwidth bound of the row's link path at its world size in GB/s", lambda x: np.log2(_link_bw(x) / 1e9)),
    Feature("hw_log2_mem_bw_gbs", "log2 DRAM bandwidth in GB/s", lambda x: _const(np.log2(x.hw.mem_bw_gbs), x)),
    Feature("hw_num_sms", "SMs (compute units)", lambda x: _const(x.hw.num_sms, x)),
    Feature("hw_clock_ghz", "boost clock in GHz",
            lambda x: _const(None if x.hw.boost_clock_mhz is None else x.hw.boost_clock_mhz / 1e3, x)),
)


# -- family-specific features: how well the cost model's tiles are filled ----------------

def _fill(x, tile) -> np.ndarray:
    """x / (x rounded up to whole tiles): 1 when x fills its last tile."""
    x = np.asarray(x, dtype=np.float64)
    return x / (np.ceil(x / tile) * tile)


def _pow2_alignment(x, cap: int = 256) -> np.ndarray:
    """log2 of the largest power of two dividing x, capped (vector-load alignment)."""
    x = np.asarray(x, dtype=np.int64)
    return np.log2(np.minimum(x & -x, cap).astype(np.float64))


def _wave_penalty(x: FeatureInput) -> np.ndarray:
    """log2 of how much whole-wave quantization raises the roofline: 0 where it stays memory-bound."""
    r = x.roof
    return _log2(r["t_roof"] / np.maximum(r["t_compute"] / r["wave_factor"], r["t_memory"]))


def _split_k_depth(x: FeatureInput) -> np.ndarray:
    """log2 of blocks launched per output tile: the split-K depth the roofline assumed on this GPU."""
    return _log2(x.roof["blocks"] / np.maximum(x.family.cost(x.arrays).blocks, 1))


FAMILY_FEATURES = {
    "gemm": (
        Feature("m_tile_fill", f"m over m rounded up to the {gemm.TILE}-row tile",
                lambda x: _fill(x.arrays["m"], gemm.TILE)),
        Feature("n_tile_fill", f"n over n rounded up to the {gemm.TILE}-column tile",
                lambda x: _fill(x.arrays["n"], gemm.TILE)),
        Feature("log2_k_alignment", "log2 of the largest power of two dividing k (<= 256)",
                lambda x: _pow2_alignment(x.arrays["k"])),
        Feature("log2_split_k", "log2 of thread blocks launched per output tile (split-K depth)", _split_k_depth),
        Feature("log2_wave_penalty", "log2 of how much wave quantization raises the roofline (0 when it stays "
                "memory-bound)", _wave_penalty),
    ),
    "attn_prefill": (
        Feature("q_tile_fill", f"seq_q over seq_q rounded up to the {attention.Q_TILE}-row query tile",
                lambda x: _fill(x.arrays["seq_q"], attention.Q_TILE)),
        Feature("log2_gqa_group", "log2 of query heads per KV head (GQA group size)",
                lambda x: _log2(x.arrays["heads"] / x.arrays["kv_heads"])),
    ),
    "attn_decode": (
        Feature("kv_split_fill", f"seq_kv over seq_kv rounded up to the {attention.KV_SPLIT}-token KV split",
                lambda x: _fill(x.arrays["seq_kv"], attention.KV_SPLIT)),
    ),
}


# Kernel features a family's own replace. GEMMs: cuBLAS and CUTLASS choose tile shapes and split-K per
# shape, so the cost model's 128x128 wave pattern describes the roofline, not the kernel; a tail-wave fill
# learned on compute-bound grid shapes priced memory-bound ones off the grid (A100, m = 1, n = 28672 at
# η 2.5 between grid neighbours at 1.4). The GEMM model sees how much quantization raises the roofline
# instead (log2_wave_penalty), which is 0 where the kernel is memory-bound.
REPLACED = {"gemm": ("tail_fill", "wave_factor")}


def _spec(family: Family, tier: str) -> tuple:
    shape = tuple(_shape_feature(f) for f in family.fields) + FAMILY_FEATURES.get(family.name, ())
    if family.unit == "link":
        return shape + LINK_FEATURES + (LINK_HW_FEATURES if tier == "cross" else ())
    kernel = tuple(f for f in KERNEL_FEATURES if f.name not in REPLACED.get(family.name, ()))
    return shape + kernel + (KERNEL_HW_FEATURES if tier == "cross" and family.unit == "vector" else ())


# (family, tier) -> its Feature list, built the first time it is asked for (features()).
FEATURES: dict[tuple[str, str], tuple] = {}


def features(family: str, tier: str) -> tuple:
    """The Feature list of a family's η model in a tier ('target' or 'cross')."""
    if tier not in TIERS:
        raise ValueError(f"unknown tier {tier!r}: expected one of {TIERS}")
    found = FEATURES.get((family, tier))
    if found is None:
        found = FEATURES[(family, tier)] = _spec(get_family(family), tier)
    return found


def feature_names(family: str, tier: str) -> list[str]:
    return [f.name for f in features(family, tier)]


def feature_matrix(family: str, tier: str, cols: Mapping, hw, roof: Mapping | None = None) -> np.ndarray:
    """(rows x features) float64 matrix of one family's kernels on one GPU, C-contiguous.

    roof: the rows' roofline_columns(family, cols, hw) when the caller already has it.
    """
    fam = get_family(family)
    arrays = fam.validate(cols)
    if roof is None:
        roof = roofline_columns(family, arrays, hw)
    x = FeatureInput(fam, arrays, roof, hw)
    specs = features(family, tier)
    out = np.empty((len(roof["t_roof"]), len(specs)), dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        for j, f in enumerate(specs):
            out[:, j] = f.compute(x)
    return out


def describe(family: str, tier: str) -> list[dict]:
    """Name, meaning and kind of each feature (for reports and the bundle manifest)."""
    return [{"name": f.name, "doc": f.doc, "categorical": f.categorical} for f in features(family, tier)]
