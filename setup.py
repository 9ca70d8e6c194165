"""Package mapping: the repository's top-level folders become `kernelsight.<folder>`.

The layout is fixed by the product card (predictor/, sim/, ... at the top), but
nothing may claim generic names such as `sim` in site-packages, so each folder
is installed under the single import package `kernelsight` (PEP 420 namespace).
"""
from pathlib import Path

from setuptools import setup

CODE = ("predictor", "sim", "calibrate", "microbench")
DATA = ("conf", "data")


def _packages():
    found = []
    for top in CODE:
        for init in sorted(Path(top).rglob("__init__.py")):
            found.append("kernelsight." + ".".join(init.parent.parts))
    return found + [f"kernelsight.{d}" for d in DATA]


def _data_files(top):
    return sorted(str(p.relative_to(top)) for p in Path(top).rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts)


setup(
    packages=_packages(),
    package_dir={f"kernelsight.{t}": t for t in CODE + DATA},
    package_data={f"kernelsight.{d}": _data_files(d) for d in DATA},
    include_package_data=False,
)
