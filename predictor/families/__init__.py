"""Registry of kernel families: every module in this package that defines FAMILIES.

Adding a family is adding one module here; nothing else lists them.
"""
from __future__ import annotations

import importlib
import pkgutil

from ..errors import KernelsightError, did_you_mean
from .base import Cost, Family, Field, Shape

REGISTRY: dict[str, Family] = {}

for _mod in sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name != "base"):
    for _fam in importlib.import_module(f"{__name__}.{_mod}").FAMILIES:
        if _fam.name in REGISTRY:
            raise RuntimeError(f"kernel family {_fam.name!r} registered twice")
        if _fam.shape is not None:
            _fam.shape.family = _fam
        REGISTRY[_fam.name] = _fam

COLLECTIVES = tuple(name for name, f in REGISTRY.items() if f.unit == "link")

# Every shape column of every family, in a stable order (the sweep schema's shape columns).
SHAPE_COLUMNS: tuple = tuple(dict.fromkeys(c for f in REGISTRY.values() for c in f.columns))


def get_family(name: str) -> Family:
    try:
        return REGISTRY[name]
    except KeyError:
        raise KernelsightError(f"unknown kernel family {name!r}{did_you_mean(name, REGISTRY)}; "
                               f"known: {', '.join(REGISTRY)}") from None


def make_shape(family: str, **params) -> Shape:
    """Build and validate a family's shape from keyword parameters."""
    fam = get_family(family)
    unknown = set(params) - set(fam.columns)
    if unknown:
        bad = sorted(unknown)[0]
        raise KernelsightError(f"{family}: unknown shape field {bad!r}{did_you_mean(bad, fam.columns)}")
    try:
        return fam.shape(**params)
    except TypeError as e:
        raise KernelsightError(f"{family}: {e}") from None


__all__ = ["REGISTRY", "COLLECTIVES", "SHAPE_COLUMNS", "Cost", "Family", "Field", "Shape",
           "get_family", "make_shape"]
