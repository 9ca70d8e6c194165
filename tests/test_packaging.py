"""The distribution: one import package, configs and data inside the wheel, no torch on the laptop path."""
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(out), str(REPO)], check=True, capture_output=True)
    (path,) = out.glob("kernelsight-*.whl")
    return zipfile.ZipFile(path)


def test_wheel_installs_one_namespace_with_configs_and_data(wheel):
    names = wheel.namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"kernelsight"}, tops  # never generic names like `sim` in site-packages
    for sub in ("predictor", "sim", "calibrate", "microbench"):
        assert f"kernelsight/{sub}/__init__.py" in names
    assert "kernelsight/predictor/families/gemm.py" in names
    assert "kernelsight/conf/hardware/h100_sxm.yaml" in names
    assert "kernelsight/conf/_hydra.yaml" in names
    hardware = [n for n in names if n.startswith("kernelsight/conf/hardware/") and n.endswith(".yaml")]
    assert len(hardware) == 26 and "kernelsight/conf/hardware/gpu_specs.csv" in names  # the catalog and its source
    assert any(n.startswith("kernelsight/data/public/") for n in names)
    assert any(n.startswith("kernelsight/data/artifacts/") for n in names)
    assert not [n for n in names if n.endswith((".pkl", ".pickle", ".joblib"))]
    assert not [n for n in names if "__pycache__" in n]


@pytest.mark.parametrize("module", ["kernelsight.predictor", "kernelsight.predictor.roofline",
                                    "kernelsight.predictor.sweep", "kernelsight.predictor.predict",
                                    "kernelsight.sim"])
def test_laptop_path_never_imports_torch(module):
    code = f"import sys, {module}; bad = [m for m in ('torch', 'triton') if m in sys.modules]; print(bad)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
