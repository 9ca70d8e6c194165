"""The distribution: one import package, configs, the default bundle and the traces inside a wheel of
bounded size, reference data left in the repository, and `kernelsight simulate` running from the
installed wheel alone (no checkout, no torch)."""
import configparser
import os
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MAX_WHEEL_MB = 32  # the default bundle (26 MiB: 17 families, target models of 7+ GPUs) is most of it
# Never copied into the build: build outputs (setuptools reuses a stale build/lib), caches, git.
NOT_SOURCES = shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__", ".git", ".pytest_cache",
                                     ".venv", "outputs", "multirun")


@pytest.fixture(scope="module")
def wheel_path(tmp_path_factory):
    """A wheel built from a clean copy of the working tree."""
    src = tmp_path_factory.mktemp("src") / "kernelsight"
    shutil.copytree(REPO, src, ignore=NOT_SOURCES)
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(out), str(src)], check=True, capture_output=True)
    (path,) = out.glob("kernelsight-*.whl")
    return path


@pytest.fixture(scope="module")
def wheel(wheel_path):
    return zipfile.ZipFile(wheel_path)


@pytest.fixture(scope="module")
def installed(wheel_path, tmp_path_factory):
    """The wheel installed into a folder of its own; run(args) runs its `kernelsight` entry point there with
    `python -S` (no site-packages .pth files, so the editable checkout cannot answer imports) and the
    dependencies' site-packages after it on the path."""
    target = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile", "-q", "--target",
                    str(target), str(wheel_path)], check=True, capture_output=True)
    entry = configparser.ConfigParser()
    (info,) = target.glob("kernelsight-*.dist-info")
    entry.read(info / "entry_points.txt")
    module, func = entry["console_scripts"]["kernelsight"].split(":")
    work = tmp_path_factory.mktemp("work")
    deps = [p for p in site.getsitepackages() + [site.getusersitepackages()] if Path(p).is_dir()]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), *deps]), "MPLBACKEND": "Agg",
           "KERNELSIGHT_CACHE": str(work / "cache")}

    def run(*args):
        code = (f"import sys; sys.argv = ['kernelsight', *sys.argv[1:]]; from {module} import {func}; "
                f"import kernelsight.predictor as p; assert p.__file__.startswith({str(target)!r}), p.__file__; "
                f"sys.exit({func}())")
        return subprocess.run([sys.executable, "-S", "-c", code, *args], cwd=work, env=env, capture_output=True,
                              text=True, timeout=300)

    def python(code):  # run.python(code): Python code against the installed wheel, same environment
        return subprocess.run([sys.executable, "-S", "-c", code], cwd=work, env=env, capture_output=True,
                              text=True, timeout=300)
    run.python, run.target = python, target
    return run


def test_wheel_installs_one_namespace_with_configs_and_data(wheel):
    names = wheel.namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"kernelsight"}, tops  # never generic names like `sim` in site-packages
    for sub in ("predictor", "sim", "calibrate", "microbench", "validate", "cli"):
        assert f"kernelsight/{sub}/__init__.py" in names
    assert "kernelsight/__init__.py" in names and not [n for n in names if n.startswith("api/")]  # api/ -> kernelsight
    assert "kernelsight/predictor/families/gemm.py" in names
    assert "kernelsight/conf/hardware/h100_sxm.yaml" in names
    assert "kernelsight/conf/_hydra.yaml" in names
    hardware = [n for n in names if n.startswith("kernelsight/conf/hardware/") and n.endswith(".yaml")]
    assert len(hardware) == 38 and "kernelsight/conf/hardware/gpu_specs.csv" in names  # the catalog and its source
    assert not [n for n in names if n.endswith((".pkl", ".pickle", ".joblib"))]
    assert not [n for n in names if "__pycache__" in n]


def test_wheel_ships_the_default_bundle_and_traces_but_no_reference_data(wheel, wheel_path):
    names = wheel.namelist()
    data = {n.split("/")[2] for n in names if n.startswith("kernelsight/data/") and n.count("/") > 2}
    assert data == {"artifacts", "traces", "engine"}, data  # not public/, sweeps/, validation/
    bundles = {n.split("/")[3] for n in names if n.startswith("kernelsight/data/artifacts/")}
    assert bundles == {"default", "energy.json"}, bundles  # the η bundle and the energy model
    assert "kernelsight/data/artifacts/default/manifest.json" in names
    assert any(n.startswith("kernelsight/data/traces/splitwise_conv") for n in names)
    assert "kernelsight/data/engine/vllm_custom_ar.csv" in names  # TP all-reduce priced from a wheel
    size_mb = wheel_path.stat().st_size / 2**20
    assert size_mb <= MAX_WHEEL_MB, f"wheel is {size_mb:.1f} MiB"


def test_simulate_runs_from_the_installed_wheel(installed):
    """Priced by the shipped bundle, lengths drawn from a shipped trace (data/traces)."""
    out = installed("simulate", "num_requests=20", "plots=false", "workload=splitwise_conv")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "workload splitwise_conv" in out.stdout and "Mean TTFT" in out.stdout
    assert "target: target/h100_sxm/gemm" in out.stdout  # the bundle's models, not the roofline
    assert "Energy per output token (J):" in out.stdout  # the shipped energy model
    out = installed("simulate", "num_requests=10", "plots=false", "parallel=tp2")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "vLLM all-reduce measured on h100_sxm" in out.stdout  # the shipped all-reduce rows (data/engine)


def test_python_api_runs_from_the_installed_wheel(installed):
    out = installed.python("import kernelsight; r = kernelsight.simulate(num_requests=10); "
                           "print(kernelsight.__file__, r.metrics['ttft_ms']['p50'] > 0, len(r.requests))")
    assert out.returncode == 0, out.stderr[-2000:]
    path, positive, rows = out.stdout.split()
    assert path.startswith(str(installed.target)) and positive == "True" and rows == "10"


def test_reference_data_commands_say_where_the_data_lives(installed):
    """calibrate needs data/public and data/sweeps, which only a checkout holds: one line, no traceback."""
    out = installed("calibrate", "target=h100_sxm")
    assert out.returncode != 0
    lines = (out.stdout + out.stderr).strip().splitlines()
    assert "source repository" in lines[-1] and "Traceback" not in out.stderr, out.stderr[-2000:]


@pytest.mark.parametrize("module", ["kernelsight", "kernelsight.predictor", "kernelsight.predictor.roofline",
                                    "kernelsight.predictor.sweep", "kernelsight.predictor.predict",
                                    "kernelsight.sim", "kernelsight.cli"])
def test_laptop_path_never_imports_torch(module):
    code = f"import sys, {module}; bad = [m for m in ('torch', 'triton') if m in sys.modules]; print(bad)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
