"""Package mapping: the repository's top-level folders become `kernelsight.<folder>`.

The layout is fixed by the product card (predictor/, sim/, ... at the top), but
nothing may claim generic names such as `sim` in site-packages, so each folder
is installed under the single import package `kernelsight`, whose own
__init__.py (the Python API) is api/.
"""
from pathlib import Path

from setuptools import setup

CODE = ("predictor", "sim", "calibrate", "microbench", "validate", "cli")
# The folder whose __init__.py is `kernelsight` itself (the Python API: kernelsight.simulate, ...). Not named
# kernelsight/: in a checkout that folder would shadow the installed package for `python -m pytest`.
TOP = "api"
DATA = ("conf", "data")
# What of each data folder the wheel ships (path prefixes): all of conf/; of data/ the default η bundle, the
# energy model (artifacts/energy.json) and the workload traces `simulate` reads (sim/workload.py) and the measured vLLM all-reduce (data/engine/). Reference data (data/public, sweeps, validation)
# stays in the repository; bundles built on demand go to the user cache (predictor/paths.py: cache_dir).
SHIPPED = {"conf": ("",), "data": ("artifacts/default/", "artifacts/energy.json", "traces/", "engine/")}


def _packages():
    found = []
    for top in CODE:
        for init in sorted(Path(top).rglob("__init__.py")):
            found.append("kernelsight." + ".".join(init.parent.parts))
    return ["kernelsight", *found, *(f"kernelsight.{d}" for d in DATA)]


def _data_files(top):
    files = (p.relative_to(top).as_posix() for p in Path(top).rglob("*")
             if p.is_file() and "__pycache__" not in p.parts)
    return sorted(f for f in files if f.startswith(SHIPPED[top]))


setup(
    packages=_packages(),
    package_dir={"kernelsight": TOP, **{f"kernelsight.{t}": t for t in CODE + DATA}},
    package_data={f"kernelsight.{d}": _data_files(d) for d in DATA},
    include_package_data=False,
)
