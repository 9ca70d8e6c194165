"""Typed reading of the simulator's YAML configs (model, parallel, engine profile).

Every config is a flat or nested mapping checked against a field table; a
problem becomes ONE KernelsightError line naming the file (or Hydra group) and
the dotted field, so `kernelsight simulate model=...` never shows a traceback
for a bad config. Works on plain dicts and on any other nested mapping.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from kernelsight.predictor.errors import KernelsightError, did_you_mean
from kernelsight.predictor.paths import conf_dir, read_yaml

_MISSING = object()


@dataclass(frozen=True)
class Spec:
    """One config field.

    kind: 'pos' (integer >= 1), 'nonneg' (integer >= 0), 'number' (finite,
    >= 0), 'positive' (finite, > 0), 'fraction' (0 < x <= 1), 'real' (finite, any
    sign), 'bool', 'str', 'choice' (one of `choices`), 'ints' (list of integers
    >= 1), 'pos_or_auto' ('pos', or the string 'auto', read as None), 'section' (nested mapping
    checked against `fields`), 'optional_section' (the same, or null).
    default: used when the key is absent; no default means required.
    """

    kind: str
    default: Any = _MISSING
    choices: tuple = ()
    fields: Mapping[str, "Spec"] | None = None
    nullable: bool = False


def plain(node: Any) -> Any:
    """Nested mappings and sequences of any kind (a config framework's nodes included) as dicts and lists;
    dicts, lists, tuples and scalars keep their type."""
    if isinstance(node, Mapping):
        return {key: plain(value) for key, value in node.items()}
    if isinstance(node, (list, tuple)):
        return type(node)(plain(value) for value in node)
    if isinstance(node, Sequence) and not isinstance(node, (str, bytes)):
        return [plain(value) for value in node]
    return node


def check(data: Any, fields: Mapping[str, Spec], source: str, prefix: str = "") -> dict:
    """Validated plain dict of `data` against `fields` (defaults filled in)."""
    data = plain(data)
    if not isinstance(data, Mapping):
        raise KernelsightError(f"{source}: expected a mapping{_at(prefix)}, got {type(data).__name__}")
    for key in data:
        if key not in fields:
            raise KernelsightError(f"{source}: unknown field {prefix + str(key)!r}"
                                   f"{did_you_mean(str(key), fields)}; known: {', '.join(fields)}")
    out = {}
    for name, spec in fields.items():
        full = prefix + name
        if name not in data:
            if spec.default is _MISSING:
                raise KernelsightError(f"{source}: missing field {full!r}")
            out[name] = spec.default
            continue
        out[name] = field_value(data[name], spec, source, full)
    return out


def _at(prefix: str) -> str:
    return f" at {prefix.rstrip('.')!r}" if prefix else ""


def field_value(value: Any, spec: Spec, source: str, full: str) -> Any:
    """One value checked against its Spec (for readers of other formats, e.g. an HF config.json);
    a problem is one line naming `source` and the field `full`."""

    def fail(why: str):
        raise KernelsightError(f"{source}: field {full!r} = {value!r}: {why}")

    if value is None:
        if spec.nullable or spec.kind == "optional_section":
            return None
        fail("must not be null")
    kind = spec.kind
    if kind == "pos_or_auto":
        if value == "auto":
            return None
        kind = "pos"
    if kind in ("pos", "nonneg"):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or value != int(value):
            fail("must be an integer" + (" or 'auto'" if spec.kind == "pos_or_auto" else ""))
        lo = 1 if kind == "pos" else 0
        if value < lo:
            fail(f"must be >= {lo}")
        return int(value)
    if kind in ("number", "positive", "fraction", "real"):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            fail("must be a finite number")
        if kind == "real":
            return float(value)
        if kind == "fraction" and not 0 < value <= 1:
            fail("must be in (0, 1]")
        if kind == "positive" and value <= 0:
            fail("must be > 0")
        if value < 0:
            fail("must be >= 0")
        return float(value)
    if kind == "bool":
        if not isinstance(value, bool):
            fail("must be true or false")
        return value
    if kind == "str":
        if not isinstance(value, str) or not value.strip():
            fail("must be a non-empty string")
        return value
    if kind == "choice":
        if value not in spec.choices:
            fail(f"must be one of {list(spec.choices)}{did_you_mean(str(value), spec.choices)}")
        return value
    if kind == "ints":
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)) or not value:
            fail("must be a non-empty list of integers")
        for x in value:
            if isinstance(x, bool) or not isinstance(x, int) or x < 1:
                fail(f"entry {x!r} must be an integer >= 1")
        return tuple(int(x) for x in value)
    if kind in ("section", "optional_section"):
        return check(value, spec.fields, source, prefix=full + ".")
    raise ValueError(f"unknown spec kind {kind!r}")  # a bug in a field table, not user input


def load_config(cls, group: str, what: str, name_or_mapping):
    """A typed config (cls.from_mapping) by shipped name (conf/<group>/<name>.yaml), a .yaml path,
    or an already-composed mapping (Hydra's cfg.<group>); an unknown name suggests the closest."""
    if isinstance(name_or_mapping, cls):
        return name_or_mapping
    if not isinstance(name_or_mapping, (str, Path)):
        return cls.from_mapping(plain(name_or_mapping), f"{group} config")
    path = Path(name_or_mapping)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        return cls.from_mapping(read_yaml(path, group), str(path))
    name = str(name_or_mapping)
    directory = conf_dir() / group
    candidate = directory / f"{name}.yaml"
    if candidate.is_file():
        return cls.from_mapping(read_yaml(candidate, group), f"conf/{group}/{name}.yaml")
    known = sorted(p.stem for p in directory.glob("*.yaml"))
    raise KernelsightError(f"unknown {what} {name!r}{did_you_mean(name, known)}: not a file and not in "
                           f"conf/{group}; available: {', '.join(known)}")
