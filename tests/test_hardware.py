"""Hardware catalog: every shipped entry loads, names resolve, bad files fail with one clear line."""
from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
import yaml

from kernelsight.calibrate.importers.gpu_specs import convert_gpu_specs
from kernelsight.predictor.errors import KernelsightError
from kernelsight.predictor.hardware import (
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


def _good_entry() -> dict:
    return yaml.safe_load((hardware_dir() / "h100_sxm.yaml").read_text())


def _write(tmp_path: Path, data, name: str = "h100_sxm.yaml") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path


def _one_line_error(path: Path, field: str) -> str:
    with pytest.raises(KernelsightError) as info:
        load_hardware_file(path)
    message = str(info.value)
    assert "\n" not in message
    assert path.name in message
    assert field in message
    return message


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


def test_catalog_has_26_entries():
    keys = list_hardware()
    assert len(keys) == 26 == len(_files())
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
    assert math.isnan(load_hardware("gb300").l2_bytes)
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
    with pytest.raises(KernelsightError) as info:
        load_hardware("a100_sxm").peak_flops("fp8")
    message = str(info.value)
    assert "a100_sxm" in message and "fp8" in message and "bf16" in message
    with pytest.raises(KernelsightError, match="unknown dtype"):
        load_hardware("h100_sxm").peak_flops("fp7")


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


def test_did_you_mean_on_typo():
    with pytest.raises(KernelsightError) as info:
        resolve_device("h10O")
    assert str(info.value) == "unknown GPU 'h10O': did you mean 'h100_sxm'?"
    with pytest.raises(KernelsightError, match="unknown GPU"):
        load_hardware("not-a-gpu-at-all")


@pytest.mark.parametrize("name, message", [
    # the start of a few entries' names or aliases: all of them, each once (H100 has several aliases)
    ("NVIDIA H100", "unknown GPU 'NVIDIA H100': did you mean 'h100_pcie' or 'h100_sxm'?"),
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


# ---------------------------------------------------------------- bad files


def test_good_copy_loads(tmp_path):
    assert load_hardware_file(_write(tmp_path, _good_entry())) == load_hardware("h100_sxm")


def test_unknown_key(tmp_path):
    data = _good_entry()
    data["num_smz"] = 132
    message = _one_line_error(_write(tmp_path, data), "num_smz")
    assert "did you mean 'num_sms'" in message


def test_unknown_dtype_in_peaks(tmp_path):
    data = _good_entry()
    data["peak_tflops"]["bf61"] = 1.0
    _one_line_error(_write(tmp_path, data), "peak_tflops.bf61")


def test_missing_field(tmp_path):
    data = _good_entry()
    del data["mem_bw_gbs"]
    message = _one_line_error(_write(tmp_path, data), "mem_bw_gbs")
    assert "missing" in message


def test_negative_value(tmp_path):
    data = _good_entry()
    data["num_sms"] = -132
    message = _one_line_error(_write(tmp_path, data), "num_sms")
    assert "negative" in message


@pytest.mark.parametrize("field, value", [
    ("num_sms", 13200),
    ("mem_bw_gbs", 3.35e12),
    ("mem_gb", 80000),
    ("boost_clock_mhz", 1.98),
    ("peak_tflops.bf16", 989.4e12),
])
def test_absurd_value(tmp_path, field, value):
    data = _good_entry()
    if "." in field:
        outer, inner = field.split(".")
        data[outer][inner] = value
    else:
        data[field] = value
    message = _one_line_error(_write(tmp_path, data), field)
    assert "range" in message


@pytest.mark.parametrize("field, value", [
    ("num_sms", "132"),
    ("num_sms", True),
    ("mem_bw_gbs", [3350]),
    ("compute_capability", 9.0),
    ("aliases", "h100"),
    ("peak_tflops", 989.4),
])
def test_wrong_type(tmp_path, field, value):
    data = _good_entry()
    data[field] = value
    message = _one_line_error(_write(tmp_path, data), field)
    assert "must be" in message


def test_null_in_required_field(tmp_path):
    data = _good_entry()
    data["mem_bw_gbs"] = None
    _one_line_error(_write(tmp_path, data), "mem_bw_gbs")


def test_malformed_yaml(tmp_path):
    text = (hardware_dir() / "h100_sxm.yaml").read_text().replace("num_sms: 132", "num_sms: [132")
    message = _one_line_error(_write(tmp_path, text), "num_sms")
    assert "malformed YAML" in message and "line" in message


def test_top_level_not_a_mapping(tmp_path):
    with pytest.raises(KernelsightError) as info:
        load_hardware_file(_write(tmp_path, "- just\n- a list\n"))
    assert "\n" not in str(info.value) and "h100_sxm.yaml" in str(info.value)


def test_key_file_name_mismatch(tmp_path):
    message = _one_line_error(_write(tmp_path, _good_entry(), name="h100_pcie.yaml"), "key")
    assert "h100_sxm" in message


def test_duplicate_alias_across_files(tmp_path):
    first = _good_entry()
    second = yaml.safe_load((hardware_dir() / "h200_sxm.yaml").read_text())
    second["aliases"] = [*second["aliases"], "H100"]  # same as 'h100' after normalization
    path_a = _write(tmp_path, first, "h100_sxm.yaml")
    path_b = _write(tmp_path, second, "h200_sxm.yaml")
    load_hardware_file(path_b)  # each file alone is fine
    with pytest.raises(KernelsightError) as info:
        load_catalog(tmp_path)
    message = str(info.value)
    assert "\n" not in message
    assert path_a.name in message and path_b.name in message and "aliases" in message


def test_duplicate_alias_within_file(tmp_path):
    data = _good_entry()
    data["aliases"] = ["h100", "H-100"]
    _one_line_error(_write(tmp_path, data), "aliases")


# ------------------------------------------------------------------ converter


def _csv_from_catalog(path: Path, keys: list[str]) -> Path:
    columns = ["key", "name", "vendor", "arch", "compute_capability", "num_sms", "boost_clock_mhz",
               "fp32_tflops", "tf32_tflops_dense", "bf16_tflops_dense", "fp16_tflops_dense",
               "fp8_tflops_dense", "int8_tops_dense", "fp4_tflops_dense", "mem_type", "mem_gb", "mem_bw_gbs",
               "l2_mb", "smem_per_sm_kb", "tdp_w", "nvlink_gbs_per_dir", "pcie_gen", "pcie_gbs_per_dir"]
    peak_cols = dict(zip(DTYPES, columns[7:14]))
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        for key in keys:
            d = load_hardware(key).as_dict()
            row = {c: d.get(c) for c in columns if c in d}
            row.update({peak_cols[t]: v for t, v in d["peak_tflops"].items()})
            row["mem_type"] = "HBM"
            writer.writerow({c: "" if row.get(c) is None else row[c] for c in columns})
    return path


def test_converter_roundtrip_keeps_hand_edits(tmp_path):
    csv_path = _csv_from_catalog(tmp_path / "specs.csv", ["h100_sxm", "mi250"])
    out = tmp_path / "hardware"
    written = convert_gpu_specs(csv_path, out)
    assert [p.name for p in written] == ["h100_sxm.yaml", "mi250.yaml"]
    assert sorted(p.name for p in out.iterdir()) == ["h100_sxm.yaml", "mi250.yaml"]  # no temp files left
    assert load_hardware_file(written[0]) == load_hardware("h100_sxm")

    edited = yaml.safe_load(written[0].read_text())
    edited["aliases"] = ["my lab h100"]
    edited["sources"] = "hand-written note"
    written[0].write_text(yaml.safe_dump(edited, sort_keys=False))
    convert_gpu_specs(csv_path, out)
    again = load_hardware_file(written[0])
    assert again.aliases == ("my lab h100",) and again.sources == "hand-written note"
    assert again.peak_tflops == load_hardware("h100_sxm").peak_tflops


def test_hardware_is_frozen_and_hashable():
    hw = load_hardware("h100_sxm")
    with pytest.raises(AttributeError):
        hw.num_sms = 1  # type: ignore[misc]
    assert {hw: 1}[load_hardware("NVIDIA H100 80GB HBM3")] == 1
    assert isinstance(hw, Hardware)
