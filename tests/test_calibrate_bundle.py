"""Bundles: published byte-identically, verified on load with one clear line per problem,
and the shipped one loads without torch, scikit-learn or the calibrate package."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from kernelsight.calibrate.commands import calibrate, calibrate_publish
from kernelsight.predictor.bundle import load_bundle, sha256_file
from kernelsight.predictor.errors import KernelsightError
from kernelsight.predictor.paths import conf_dir
from kernelsight.predictor.predict import Predictor

from calibrate_synthetic import FAST_LEARNER, write_synthetic

PINNED = "2025-01-01T00:00:00Z"


def _cfg(name, **over):
    args = [f"{k}={v}" for k, v in over.items()]
    args += [f"learner.{k}={v}" for k, v in FAST_LEARNER.items()]
    with initialize_config_dir(config_dir=str(Path(conf_dir()).resolve()), version_base="1.3"):
        return compose(config_name=name, overrides=args)


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sweeps")
    write_synthetic(folder)
    return folder


@pytest.fixture(scope="module")
def bundle_dir(synthetic, tmp_path_factory):
    out = tmp_path_factory.mktemp("pub")
    cfg = _cfg("calibrate_publish", **{"data.paths": f"[{synthetic}]", "bundle": out / "b1", "out": out / "rep",
                                       "publish.created": PINNED, "evaluation.plots": "false",
                                       "evaluation.folds": 3})
    calibrate_publish(cfg)
    return out / "b1"


def test_publish_is_byte_identical_for_the_same_inputs(bundle_dir, synthetic, tmp_path):
    """Also across thread counts: the fixture fits 2 models at once (jobs default), this run 1 at a time."""
    cfg = _cfg("calibrate_publish", **{"data.paths": f"[{synthetic}]", "bundle": tmp_path / "b2",
                                       "out": tmp_path / "rep", "publish.created": PINNED,
                                       "evaluation.plots": "false", "evaluation.folds": 3, "jobs": 1})
    calibrate_publish(cfg)
    files = sorted(p.relative_to(bundle_dir) for p in bundle_dir.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(tmp_path / "b2") for p in (tmp_path / "b2").rglob("*") if p.is_file())
    for rel in files:
        assert (bundle_dir / rel).read_bytes() == (tmp_path / "b2" / rel).read_bytes(), rel


def test_uncovered_family_is_roofline_with_one_warning(bundle_dir):
    """The synthetic bundle holds GEMM models only: a MoE kernel is priced at the roofline, said once."""
    p = Predictor("h100_sxm", bundle=str(bundle_dir))
    moe = {"tokens": [64], "experts": [8], "top_k": [2], "hidden": [4096], "intermediate": [14336],
           "dtype": ["bf16"]}
    with pytest.warns(UserWarning, match="no moe model"):
        res = p.estimate("moe", moe)
    assert res["eta"][0] == 1 and res["tier"][0] == "roofline"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        p.estimate("moe", moe)  # warned once per family


def test_manifest_states_what_the_bundle_is(bundle_dir):
    b = load_bundle(bundle_dir)
    m = b.manifest
    assert m["schema_version"] == 2 and m["created"] == PINNED and m["code_version"]
    assert {d["file"] for d in m["training_data"]} == {"h100_sxm.parquet", "a100_sxm.parquet", "l40s.parquet"}
    assert all(len(d["sha256"]) == 64 for d in m["training_data"])
    assert set(m["models"]) == {"cross/gemm", "target/a100_sxm/gemm", "target/h100_sxm/gemm", "target/l40s/gemm"}
    assert m["features"]["cross"]["gemm"][-1] == "hw_clock_ghz" and "lightgbm" in m["libraries"]
    assert {r["family"] for r in m["metrics"]["headline_mape"]} == {"gemm"}
    assert not list(bundle_dir.rglob("*.pkl")) and not list(bundle_dir.rglob("*.joblib"))


def _copy(bundle_dir, tmp_path) -> Path:
    dst = tmp_path / "copy"
    shutil.copytree(bundle_dir, dst)
    return dst


def _one_line(excinfo) -> str:
    msg = str(excinfo.value)
    assert "\n" not in msg
    return msg


def test_tampered_model_text_is_a_hash_mismatch(bundle_dir, tmp_path):
    b = _copy(bundle_dir, tmp_path)
    path = b / "models/cross/gemm.txt"
    path.write_text(path.read_text().replace("leaf_value=", "leaf_value=1", 1))
    with pytest.raises(KernelsightError) as e:
        load_bundle(b)
    assert "models/cross/gemm.txt hash mismatch" in _one_line(e)


def test_missing_file_and_missing_manifest(bundle_dir, tmp_path):
    b = _copy(bundle_dir, tmp_path)
    (b / "models/target/l40s/gemm.json").unlink()
    with pytest.raises(KernelsightError) as e:
        load_bundle(b)
    assert "models/target/l40s/gemm.json is missing" in _one_line(e)
    (b / "manifest.json").unlink()
    with pytest.raises(KernelsightError, match="manifest.json is missing"):
        load_bundle(b)


def _rewrite_manifest(b: Path, change) -> None:
    m = json.loads((b / "manifest.json").read_text())
    change(m)
    (b / "manifest.json").write_text(json.dumps(m))


def test_newer_schema_and_foreign_paths_are_refused(bundle_dir, tmp_path):
    b = _copy(bundle_dir, tmp_path)
    _rewrite_manifest(b, lambda m: m.update(schema_version=99))
    with pytest.raises(KernelsightError) as e:
        load_bundle(b)
    assert "schema_version 99 is newer" in _one_line(e)
    _rewrite_manifest(b, lambda m: m.update(schema_version=1))  # before gap models: still read
    assert load_bundle(b).model("target", "gemm", "h100_sxm").target == "log eta"
    b2 = tmp_path / "b2"
    shutil.copytree(bundle_dir, b2)
    _rewrite_manifest(b2, lambda m: m["files"].update({"../outside.txt": "0" * 64}))
    with pytest.raises(KernelsightError, match="points outside the bundle"):
        load_bundle(b2)


def test_model_text_that_matches_its_hash_but_is_not_a_model_fails_in_one_line(bundle_dir, tmp_path):
    b = _copy(bundle_dir, tmp_path)
    rel = "models/target/h100_sxm/gemm.txt"
    (b / rel).write_text("tree\nversion=v4\nnum_class=banana\n")
    _rewrite_manifest(b, lambda m: m["files"].update({rel: sha256_file(b / rel)}))
    bundle = load_bundle(b)
    with pytest.raises(KernelsightError) as e:
        bundle.model("target", "gemm", "h100_sxm")
    assert "not a valid LightGBM model text" in _one_line(e)


def test_calibrate_command_writes_the_report(synthetic, tmp_path, capsys):
    cfg = _cfg("calibrate", **{"data.paths": f"[{synthetic}]", "target": "h100_sxm", "out": tmp_path / "rep",
                               "evaluation.folds": 3})
    calibrate(cfg)
    printed = capsys.readouterr().out
    assert "gemm" in printed and "REPORT.md" in printed
    report = json.loads((tmp_path / "rep" / "evaluation.json").read_text())
    splits = {r["split"] for r in report["per_split"]}
    assert "lodo h100_sxm" in splits and {"fold 0", "fold 1", "fold 2"} <= splits
    assert (tmp_path / "rep" / "parity_gemm.png").stat().st_size > 1000
    assert report["repeat_measurements"] == []  # one sweep per GPU: nothing timed twice
    assert report["other_sources"] == []  # one source per GPU: no rows off another harness's grid
    text = (tmp_path / "rep" / "REPORT.md").read_text()
    assert "## Repeat measurements" in text and "## Other sources" in text
    with pytest.raises(KernelsightError, match="target=mi300x: no calibration rows"):
        calibrate(_cfg("calibrate", **{"data.paths": f"[{synthetic}]", "target": "mi300x", "out": tmp_path}))


SHIPPED_CHECK = """
import sys
from kernelsight.predictor.predict import Predictor
p = Predictor("h100_sxm")
s = p.latency("gemm", {"m": [4096], "n": [4096], "k": [4096], "dtype": ["bf16"]})
assert s[0] > 0, s
bad = [m for m in sys.modules if m.split(".")[0] in ("torch", "sklearn", "lightgbm")
       or m.startswith("kernelsight.calibrate")]
print("LOADED", bad)
"""


def test_shipped_bundle_loads_without_torch_sklearn_or_calibrate():
    out = subprocess.run([sys.executable, "-c", SHIPPED_CHECK], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "LOADED []" in out.stdout


@pytest.mark.parametrize("override, message", [
    ("+learner.num_leafs=8", "learner.num_leafs: unknown setting; known: eta_floor"),
    ("learner.linear_tiers=[targt]", "learner.linear_tiers: 'targt' is not a tier (target, cross)"),
    ("learner.gap_tiers=[crosss]", "learner.gap_tiers: 'crosss' is not a tier (target, cross)"),
    ("jobs=0", "jobs=0: must be an integer >= 1 (models fitted at once)"),
    ("jobs=two", "jobs='two': must be an integer >= 1 (models fitted at once)"),
])
def test_bad_learner_setting_is_one_line(synthetic, tmp_path, override, message):
    key, value = override.split("=", 1)
    with initialize_config_dir(config_dir=str(Path(conf_dir()).resolve()), version_base="1.3"):
        cfg = compose(config_name="calibrate", overrides=[f"data.paths=[{synthetic}]", f"out={tmp_path}",
                                                          f"{key}={value}"])
    with pytest.raises(KernelsightError, match=message.replace("(", r"\(").replace(")", r"\)")):
        calibrate(cfg)
    assert not (tmp_path / "REPORT.md").exists()


def test_manifest_records_the_learner_it_was_fitted_with(bundle_dir):
    manifest = json.loads((bundle_dir / "manifest.json").read_text())
    assert manifest["learner"]["linear_tiers"] == ["target"] and manifest["learner"]["num_trees"] == 40
    assert manifest["learner"]["gap_tiers"] == ["cross"]
    cards = {key: json.loads((bundle_dir / entry["card"]).read_text()) for key, entry in manifest["models"].items()}
    assert cards["cross/gemm"]["learner"]["target"] == "log gap_us"
    assert cards["target/h100_sxm/gemm"]["learner"]["target"] == "log eta"
    assert manifest["rules"]["prefer_providers"]["kv_write"] == ["triton.reshape_and_cache"]
    text = (bundle_dir / manifest["models"]["target/h100_sxm/gemm"]["model"]).read_text()
    assert "is_linear=1" in text
