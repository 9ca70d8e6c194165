"""Hardware catalog: every shipped entry loads, names resolve, every feature is filled or derived, the training
GPUs' numbers are frozen (bad files and the CSV converter: test_hardware_files.py)."""
from __future__ import annotations

import csv
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml

from kernelsight.calibrate.importers.gpu_specs import convert_gpu_specs, read_gpu_specs
from kernelsight.predictor.errors import KernelsightError
from kernelsight.predictor.features import feature_matrix
from kernelsight.predictor.hardware import (
    DERIVABLE,
    DTYPES,
    NET_GBS_PER_GPU,
    Hardware,
    hardware_dir,
    list_hardware,
    load_catalog,
    load_hardware,
    load_hardware_file,
    resolve_device,
)
from kernelsight.predictor.paths import conf_dir, data_dir

SPECS_CSV = conf_dir() / "hardware" / "gpu_specs.csv"  # the catalog's source table, shipped beside it

# Raw device names in the reference data: aiconfigurator `device`, NeuSight `Device`, Vidur folders.
RAW_NAMES = {
    "NVIDIA H100 80GB HBM3": "h100_sxm",
    "NVIDIA A100-SXM4-80GB": "a100_sxm",
    "NVIDIA H200": "h200_sxm",
    "NVIDIA B200": "b200_sxm",
    "NVIDIA GB200": "gb200",
    "NVIDIA L40S": "l40s",
    "Tesla P4": "p4",
    "NVIDIA A100-PCIE-40GB": "a100_pcie_40g",
    "NVIDIA A100 80GB PCIe": "a100_pcie",
    "NVIDIA A100-SXM4-40GB": "a100_sxm_40g",
    "NVIDIA L4": "l4",
    "Tesla T4": "t4",
    "Tesla V100-PCIE-32GB": "v100_pcie",
    "Tesla P100-PCIE-16GB": "p100_pcie",
    "a100": "a100_sxm",
    "h100": "h100_sxm",
    "h200": "h200_sxm",
    "b200": "b200_sxm",
    "gb200": "gb200",
    "l40s": "l40s",
    "mi300x": "mi300x",
    "AMD Instinct MI300X": "mi300x",
    # case / separator insensitive
    "nvidia_h100_80gb_hbm3": "h100_sxm",
    "H100-SXM": "h100_sxm",
    "  H100 SXM  ": "h100_sxm",
}


def _files() -> list[Path]:
    return sorted(hardware_dir().glob("*.yaml"))


# ------------------------------------------------------------------ catalog


def test_paths_point_at_shipped_dirs():
    assert (conf_dir() / "hardware").is_dir()
    assert data_dir().is_dir()


@pytest.mark.parametrize("path", _files(), ids=lambda p: p.stem)
def test_every_file_loads(path):
    hw = load_hardware_file(path)
    assert hw.key == path.stem
    assert set(hw.peak_tflops) == set(DTYPES)
    assert hw.sources.strip(), "each entry carries a provenance note"
    assert load_hardware(hw.key) == hw


def test_catalog_has_38_entries():
    keys = list_hardware()
    assert len(keys) == 38 == len(_files())
    assert keys == sorted(keys) == sorted(load_catalog())


def test_catalog_matches_csv(tmp_path):
    """The shipped YAML is what the converter produces from the CSV (no hand-edited numbers)."""
    with SPECS_CSV.open(newline="") as handle:
        assert sorted(r["key"] for r in csv.DictReader(handle)) == list_hardware()
    convert_gpu_specs(SPECS_CSV, tmp_path)
    regenerated = load_catalog(tmp_path)
    shipped = load_catalog()
    for key, hw in shipped.items():
        fresh = regenerated[key]
        assert fresh.as_dict() | {"aliases": [], "sources": ""} == hw.as_dict() | {"aliases": [], "sources": ""}


def test_h100_sxm_numbers():
    hw = load_hardware("h100_sxm")
    assert hw.peak_flops("bf16") == 989.4e12
    assert hw.peak_flops("bfloat16") == hw.peak_flops("fp16") == hw.peak_flops("half") == 989.4e12
    assert hw.peak_flops("fp8_e4m3") == pytest.approx(1978.9e12)
    assert hw.peak_flops("float32") == 67e12
    assert hw.mem_bw == 3.35e12
    assert hw.num_sms == 132 and hw.compute_capability == "9.0"
    assert hw.l2_bytes == 50 * 2**20
    assert hw.ridge_point("bf16") == pytest.approx(295.3, abs=0.05)


def test_known_traps_kept():
    assert load_hardware("l4").num_sms == 58
    assert load_hardware("h200_sxm").l2_bytes == 60 * 2**20  # measured on a lent H200, not H100's 50 MiB
    gb300 = load_hardware("gb300")  # no public L2 or clock: derived by a stated rule, and marked
    assert gb300.l2_mb == 126.5 and gb300.boost_clock_mhz == 2056
    assert {"l2_mb", "boost_clock_mhz"} <= set(gb300.derived) and "B300" in gb300.derived["l2_mb"]
    assert load_hardware("mi300x").compute_capability == "gfx942"
    assert load_hardware("b300_sxm").peak_tflops["int8"] == 153.5


def test_link_bandwidth():
    h100 = load_hardware("h100_sxm")
    assert h100.link_bw("nvlink") == 450e9
    assert h100.link_bw("pcie") == 64e9
    assert h100.link_bw("net") == NET_GBS_PER_GPU * 1e9 == 50e9
    on_hdr = h100.on_network(25)  # a deployment's own scale-out network; the catalog entry is untouched
    assert on_hdr.link_bw("net") == 25e9 and on_hdr.link_bw("nvlink") == 450e9 and on_hdr.key == "h100_sxm"
    assert "net_gbs_per_gpu" not in on_hdr.as_dict() and Hardware.from_mapping(on_hdr.as_dict()) == h100
    l4 = load_hardware("l4")
    assert l4.nvlink_gbs_per_dir == 0
    assert l4.link_bw("nvlink") == l4.link_bw("pcie") == 32e9
    with pytest.raises(KernelsightError, match="pcie"):
        h100.link_bw("pcie5")


def test_unsupported_dtype_raises():
    """A format without tensor cores is priced at its weight-only fallback (fp8 on an A100: bf16 math); a GPU
    with neither is refused naming both."""
    a100 = load_hardware("a100_sxm")
    assert a100.peak_flops("fp8") == a100.peak_flops("bf16")
    with pytest.raises(KernelsightError) as info:
        load_hardware("v100_sxm").peak_flops("fp8")
    message = str(info.value)
    assert "v100_sxm" in message and "bf16" in message and "fp16" in message
    with pytest.raises(KernelsightError, match="unknown dtype"):
        load_hardware("h100_sxm").peak_flops("fp7")


def test_hardware_is_frozen_and_hashable():
    hw = load_hardware("h100_sxm")
    with pytest.raises(AttributeError):
        hw.num_sms = 1  # type: ignore[misc]
    assert {hw: 1}[load_hardware("NVIDIA H100 80GB HBM3")] == 1
    assert isinstance(hw, Hardware)


# ---------------------------------------------------------- name resolution


@pytest.mark.parametrize("raw, key", sorted(RAW_NAMES.items()))
def test_alias_resolution(raw, key):
    assert resolve_device(raw) == key
    assert load_hardware(raw).key == key


def test_aliases_unique_across_catalog():
    from kernelsight.predictor.hardware import normalize_name

    seen: dict[str, str] = {}
    for hw in load_catalog().values():
        for name in (hw.key, *hw.aliases):
            norm = normalize_name(name)
            assert seen.setdefault(norm, hw.key) == hw.key, f"{name!r} used by {seen[norm]} and {hw.key}"


def test_every_alias_in_every_file_resolves_to_that_file():
    """Read from the YAML files themselves (not the loaded catalog): each alias, as written and in the
    spellings a user types (upper case, '-' for '_'), is that file's entry; no alias is claimed twice."""
    from kernelsight.predictor.hardware import normalize_name

    owner: dict[str, str] = {}
    for path in _files():
        raw = yaml.safe_load(path.read_text())
        assert raw["key"] == path.stem
        for name in [raw["key"], *(raw.get("aliases") or [])]:
            assert owner.setdefault(normalize_name(name), path.stem) == path.stem, \
                f"{name!r} claimed by {owner[normalize_name(name)]} and {path.stem}"
            for spelling in (name, name.upper(), name.replace("_", "-")):
                assert resolve_device(spelling) == path.stem, (spelling, path.name)
    assert resolve_device("h100") == "h100_sxm"


def test_did_you_mean_on_typo():
    with pytest.raises(KernelsightError) as info:
        resolve_device("h10O")
    assert str(info.value) == "unknown GPU 'h10O': did you mean 'h100_sxm'?"
    with pytest.raises(KernelsightError, match="unknown GPU"):
        load_hardware("not-a-gpu-at-all")


@pytest.mark.parametrize("name, message", [
    # the start of a few entries' names or aliases: all of them, each once (H100 has several aliases)
    ("NVIDIA H100", "unknown GPU 'NVIDIA H100': did you mean 'h100_nvl', 'h100_pcie' or 'h100_sxm'?"),
    ("NVIDIA A100", "unknown GPU 'NVIDIA A100': did you mean 'a100_pcie', 'a100_pcie_40g', 'a100_sxm' or "
                    "'a100_sxm_40g'?"),
    # the start of too many to guess: the known keys instead of a wrong guess
    ("nvidia", "unknown GPU 'nvidia'; known: a10, a100_pcie,"),
])
def test_did_you_mean_on_a_partial_name(name, message):
    with pytest.raises(KernelsightError) as info:
        resolve_device(name)
    assert str(info.value).startswith(message)


def test_vidur_a40_is_not_invented():
    with pytest.raises(KernelsightError):
        resolve_device("a40")


# ------------------------------------------------- a complete catalog (every feature filled or derived)

# Catalog numbers the cross-device tier's features read (predictor/features.py); the first test checks this
# list against the features themselves. Per-dtype peaks other than fp32 count only at the row's dtype: a null
# one means the GPU has no such rate, and a kernel of that dtype is refused in one line (tested below).
FEATURE_FIELDS = ("num_sms", "boost_clock_mhz", "peak_tflops.fp32", "mem_bw_gbs", "l2_mb", "nvlink_gbs_per_dir",
                  "pcie_gbs_per_dir")

# GPUs users asked for (issue 28); A10 was already in the catalog.
NEW_GPUS = {"a10g": "NVIDIA A10G", "rtx_4090": "NVIDIA GeForce RTX 4090",
            "rtx_6000_ada": "NVIDIA RTX 6000 Ada Generation", "l20": "NVIDIA L20", "h20": "NVIDIA H20",
            "mi325x": "AMD Instinct MI325X", "mi355x": "AMD Instinct MI355X", "a10": "NVIDIA A10"}

# The numbers of every GPU the shipped η bundle was calibrated on, frozen: the models learned η against these
# rooflines and hardware features, so changing one silently shifts every prediction priced from that GPU's
# data. Change a number here only together with recalibrating (`kernelsight calibrate`) and republishing.
_FROZEN_FIELDS = ("num_sms", "boost_clock_mhz", "mem_gb", "mem_bw_gbs", "l2_mb", "smem_per_sm_kb", "tdp_w",
                  "nvlink_gbs_per_dir", "pcie_gen", "pcie_gbs_per_dir", *(f"peak_tflops.{d}" for d in DTYPES))
TRAINING_GPUS = {
    "a100_pcie": (108, 1410, 80, 1935, 40, 164, 300, 300, 4, 32, 19.5, 156, 312, 312, None, 624, None),
    "a100_pcie_40g": (108, 1410, 40, 1555, 40, 164, 250, 300, 4, 32, 19.5, 156, 312, 312, None, 624, None),
    "a100_sxm": (108, 1410, 80, 2039, 40, 164, 400, 300, 4, 32, 19.5, 156, 312, 312, None, 624, None),
    "b200_sxm": (148, 1965, 180, 7700, 126.5, 228, 1000, 900, 5, 64, 75, 1100, 2250, 2250, 4500, 4500, 9000),
    "gb200": (152, 2062, 186, 8000, 126, 228, 1200, 900, None, None, 80, 1250, 2500, 2500, 5000, 5000, 10000),
    "h100_sxm": (132, 1980, 80, 3350, 50, 228, 700, 450, 5, 64, 67, 494.7, 989.4, 989.4, 1978.9, 1978.9, None),
    "h200_sxm": (132, 1980, 141, 4800, 60, 228, 700, 450, 5, 64, 67, 494.7, 989.4, 989.4, 1978.9, 1978.9, None),
    "l4": (58, 2040, 24, 300, 48, 100, 72, 0, 4, 32, 30.3, 60, 121, 121, 242.5, 242.5, None),
    "l40s": (142, 2520, 48, 864, 96, 100, 350, 0, 4, 32, 91.6, 183, 362.05, 362.05, 733, 733, None),
    "p100_pcie": (56, 1329, 16, 732, 4, 64, 250, 0, 3, 16, 9.3, None, None, 18.7, None, None, None),
    "p4": (20, 1114, 8, 192, 2, 96, 75, 0, 3, 16, 5.5, None, None, None, None, 22, None),
    "t4": (40, 1590, 16, 320, 4, 64, 70, 0, 3, 16, 8.1, None, None, 65, None, 130, None),
    "v100_pcie": (80, 1380, 32, 900, 6, 96, 250, 0, 3, 16, 14, None, None, 112, None, None, None),
}


def _value(hw: Hardware, name: str):
    return hw.peak_tflops[name.split(".", 1)[1]] if name.startswith("peak_tflops.") else getattr(hw, name)


def _scaled(hw: Hardware, name: str, factor: float) -> Hardware:
    if name.startswith("peak_tflops."):
        dtype = name.split(".", 1)[1]
        return replace(hw, peak_tflops={**hw.peak_tflops, dtype: hw.peak_tflops[dtype] * factor})
    value = getattr(hw, name)
    return replace(hw, **{name: type(value)(value * factor) if isinstance(value, int) else value * factor})


def test_feature_fields_are_what_the_cross_tier_reads():
    """Scaling a catalog number moves some cross-tier feature exactly when it is in FEATURE_FIELDS (or the
    peak at the rows' own dtype), so the completeness test below checks the right fields."""
    hw = load_hardware("h100_sxm")
    rows = {
        "gemm": {"m": np.array([1, 64, 4096]), "n": np.array([4096] * 3), "k": np.array([4096] * 3),
                 "dtype": np.array(["bf16"] * 3, dtype=object)},
        "elementwise": {"numel": np.array([1 << 10, 1 << 24]), "op": np.array(["add", "silu"], dtype=object),
                        "dtype": np.array(["bf16"] * 2, dtype=object)},
        "allreduce": {"msg_bytes": np.array([1 << 20, 1 << 20]), "world_size": np.array([8, 8]),
                      "link": np.array(["nvlink", "pcie"], dtype=object),
                      "dtype": np.array(["bf16"] * 2, dtype=object)},
    }
    base = {family: feature_matrix(family, "cross", cols, hw) for family, cols in rows.items()}
    used = set()
    for name in DERIVABLE:
        if not _value(hw, name):
            continue  # h100 has no fp4 peak
        other = _scaled(hw, name, 1.37)
        if any(not np.array_equal(feature_matrix(family, "cross", cols, other), base[family], equal_nan=True)
               for family, cols in rows.items()):
            used.add(name)
    assert used == set(FEATURE_FIELDS) | {"peak_tflops.bf16"}


@pytest.mark.parametrize("key", list_hardware())
def test_every_feature_field_is_filled_or_its_rule_stated(key):
    """No catalog GPU has a null feature without a stated imputation: each cross-tier feature field holds a
    number, or `derived` names it; a number no public source states is marked there with its rule."""
    hw = load_hardware(key)
    unstated = [f for f in FEATURE_FIELDS if _value(hw, f) is None and f not in hw.derived]
    assert not unstated, f"{key}: null feature fields with no stated rule: {unstated}"
    for name, rule in hw.derived.items():
        assert len(rule.split()) >= 4, f"{key}: derived.{name} needs the rule, not a label: {rule!r}"
        if _value(hw, name) is None:  # a deliberately absent field says so, and why
            assert rule.startswith("absent:"), f"{key}: derived.{name} names a null field: start 'absent: why'"
    assert hw.peak_tflops["fp32"] is not None  # every family's features read it (vector kernels run on it)


def test_training_gpus_numbers_are_frozen():
    """The GPUs the shipped η bundle was calibrated on keep their numbers (see TRAINING_GPUS)."""
    for key, frozen in TRAINING_GPUS.items():
        hw = load_hardware(key)
        now = tuple(_value(hw, f) for f in _FROZEN_FIELDS)
        assert now == frozen, f"{key}: catalog numbers changed; recalibrate and republish the bundle first"
    manifest = data_dir() / "artifacts" / "default" / "manifest.json"
    if manifest.is_file():  # every calibrated GPU is frozen here
        assert set(json.loads(manifest.read_text())["devices"]) <= set(TRAINING_GPUS)


def test_derived_round_trips_from_csv_to_hardware(tmp_path):
    gb300 = load_hardware("gb300")
    assert Hardware.from_mapping(gb300.as_dict()) == gb300
    rows = {r["key"]: r for r in read_gpu_specs(SPECS_CSV)}
    assert rows["gb300"]["derived"] == gb300.derived
    assert rows["h100_sxm"]["derived"] == {} == load_hardware("h100_sxm").derived
    # files without derived values carry no `derived` key (regenerating left them as they were)
    assert "derived" not in yaml.safe_load((hardware_dir() / "h100_sxm.yaml").read_text())


@pytest.mark.parametrize("key", sorted(NEW_GPUS))
def test_new_gpus_load_resolve_and_price_a_gemm_in_the_cross_tier(key, capsys):
    from kernelsight.cli import main

    hw = load_hardware(NEW_GPUS[key])
    assert hw.key == key and hw.sources.strip()
    main(["predict", f"hardware={key}", "tier=cross", "kernel.family=gemm", "kernel.m=64", "kernel.n=4096",
          "kernel.k=4096", "kernel.dtype=bf16"])  # a refusal would exit 2
    out = capsys.readouterr().out
    assert f"on {key}" in out and "tier cross" in out and "predicted" in out


def test_a_dtype_without_a_peak_is_refused_in_one_line(capsys):
    """A null per-dtype peak means the GPU has no such rate: the cross tier refuses, naming GPU and dtype."""
    from kernelsight.cli import main

    assert load_hardware("mi355x").peak_tflops["tf32"] is None  # AMD publishes no TF32 rate for CDNA4
    with pytest.raises(SystemExit) as info:
        main(["predict", "hardware=mi355x", "tier=cross", "kernel.family=gemm", "kernel.m=64", "kernel.n=4096",
              "kernel.k=4096", "kernel.dtype=tf32"])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "mi355x" in err and "tf32" in err


# Added with a die sibling in the calibration data (priced from the sibling's own models) or without (the
# cross-device models): NVML / marketing name -> (key, the model that prices a bf16 GEMM).
MORE_GPUS = {"NVIDIA H100 NVL": ("h100_nvl", "target/h100_sxm/gemm (die sibling)"),
             "NVIDIA H800 80GB HBM3": ("h800_sxm", "target/h100_sxm/gemm (die sibling)"),
             "NVIDIA A800-SXM4-80GB": ("a800_sxm", "target/a100_sxm/gemm (die sibling)"),
             "NVIDIA L40": ("l40", "target/l40s/gemm (die sibling)"),
             "NVIDIA GeForce RTX 5090": ("rtx_5090", "cross/gemm")}


@pytest.mark.parametrize("name", sorted(MORE_GPUS))
def test_more_gpus_resolve_by_their_device_names_and_price_from_a_die_sibling_where_one_is_measured(name, capsys):
    from kernelsight.cli import main

    key, model = MORE_GPUS[name]
    hw = load_hardware(name)
    assert hw.key == key and hw.sources.strip()
    main(["predict", f"hardware={key}", "kernel.family=gemm", "kernel.m=64", "kernel.n=4096", "kernel.k=4096",
          "kernel.dtype=bf16"])
    assert f"[tier cross, model {model}]" in capsys.readouterr().out
