"""Hardware catalog: typed, validated GPU entries from conf/hardware/<key>.yaml.

Every roofline, η feature and communication estimate reads its peaks from here,
so a wrong number silently skews every prediction. Entries are therefore checked
on load (types, plausible ranges, unknown keys, alias collisions) and each
problem is reported as ONE line naming the file and the field.

Units in the YAML follow gpu_specs.csv (TFLOPS dense, decimal GB/s per
direction, L2 in MiB, shared memory in KiB); the methods return SI base units
(FLOP/s, bytes/s, bytes) so callers never convert.

Dependency-light on purpose (PyYAML only): the laptop-side simulator imports it.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

from kernelsight.predictor import dtypes as _dtypes
from kernelsight.predictor.errors import KernelsightError, closest, did_you_mean, either
from kernelsight.predictor.paths import conf_dir, read_yaml

__all__ = [
    "DERIVABLE",
    "DTYPES",
    "LINKS",
    "NET_GBS_PER_GPU",
    "Hardware",
    "hardware_dir",
    "list_hardware",
    "load_catalog",
    "load_hardware",
    "load_hardware_file",
    "normalize_name",
    "resolve_device",
]

#: Canonical dtype names of `Hardware.peak_tflops` (dense tensor/matrix peaks;
#: fp32 is the non-tensor CUDA-core / vector rate).
DTYPES: tuple[str, ...] = ("fp32", "tf32", "bf16", "fp16", "fp8", "int8", "fp4")
assert set(DTYPES) == set(_dtypes.COMPUTE_BYTES), "hardware peaks and predictor.dtypes must name the same dtypes"

#: Spellings accepted by `peak_flops` (torch/numpy names included, 'torch.' prefix stripped).
_DTYPE_ALIASES: dict[str, str] = {
    "fp32": "fp32", "float32": "fp32", "float": "fp32", "f32": "fp32",
    "tf32": "tf32", "tensorfloat32": "tf32",
    "bf16": "bf16", "bfloat16": "bf16",
    "fp16": "fp16", "float16": "fp16", "half": "fp16", "f16": "fp16",
    "fp8": "fp8", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8", "e4m3": "fp8", "e5m2": "fp8",
    "float8": "fp8", "float8_e4m3": "fp8", "float8_e4m3fn": "fp8", "float8_e4m3fnuz": "fp8",
    "float8_e5m2": "fp8", "float8_e5m2fnuz": "fp8",
    "int8": "int8", "i8": "int8",
    "fp4": "fp4", "float4": "fp4", "float4_e2m1fn_x2": "fp4",
    **{name: name for name in _dtypes.FORMATS},
}

#: Default scale-out bandwidth per GPU, GB/s per direction = one 400 Gb/s NIC
#: (ConnectX-7 NDR) per GPU, the usual rail-optimised DGX/HGX layout and the
#: value aiconfigurator uses for inter-node traffic. Not a catalog field because
#: it belongs to the cluster, not the GPU: a deployment states its own
#: (`parallel.net_gbs_per_gpu`, applied with Hardware.on_network).
NET_GBS_PER_GPU: float = 50.0

LINKS: tuple[str, ...] = ("nvlink", "pcie", "net")


@dataclass(frozen=True)
class Hardware:
    """One GPU as the runtime sees it (one device, not a superchip or package).

    Field units match the YAML; use the methods for SI units. `None` means
    unsupported or absent (e.g. fp8 on Ampere, PCIe on a Grace-attached GPU).

    `derived` maps a number field (DERIVABLE: 'l2_mb', 'peak_tflops.bf16', ...)
    that no public source states to the rule that produced its value ("same die
    as B300: ..."); for a field left null it states why (absent by design) and
    how features treat it. Fields not named there are published figures.
    """

    key: str
    name: str
    vendor: str
    arch: str
    compute_capability: str  # CUDA CC "9.0"; AMD rows hold the LLVM gfx target ("gfx942")
    num_sms: int  # SMs (AMD: compute units)
    boost_clock_mhz: float | None
    peak_tflops: dict[str, float | None] = field(hash=False)  # dtype -> dense TFLOPS (TOPS for int8)
    mem_gb: float
    mem_bw_gbs: float  # decimal GB/s
    l2_mb: float | None  # MiB
    smem_per_sm_kb: float  # max configurable shared memory per SM, KiB
    tdp_w: float | None
    nvlink_gbs_per_dir: float | None  # scale-up link per GPU per direction; 0 = none (AMD: Infinity Fabric)
    pcie_gen: int | None
    pcie_gbs_per_dir: float | None  # host x16 link per direction; None for Grace-attached GPUs
    # PCIe peer-to-peer between GPUs of one server: True (P2P DMA over PCIe switches), False (traffic staged
    # through host memory across the host bridge, NCCL's SHM path), None (not known: priced as False, the path
    # NCCL takes without P2P). Prices the 'pcie' collective path (families.collectives.link_path).
    pcie_p2p: bool | None = None
    aliases: tuple[str, ...] = ()
    sources: str = ""
    derived: dict[str, str] = field(default_factory=dict, hash=False)  # field -> rule (see the class doc)
    net_gbs_per_gpu: float = NET_GBS_PER_GPU  # the deployment's scale-out bandwidth per GPU per direction

    def on_network(self, net_gbs_per_gpu: float) -> "Hardware":
        """This GPU in a cluster whose scale-out network gives each GPU `net_gbs_per_gpu` GB/s per direction."""
        try:
            gbs = float(net_gbs_per_gpu)
        except (TypeError, ValueError):
            gbs = float("nan")
        if not gbs > 0:
            raise KernelsightError(f"net_gbs_per_gpu = {net_gbs_per_gpu!r}: the scale-out network needs a bandwidth "
                                   f"> 0 (GB/s per GPU and direction)")
        return replace(self, net_gbs_per_gpu=gbs)

    # ----------------------------------------------------------------- units
    def peak_flops(self, dtype: Any) -> float:
        """Dense peak in FLOP/s (OP/s for int8) of the math `dtype` runs in on this GPU: a weight format's
        compute dtype, or its weight-only fallback where the GPU has no peak for it (predictor.dtypes);
        raises when neither is in the catalog."""
        canonical = _dtypes.compute_dtype(canonical_dtype(dtype), self.supported_dtypes)
        value = self.peak_tflops.get(canonical)
        if value is None:
            supported = ", ".join(self.supported_dtypes) or "none"
            raise KernelsightError(
                f"GPU {self.key!r} ({self.name}) has no {canonical} peak in the hardware catalog "
                f"(unsupported by the hardware or unknown); dtypes with a peak: {supported}")
        return float(value) * 1e12

    @property
    def supported_dtypes(self) -> tuple[str, ...]:
        """Canonical dtypes whose peak is known, in DTYPES order."""
        return tuple(d for d in DTYPES if self.peak_tflops.get(d) is not None)

    @property
    def mem_bw(self) -> float:
        """Peak DRAM bandwidth in bytes/s."""
        return self.mem_bw_gbs * 1e9

    @property
    def l2_bytes(self) -> float:
        """L2 size in bytes (the catalog stores MiB); NaN when unknown, so features stay numeric."""
        return float("nan") if self.l2_mb is None else self.l2_mb * 2.0**20

    def link_bw(self, link: str) -> float:
        """Bandwidth of one GPU's link in bytes/s per direction.

        'nvlink' falls back to PCIe when the GPU has no scale-up link (0) or it
        is unknown, because that is the path NCCL takes then; 'net' is the
        deployment's net_gbs_per_gpu (NET_GBS_PER_GPU unless stated).
        """
        name = str(link).strip().lower()
        if name == "net":
            return self.net_gbs_per_gpu * 1e9
        if name == "nvlink":
            if self.nvlink_gbs_per_dir:
                return self.nvlink_gbs_per_dir * 1e9
            return self._pcie_bw("nvlink (no NVLink on this GPU, falling back to PCIe)")
        if name == "pcie":
            return self._pcie_bw("pcie")
        raise KernelsightError(f"unknown link {link!r} for GPU {self.key!r}{did_you_mean(name, LINKS)}; "
                               f"expected one of: {', '.join(LINKS)}")

    def _pcie_bw(self, what: str) -> float:
        if self.pcie_gbs_per_dir is None:
            raise KernelsightError(
                f"GPU {self.key!r} has no PCIe bandwidth in the hardware catalog, needed for link {what}; "
                f"its host link is not PCIe (e.g. NVLink-C2C on Grace-attached parts) or is unknown")
        return self.pcie_gbs_per_dir * 1e9

    def ridge_point(self, dtype: Any) -> float:
        """Arithmetic intensity (FLOP/byte) where the roofline turns from memory- to compute-bound."""
        return self.peak_flops(dtype) / self.mem_bw

    # ----------------------------------------------------------- conversion
    def as_dict(self) -> dict[str, Any]:
        """Plain YAML/JSON-ready mapping in field order (the inverse of from_mapping)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name in _DEPLOYMENT:
                continue
            value = getattr(self, f.name)
            if f.name == "peak_tflops":
                value = {d: value.get(d) for d in DTYPES}
            elif f.name == "aliases":
                value = list(value)
            elif f.name == "derived":
                value = dict(value)
            out[f.name] = value
        return out

    @classmethod
    def from_mapping(cls, data: Any, source: str = "<mapping>") -> "Hardware":
        """Validate a parsed entry (YAML mapping or a Hydra container); errors name `source`."""
        return _build(data, str(source))


# --------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------

_KEY_RE = re.compile(r"^[a-z0-9][a-z0-9_]*$")

# field -> (kind, nullable, (lo, hi) plausible range or None); every field but
# aliases/sources is required, nullable ones spelled out as `null`.
_RULES: dict[str, tuple[str, bool, tuple[float, float] | None]] = {
    "key": ("str", False, None),
    "name": ("str", False, None),
    "vendor": ("str", False, None),
    "arch": ("str", False, None),
    "compute_capability": ("str", False, None),
    "num_sms": ("int", False, (1, 1000)),
    "boost_clock_mhz": ("float", True, (100, 5000)),
    "peak_tflops": ("peaks", False, (0.001, 100000)),
    "mem_gb": ("float", False, (0.5, 2000)),
    "mem_bw_gbs": ("float", False, (10, 100000)),
    "l2_mb": ("float", True, (0.01, 4096)),
    "smem_per_sm_kb": ("float", False, (1, 4096)),
    "tdp_w": ("float", True, (1, 5000)),
    "nvlink_gbs_per_dir": ("float", True, (0, 100000)),
    "pcie_gen": ("int", True, (1, 10)),
    "pcie_gbs_per_dir": ("float", True, (0.1, 10000)),
    "pcie_p2p": ("bool", True, None),
    "aliases": ("aliases", True, None),
    "sources": ("str", True, None),
    "derived": ("derived", True, None),
}
_OPTIONAL = {"pcie_p2p", "aliases", "sources", "derived"}
_DEPLOYMENT = ("net_gbs_per_gpu",)  # Hardware fields that no catalog entry holds
assert tuple(_RULES) == tuple(f.name for f in fields(Hardware) if f.name not in _DEPLOYMENT), \
    "keep _RULES in dataclass order"

#: Names a `derived` entry may carry: every number field of an entry, peaks per dtype.
DERIVABLE: tuple[str, ...] = tuple(
    n for n, (kind, _, _) in _RULES.items() if kind in ("int", "float")) + tuple(f"peak_tflops.{d}" for d in DTYPES)


def _fail(source: str, name: str, problem: str) -> KernelsightError:
    return KernelsightError(f"{source}: field {name!r} {problem}".replace("\n", " "))


def _number(source: str, name: str, value: Any, kind: str, bounds: tuple[float, float] | None):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return _type_error(source, name, value, "an integer" if kind == "int" else "a number")
    if kind == "int" and not isinstance(value, int):
        if float(value).is_integer():
            value = int(value)
        else:
            raise _fail(source, name, f"must be an integer, got {value!r}")
    if not math.isfinite(value):
        raise _fail(source, name, f"must be a finite number, got {value!r}")
    if bounds is not None:
        lo, hi = bounds
        if value < 0:
            raise _fail(source, name, f"must not be negative, got {value!r}")
        if not lo <= value <= hi:
            raise _fail(source, name, f"= {value!r} is outside the plausible range [{lo:g}, {hi:g}]")
    return int(value) if kind == "int" else float(value)


def _type_error(source: str, name: str, value: Any, expected: str):
    hint = ""
    if name == "compute_capability" and isinstance(value, (int, float)) and not isinstance(value, bool):
        hint = f"; quote it in YAML, e.g. '{value}'"
    raise _fail(source, name, f"must be {expected}, got {type(value).__name__} {value!r}{hint}")


def _build(data: Any, source: str) -> Hardware:
    if not isinstance(data, Mapping):
        raise KernelsightError(f"{source}: expected a mapping of hardware fields at the top level, "
                               f"got {type(data).__name__}")
    for name in data:
        if name not in _RULES:
            raise _fail(source, str(name), f"is not a hardware field{did_you_mean(str(name), _RULES)}")
    values: dict[str, Any] = {}
    for name, (kind, nullable, bounds) in _RULES.items():
        if name not in data:
            if name in _OPTIONAL:
                continue
            hint = " (write `null` if unknown)" if nullable else ""
            raise _fail(source, name, f"is missing (required){hint}")
        value = data[name]
        if value is None:
            if not nullable:
                raise _fail(source, name, "must not be null")
            if name in _OPTIONAL:
                continue
            values[name] = None
            continue
        if kind == "str":
            if not isinstance(value, str):
                _type_error(source, name, value, "a string")
            if name != "sources" and not value.strip():
                raise _fail(source, name, "must not be empty")
            values[name] = value
        elif kind == "bool":
            if not isinstance(value, bool):
                _type_error(source, name, value, "true or false")
            values[name] = value
        elif kind in ("int", "float"):
            values[name] = _number(source, name, value, kind, bounds)
        elif kind == "peaks":
            values[name] = _peaks(source, value, bounds)
        elif kind == "aliases":
            values[name] = _aliases(source, value)
        elif kind == "derived":
            values[name] = _derived(source, value)
    if not _KEY_RE.match(values["key"]):
        raise _fail(source, "key", f"= {values['key']!r} must be lower-case letters, digits and '_' "
                                   f"(it is the Hydra option name)")
    return Hardware(**values)


def _peaks(source: str, value: Any, bounds) -> dict[str, float | None]:
    if not isinstance(value, Mapping):
        _type_error(source, "peak_tflops", value, f"a mapping of dtype -> TFLOPS ({', '.join(DTYPES)})")
    peaks: dict[str, float | None] = {d: None for d in DTYPES}
    for dtype, tflops in value.items():
        name = f"peak_tflops.{dtype}"
        if dtype not in peaks:
            raise _fail(source, name, f"is not a known dtype{did_you_mean(str(dtype), DTYPES)}; "
                                      f"expected: {', '.join(DTYPES)}")
        peaks[dtype] = None if tflops is None else _number(source, name, tflops, "float", bounds)
    return peaks


def _aliases(source: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        _type_error(source, "aliases", value, "a list of strings")
    seen: dict[str, str] = {}
    for alias in value:
        if not isinstance(alias, str) or not normalize_name(alias):
            raise _fail(source, "aliases", f"entries must be non-empty strings, got {alias!r}")
        norm = normalize_name(alias)
        if norm in seen:
            raise _fail(source, "aliases", f"lists {alias!r} twice (same as {seen[norm]!r} "
                                           f"ignoring case, spaces, '_' and '-')")
        seen[norm] = alias
    return tuple(value)


def _derived(source: str, value: Any) -> dict[str, str]:
    """{field: rule}: each field a DERIVABLE name, each rule a non-empty string."""
    if not isinstance(value, Mapping):
        _type_error(source, "derived", value, "a mapping of field -> rule (e.g. l2_mb: same die as B300)")
    out: dict[str, str] = {}
    for name, rule in value.items():
        where = f"derived.{name}"
        if name not in DERIVABLE:
            raise _fail(source, where, f"is not a catalog number field{did_you_mean(str(name), DERIVABLE)}; "
                                       f"expected a field such as l2_mb, boost_clock_mhz or peak_tflops.bf16")
        if not isinstance(rule, str) or not rule.strip():
            raise _fail(source, where, f"needs the rule that gave the value (a non-empty string), got {rule!r}")
        out[name] = rule
    return out


def load_hardware_file(path: str | Path) -> Hardware:
    """Load and validate one conf/hardware/<key>.yaml (also for files outside the catalog)."""
    path = Path(path)
    hw = Hardware.from_mapping(read_yaml(path, "hardware"), str(path))
    if hw.key != path.stem:
        raise _fail(str(path), "key", f"is {hw.key!r} but the file is named {path.name!r}; they must match "
                                      f"(Hydra selects hardware=<file name>)")
    return hw


# --------------------------------------------------------------------------
# catalog and name resolution
# --------------------------------------------------------------------------

def normalize_name(name: str) -> str:
    """Lookup form: case-insensitive, spaces/underscores/dashes ignored ("NVIDIA H100 80GB HBM3")."""
    return re.sub(r"[\s_\-]+", "", str(name).lower())


def canonical_dtype(dtype: Any) -> str:
    """'bfloat16', 'torch.float16', 'half', 'fp8_e4m3' ... -> one of DTYPES.

    Accepts more spellings than predictor.dtypes (torch/numpy names) because
    device code passes torch dtypes straight in; the final say is dtypes'.
    """
    text = str(dtype).strip().lower()
    for prefix in ("torch.", "numpy.", "np."):
        if text.startswith(prefix):
            text = text[len(prefix):]
    text = _DTYPE_ALIASES.get(text) or _DTYPE_ALIASES.get(text.replace("-", "_")) or text
    try:
        return _dtypes.canonical_dtype(text)
    except KernelsightError:
        raise KernelsightError(f"unknown dtype {dtype!r}{did_you_mean(text, _DTYPE_ALIASES)}; expected one of: "
                               f"{', '.join(DTYPES)} (or bfloat16, float16, half, float32, fp8_e4m3)") from None


class _Catalog:
    """All entries of one hardware directory plus the normalized-name index."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.entries: dict[str, Hardware] = {}
        self.index: dict[str, str] = {}  # normalized key/alias -> key
        origin: dict[str, tuple[str, Path]] = {}  # normalized -> (how it was registered, file)
        files = sorted(directory.glob("*.yaml"))
        if not files:
            raise KernelsightError(f"{directory}: no hardware files (*.yaml) found")
        loaded = [(p, load_hardware_file(p)) for p in files]
        for path, hw in loaded:  # keys first: an alias must never shadow another entry's key
            self.entries[hw.key] = hw
            self.index[normalize_name(hw.key)] = hw.key
            origin[normalize_name(hw.key)] = (f"key {hw.key!r}", path)
        for path, hw in loaded:
            for alias in hw.aliases:
                norm = normalize_name(alias)
                owner = self.index.get(norm)
                if owner == hw.key and origin[norm][0].startswith("key"):
                    continue  # alias spelling of its own key: harmless
                if owner is not None:
                    what, other = origin[norm]
                    raise _fail(str(path), "aliases", f"entry {alias!r} collides with {what} in {other} "
                                                      f"(aliases must be unique across the catalog, ignoring "
                                                      f"case, spaces, '_' and '-')")
                self.index[norm] = hw.key
                origin[norm] = (f"alias {alias!r}", path)

    def resolve(self, raw_name: Any) -> str:
        if not isinstance(raw_name, str) or not normalize_name(raw_name):
            raise KernelsightError(f"unknown GPU {raw_name!r}: expected a catalog key or device name; "
                                   f"known: {', '.join(sorted(self.entries))}")
        key = self.index.get(normalize_name(raw_name))
        if key is not None:
            return key
        guesses = closest(normalize_name(raw_name), list(self.index), canonical=self.index)
        if guesses:
            raise KernelsightError(f"unknown GPU {raw_name!r}: did you mean {either(guesses)}?")
        raise KernelsightError(f"unknown GPU {raw_name!r}; known: {', '.join(sorted(self.entries))}")


def hardware_dir() -> Path:
    """conf/hardware of the installed package (or of the source checkout)."""
    return conf_dir() / "hardware"


@lru_cache(maxsize=8)
def _catalog(directory: str) -> _Catalog:
    return _Catalog(Path(directory))


def _get_catalog(directory: str | Path | None) -> _Catalog:
    return _catalog(str(Path(directory if directory is not None else hardware_dir()).resolve()))


def load_catalog(directory: str | Path | None = None) -> dict[str, Hardware]:
    """Every entry of a hardware directory (default: the shipped catalog), validated as a whole."""
    return dict(_get_catalog(directory).entries)


def list_hardware() -> list[str]:
    """Catalog keys, sorted (the valid values of `hardware=`)."""
    return sorted(_get_catalog(None).entries)


def resolve_device(raw_name: str) -> str:
    """Catalog key for a key, alias or raw device name (nvidia-smi / torch), e.g. 'NVIDIA H100 80GB HBM3'."""
    return _get_catalog(None).resolve(raw_name)


@lru_cache(maxsize=256)
def _load_cached(name: str) -> Hardware:
    catalog = _get_catalog(None)
    return catalog.entries[catalog.resolve(name)]


def load_hardware(name_or_alias: str | Hardware) -> Hardware:
    """The catalog entry for a key, alias or raw device name; a path to a .yaml loads that file."""
    if isinstance(name_or_alias, Hardware):
        return name_or_alias
    if isinstance(name_or_alias, (str, Path)) and str(name_or_alias).endswith((".yaml", ".yml")) \
            and Path(name_or_alias).is_file():
        return load_hardware_file(name_or_alias)
    if not isinstance(name_or_alias, str):
        raise KernelsightError(f"unknown GPU {name_or_alias!r}: expected a catalog key or device name")
    return _load_cached(name_or_alias)
