"""Where the shipped configs and data live, installed or in a source checkout.

conf/ and data/ are installed as the namespace packages `kernelsight.conf` and
`kernelsight.data` (no __init__.py), so callers must not hard-code repository
paths: a wheel puts them in site-packages, an editable install maps them back
to the checkout.
"""
from __future__ import annotations

import importlib.util
import os
import re
from functools import lru_cache
from importlib.resources import files
from pathlib import Path
from typing import Any

import yaml

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


def reference_data(*parts: str, what: str = "this command") -> Path:
    """A folder or file under data/ that only a source checkout holds (data/public, data/sweeps,
    data/validation), or one line saying where that data lives when the installed package lacks it."""
    path = data_dir().joinpath(*parts)
    if not path.exists():
        rel = "/".join(("data", *parts))
        raise KernelsightError(f"{what} needs {rel}, which is not installed with the package: the reference "
                               f"data lives in the kernelsight source repository; run it from a checkout "
                               f"(pip install -e .)")
    return path


def cache_dir() -> Path:
    """Where kernelsight keeps what it builds on demand (bundles/<name>, ...): $KERNELSIGHT_CACHE, else
    $XDG_CACHE_HOME/kernelsight, else ~/.cache/kernelsight. Never inside the installed package, which may
    be read-only and is replaced on upgrade. Not created here."""
    explicit = os.environ.get("KERNELSIGHT_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
    return base / "kernelsight"


# libyaml's safe loader where PyYAML was built with it (several times faster than the pure-Python one).
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_yaml(path: str | Path, what: str) -> Any:
    """Parsed YAML of a config file; unreadable, malformed or empty files are one-line errors
    (malformed ones name the line, column and the field on that line)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise KernelsightError(f"{path}: cannot read {what} file: {exc.strerror or exc}") from None
    try:
        data = yaml.load(text, Loader=YAML_LOADER)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "context_mark", None) or getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or type(exc).__name__
        where, near = "", ""
        if mark is not None:
            where = f" at line {mark.line + 1}, column {mark.column + 1}"
            lines = text.splitlines()
            if 0 <= mark.line < len(lines):
                m = re.match(r"\s*([A-Za-z_][\w.]*)\s*:", lines[mark.line])
                if m:
                    near = f" (field {m.group(1)!r})"
        raise KernelsightError(f"{path}: malformed YAML{where}{near}: {problem}".replace("\n", " ")) from None
    if data is None:
        raise KernelsightError(f"{path}: file is empty; expected a mapping of {what} fields")
    return data
