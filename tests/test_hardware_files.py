"""Hardware catalog files: bad YAML entries (and bad `derived` notes) fail with one clear line naming the file and
the field; the CSV converter round-trips the catalog, keeps hand edits and refuses bad CSV cells."""
from __future__ import annotations

import csv
from pathlib import Path

import pytest
import yaml

from kernelsight.calibrate.importers.gpu_specs import convert_gpu_specs
from kernelsight.predictor.errors import KernelsightError
from kernelsight.predictor.hardware import DTYPES, hardware_dir, load_catalog, load_hardware, load_hardware_file
from kernelsight.predictor.paths import conf_dir

SPECS_CSV = conf_dir() / "hardware" / "gpu_specs.csv"  # the catalog's source table, shipped beside it


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


@pytest.mark.parametrize("derived, field, problem", [
    ({"l2_mbb": "same die as B300"}, "derived.l2_mbb", "did you mean 'l2_mb'"),
    ({"peak_tflops.bf61": "x"}, "derived.peak_tflops.bf61", "not a catalog number field"),
    ({"name": "renamed"}, "derived.name", "not a catalog number field"),
    ({"l2_mb": ""}, "derived.l2_mb", "needs the rule"),
    ({"l2_mb": 126.5}, "derived.l2_mb", "needs the rule"),
    ("l2_mb=same die", "derived", "must be a mapping"),
])
def test_derived_validation(tmp_path, derived, field, problem):
    data = _good_entry()
    data["derived"] = derived
    message = _one_line_error(_write(tmp_path, data), field)
    assert problem in message


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


@pytest.mark.parametrize("cell, problem", [
    ("l2_mb", "must be field=rule"),
    ("l2_mb=a rule; l2_mb=another rule", "names 'l2_mb' twice"),
    ("l2_mbb=a rule", "derived.l2_mbb"),
])
def test_derived_csv_cell_errors_are_one_line(tmp_path, cell, problem):
    with SPECS_CSV.open(newline="") as handle:
        reader = csv.DictReader(handle)
        rows, columns = [r for r in reader if r["key"] == "h100_sxm"], reader.fieldnames
    rows[0]["derived"] = cell
    path = tmp_path / "specs.csv"
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    with pytest.raises(KernelsightError) as info:
        convert_gpu_specs(path, tmp_path / "out")
    assert problem in str(info.value) and "\n" not in str(info.value)
    assert not (tmp_path / "out" / "h100_sxm.yaml").exists()
