"""Bundles: published byte-identically, verified as they are read with one clear line per problem (a
tampered, redirected or missing file, an edited manifest), and the shipped one loads without torch,
scikit-learn or the calibrate package."""
from __future__ import annotations

import gzip
import hashlib
import json
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from kernelsight.cli.calibrate import calibrate, calibrate_publish
from kernelsight.calibrate.bundle import COEFF_TOLERANCE, VALUE_DECIMALS, slim_model_text
from kernelsight.calibrate.models import EtaRegressor
from kernelsight.predictor.bundle import Bundle, content_id, load_bundle, locate_bundle, sha256_file
from kernelsight.predictor.errors import KernelsightError
from kernelsight.predictor.paths import cache_dir, conf_dir, data_dir
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
        res = p.predict(moe, family="moe")
    assert res["eta"][0] == 1 and res["tier"][0] == "roofline"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        p.predict(moe, family="moe")  # warned once per family


def test_manifest_states_what_the_bundle_is(bundle_dir):
    b = load_bundle(bundle_dir)
    m = b.manifest
    assert m["schema_version"] == 3 and m["created"] == PINNED and m["code_version"]
    assert {d["file"] for d in m["training_data"]} == {"h100_sxm.parquet", "a100_sxm.parquet", "l40s.parquet"}
    assert all(len(d["sha256"]) == 64 for d in m["training_data"])
    assert set(m["models"]) == {"cross/gemm", "target/a100_sxm/gemm", "target/h100_sxm/gemm", "target/l40s/gemm"}
    assert m["features"]["cross"]["gemm"] == m["features"]["target"]["gemm"] and "lightgbm" in m["libraries"]
    assert {r["family"] for r in m["metrics"]["headline_mape"]} == {"gemm"}
    assert not list(bundle_dir.rglob("*.pkl")) and not list(bundle_dir.rglob("*.joblib"))
    assert m["content_id"] == content_id(m)


def test_model_text_is_gzipped_lightgbm_text_with_no_name_or_time(bundle_dir):
    m = json.loads((bundle_dir / "manifest.json").read_text())
    for key, entry in m["models"].items():
        raw = (bundle_dir / entry["model"]).read_bytes()
        assert entry["model"] == f"models/{key}.txt.gz"
        assert raw[:2] == b"\x1f\x8b" and raw[3] & 0x08 == 0 and raw[4:8] == b"\0\0\0\0"  # no FNAME, mtime 0
        text = gzip.decompress(raw)
        assert text.startswith(b"tree\nversion=")
        card = json.loads((bundle_dir / entry["card"]).read_text())
        assert card["text_sha256"] == hashlib.sha256(text).hexdigest()
        assert slim_model_text(text.decode(), card) == text.decode()  # rounding twice changes nothing


def test_rounding_moves_predictions_within_its_stated_bound(synthetic):
    """A linear-leaf model before and after slim_model_text, on its own training rows."""
    import lightgbm as lgb
    import numpy as np

    from kernelsight.calibrate.evaluate import build_blocks
    from kernelsight.calibrate.rows import input_files, load_rows, select, with_eta
    from kernelsight.predictor.bundle import EtaModel

    kept, _, _ = select(load_rows(input_files([synthetic])))
    block = build_blocks(with_eta(kept), 40000, 0)[("h100_sxm", "gemm")]
    fitted = EtaRegressor("gemm", "target", "h100_sxm", linear_tiers=("target",), linear_lambda=0.1,
                          **FAST_LEARNER).fit(block.x["target"], block.eta)
    params = {**fitted._lgb_params(), "verbosity": -1}
    booster = lgb.train(params, lgb.Dataset(block.x["target"], label=np.log(block.eta), params=params),
                        num_boost_round=fitted.num_trees)
    full = booster.model_to_string()
    slim = slim_model_text(full, fitted.card_)
    assert len(slim) < len(full)
    before = EtaModel(full, fitted.card_, "full").eta(block.x["target"], floor=False)[0]
    after = EtaModel(slim, fitted.card_, "slim").eta(block.x["target"], floor=False)[0]
    bound = FAST_LEARNER["num_trees"] * (0.5 * 10.0 ** -VALUE_DECIMALS + len(fitted.card_["features"]) *
                                         COEFF_TOLERANCE / 2)  # per tree: the leaf constant and every term
    assert np.max(np.abs(np.log(after / before))) <= bound


def _copy(bundle_dir, tmp_path) -> Path:
    dst = tmp_path / "copy"
    shutil.copytree(bundle_dir, dst)
    return dst


def _one_line(excinfo) -> str:
    msg = str(excinfo.value)
    assert "\n" not in msg
    return msg


def _rewrite_manifest(b: Path, change, rehash: bool = True) -> None:
    """Apply change to the manifest; rehash: then make it self-consistent, as a careful forger would (every
    file hash and content_id recomputed), so only the checks beyond those can catch the change."""
    m = json.loads((b / "manifest.json").read_text())
    change(m)
    if rehash:
        m["files"] = {rel: sha256_file(b / rel) if (b / rel).is_file() else h for rel, h in m["files"].items()}
        m["content_id"] = content_id(m)
    (b / "manifest.json").write_text(json.dumps(m))


GEMM = {"m": [4096], "n": [4096], "k": [4096], "dtype": ["bf16"]}


def test_opening_hashes_only_the_files_of_the_models_it_uses(bundle_dir, tmp_path, monkeypatch):
    b = _copy(bundle_dir, tmp_path)
    (b / "models/target/a100_sxm/gemm.txt.gz").write_bytes(b"not even gzip")  # never read below
    read = []
    original = Bundle.read
    monkeypatch.setattr(Bundle, "read", lambda self, rel, where: read.append(rel) or original(self, rel, where))
    bundle = load_bundle(b)
    assert read == []
    assert Predictor("h100_sxm", bundle=bundle).predict(GEMM, family="gemm")["seconds"][0] > 0
    assert read == ["models/target/h100_sxm/gemm.txt.gz", "models/target/h100_sxm/gemm.json"]  # tier auto: the
    # GPU's own model prices the kernel; the cross-device path's models are read when a kernel first goes that way
    assert Predictor("h100_sxm", tier="cross", bundle=bundle).predict(GEMM, family="gemm")["seconds"][0] > 0
    assert read[2:4] == ["models/cross/gemm.txt.gz", "models/cross/gemm.json"]
    with pytest.raises(KernelsightError) as e:
        bundle.model("target", "gemm", "a100_sxm")
    assert "entry target/a100_sxm/gemm: models/target/a100_sxm/gemm.txt.gz hash mismatch" in _one_line(e)
    with pytest.raises(KernelsightError, match="a100_sxm/gemm.txt.gz hash mismatch"):
        bundle.verify_files()


def test_edited_model_file_is_refused_when_loaded(bundle_dir, tmp_path):
    b = _copy(bundle_dir, tmp_path)
    path = b / "models/cross/gemm.txt.gz"
    path.write_bytes(gzip.compress(gzip.decompress(path.read_bytes()).replace(b"leaf_value=", b"leaf_value=1", 1)))
    bundle = load_bundle(b)
    with pytest.raises(KernelsightError) as e:
        bundle.model("cross", "gemm")
    msg = _one_line(e)
    assert msg.startswith(f"bundle {b}: entry cross/gemm: models/cross/gemm.txt.gz hash mismatch"), msg
    _rewrite_manifest(b, lambda m: None)  # the file's new hash written into the manifest too
    with pytest.raises(KernelsightError) as e:
        load_bundle(b).model("cross", "gemm")
    assert "entry cross/gemm: models/cross/gemm.txt.gz is not the model text its card" in _one_line(e)


def test_edited_manifest_field_is_refused_on_open(bundle_dir, tmp_path):
    b = _copy(bundle_dir, tmp_path)
    _rewrite_manifest(b, lambda m: m["metrics"]["headline_mape"][0].update(lightgbm=0.1), rehash=False)
    with pytest.raises(KernelsightError) as e:
        load_bundle(b)
    assert _one_line(e) == f"bundle {b}: manifest content_id does not match its contents: the manifest was " \
                           f"edited; re-publish the bundle"


@pytest.mark.parametrize("how", ["entry", "files", "model only"])
def test_redirected_entry_is_refused(bundle_dir, tmp_path, how):
    """target/h100_sxm/gemm made to price with the A100 model: the entry pointed at the A100 files, or the
    A100 files copied over the H100 ones, or only the model text redirected; hashes and content_id
    updated each time."""
    b = _copy(bundle_dir, tmp_path)
    h100, a100 = "models/target/h100_sxm/gemm", "models/target/a100_sxm/gemm"
    if how == "entry":
        _rewrite_manifest(b, lambda m: m["models"]["target/h100_sxm/gemm"].update(model=f"{a100}.txt.gz",
                                                                                  card=f"{a100}.json"))
    elif how == "files":
        for ext in (".txt.gz", ".json"):
            shutil.copy(b / f"{a100}{ext}", b / f"{h100}{ext}")
        _rewrite_manifest(b, lambda m: None)
    else:
        _rewrite_manifest(b, lambda m: m["models"]["target/h100_sxm/gemm"].update(model=f"{a100}.txt.gz"))
    bundle = load_bundle(b)  # consistent enough to open; the entry is caught when its model is loaded
    with pytest.raises(KernelsightError) as e:
        Predictor("h100_sxm", bundle=bundle).predict(GEMM, family="gemm")
    msg = _one_line(e)
    assert msg.startswith(f"bundle {b}: entry target/h100_sxm/gemm: "), msg
    if how == "model only":
        assert "is not the model text its card models/target/h100_sxm/gemm.json describes" in msg
    else:
        assert "describes target/a100_sxm/gemm, not target/h100_sxm/gemm" in msg
    assert bundle.model("target", "gemm", "a100_sxm").device == "a100_sxm"  # the A100 entry itself is fine


def test_entry_whose_key_and_fields_disagree_is_refused_on_open(bundle_dir, tmp_path):
    b = _copy(bundle_dir, tmp_path)
    _rewrite_manifest(b, lambda m: m["models"]["target/h100_sxm/gemm"].update(device="a100_sxm"))
    with pytest.raises(KernelsightError) as e:
        load_bundle(b)
    assert "entry target/h100_sxm/gemm says it prices target/a100_sxm/gemm" in _one_line(e)


def test_missing_file_and_missing_manifest(bundle_dir, tmp_path):
    b = _copy(bundle_dir, tmp_path)
    (b / "models/target/l40s/gemm.json").unlink()
    with pytest.raises(KernelsightError) as e:
        load_bundle(b)
    assert _one_line(e) == f"bundle {b}: models/target/l40s/gemm.json is missing"
    (b / "manifest.json").unlink()
    with pytest.raises(KernelsightError, match="manifest.json is missing"):
        load_bundle(b)


def test_newer_schema_and_foreign_paths_are_refused(bundle_dir, tmp_path):
    b = _copy(bundle_dir, tmp_path)
    _rewrite_manifest(b, lambda m: m.update(schema_version=99))
    with pytest.raises(KernelsightError) as e:
        load_bundle(b)
    assert "schema_version 99 is newer" in _one_line(e)
    _rewrite_manifest(b, lambda m: m.update(schema_version=3))
    _rewrite_manifest(b, lambda m: m["files"].update({"../outside.txt": "0" * 64}))
    with pytest.raises(KernelsightError, match="points outside the bundle"):
        load_bundle(b)



@pytest.mark.parametrize("rel", ["models/leak.json", "models/away/outside.json", "models/inside/../../../outside.json"])
def test_file_entry_that_resolves_outside_the_bundle_is_refused(bundle_dir, tmp_path, rel):
    """A listed file reached through a symlink (the file's own, or a folder's) or '..' that leads out of the
    bundle, its hash in the manifest as a careful forger would write it; a symlink that stays inside is fine."""
    b = _copy(bundle_dir, tmp_path)
    (tmp_path / "outside.json").write_text("{}")
    (b / "models" / "leak.json").symlink_to(tmp_path / "outside.json")
    (b / "models" / "away").symlink_to(tmp_path, target_is_directory=True)
    (b / "models" / "inside").symlink_to(b / "models" / "cross", target_is_directory=True)
    _rewrite_manifest(b, lambda m: m["files"].update({rel: "0" * 64}))
    with pytest.raises(KernelsightError) as e:
        load_bundle(b)
    assert _one_line(e) == f"bundle {b}: file entry {rel!r} points outside the bundle"
    _rewrite_manifest(b, lambda m: m["files"].pop(rel) and m["files"].update({"models/inside/gemm.json": "0"}))
    load_bundle(b)

def test_schema_2_bundles_are_still_read(bundle_dir, tmp_path):
    """Before schema 3 content_id covered the file list and training data only, and cards had no text hash."""
    b = _copy(bundle_dir, tmp_path)

    def older(m):
        m["schema_version"] = 2
        m["content_id"] = content_id(m)  # the schema-2 form

    _rewrite_manifest(b, older, rehash=False)
    assert load_bundle(b).model("target", "gemm", "h100_sxm").target == "log eta"


def test_model_text_that_matches_its_hashes_but_is_not_a_model_fails_in_one_line(bundle_dir, tmp_path):
    b = _copy(bundle_dir, tmp_path)
    rel, card = "models/target/h100_sxm/gemm.txt.gz", b / "models/target/h100_sxm/gemm.json"
    text = b"tree\nversion=v4\nnum_class=banana\n"
    (b / rel).write_bytes(gzip.compress(text))
    card.write_text(json.dumps({**json.loads(card.read_text()), "text_sha256": hashlib.sha256(text).hexdigest()}))
    _rewrite_manifest(b, lambda m: None)
    bundle = load_bundle(b)
    with pytest.raises(KernelsightError) as e:
        bundle.model("target", "gemm", "h100_sxm")
    assert "not a valid LightGBM model text" in _one_line(e)


def test_cache_dir_and_bundle_names(monkeypatch, tmp_path):
    monkeypatch.setenv("KERNELSIGHT_CACHE", str(tmp_path / "ks"))
    assert cache_dir() == tmp_path / "ks"
    monkeypatch.delenv("KERNELSIGHT_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "kernelsight"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "kernelsight"
    monkeypatch.setenv("KERNELSIGHT_CACHE", str(tmp_path / "ks"))
    assert locate_bundle("default") == data_dir() / "artifacts" / "default"  # shipped first
    assert locate_bundle("my_cross") == tmp_path / "ks" / "bundles" / "my_cross"  # built on demand: the cache
    assert locate_bundle(str(tmp_path / "mine")) == tmp_path / "mine"  # a directory, as given
    assert locate_bundle("./my_cross") == Path("my_cross")
    with pytest.raises(KernelsightError, match=r"bundle .*ks/bundles/absent: no such directory"):
        load_bundle("absent")


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
s = p.predict({"m": [4096], "n": [4096], "k": [4096], "dtype": ["bf16"]}, family="gemm")["seconds"]
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
    ("+learner.num_leafs=8", "learner.num_leafs: unknown setting (did you mean 'num_leaves'?); known: eta_floor"),
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
    with pytest.raises(KernelsightError, match=re.escape(message)):
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
    text = gzip.decompress((bundle_dir / manifest["models"]["target/h100_sxm/gemm"]["model"]).read_bytes())
    assert b"is_linear=1" in text


def test_a_one_leaf_tree_is_kept_as_it_is():
    """A tree without splits (a constant block of rows) has empty split lists: rounding leaves them alone."""
    text = ("tree\nversion=v4\nfeature_names=a\n\nTree=0\nnum_leaves=1\nnum_cat=0\nsplit_feature=\n"
            "threshold=\ndecision_type=\nleft_child=\nright_child=\nleaf_value=0.123456789\n"
            "is_linear=0\nshrinkage=1\n\n\nend of trees\n")
    card = {"features": ["a"], "ranges": {"a": [0.0, 1.0]}, "categories": {}}
    slim = slim_model_text(text, card)
    assert "threshold=\n" in slim and "leaf_value=0.123457\n" in slim
