"""Where the shipped configs and data live, installed or in a source checkout.

conf/ and data/ are installed as the namespace packages `kernelsight.conf` and
`kernelsight.data` (no __init__.py), so callers must not hard-code repository
paths: a wheel puts them in site-packages, an editable install maps them back
to the checkout.
"""
from __future__ import annotations

import importlib.util
from functools import lru_cache
from importlib.resources import files
from pathlib import Path

from kernelsight.predictor.errors import KernelsightError

_REPO_ROOT = Path(__file__).resolve().parents[1]


def _package_dir(package: str, folder: str) -> Path:
    """A real directory for `package`, whatever importer installed it.

    importlib.resources.files() returns a plain Path for a normal package but a
    MultiplexedPath (or fails outright: setuptools' editable finder puts a
    placeholder entry in the namespace __path__) for namespace packages, so fall
    back to the spec's search locations, then to the source-checkout layout.
    """
    try:
        found = files(package)
        if isinstance(found, Path) and found.is_dir():
            return found
    except (ModuleNotFoundError, NotADirectoryError, TypeError, ValueError):
        pass
    try:
        spec = importlib.util.find_spec(package)
    except (ModuleNotFoundError, ValueError):
        spec = None
    if spec is not None:
        for location in spec.submodule_search_locations or ():
            candidate = Path(location)
            if candidate.is_dir():
                return candidate
    candidate = _REPO_ROOT / folder
    if candidate.is_dir():
        return candidate
    raise KernelsightError(f"cannot locate the {folder}/ directory: package {package!r} is not installed "
                           f"and {candidate} does not exist")


@lru_cache(maxsize=None)
def conf_dir() -> Path:
    """The Hydra config root (conf/), e.g. conf_dir() / 'hardware' / 'h100_sxm.yaml'."""
    return _package_dir("kernelsight.conf", "conf")


@lru_cache(maxsize=None)
def data_dir() -> Path:
    """The committed data root (data/: sweeps/, public/, artifacts/, validation/)."""
    return _package_dir("kernelsight.data", "data")
