"""Typed reading of a Hugging Face config.json (or a ModelOpt hf_quant_config.json): one field at a time,
checked as a schema Spec kind, every problem one line naming the file and the dotted field."""
from __future__ import annotations

from typing import Any, Mapping

from kernelsight.predictor.errors import KernelsightError

from .schema import Spec, field_value

_REQUIRED = object()


class HfReader:
    """Typed fields of one (possibly nested) HF config mapping; messages name `source` and prefix + key."""

    def __init__(self, config: Mapping, source: str, prefix: str = ""):
        self.config, self.source, self.prefix = config, source, prefix

    def __call__(self, key: str, kind: str, default: Any = _REQUIRED) -> Any:
        return _field(self.config, key, kind, self.source, default, self.prefix)

    def raw(self, key: str) -> Any:
        return self.config.get(key)

    def section(self, key: str) -> "HfReader | None":
        value = _section(self.config, key, self.source, self.prefix)
        return None if value is None else HfReader(value, self.source, f"{self.prefix}{key}.")

    def strings(self, key: str) -> list[str]:
        """A list of strings, or [] when absent or null."""
        value = self.config.get(key)
        if value is None:
            return []
        if isinstance(value, str) or not isinstance(value, (list, tuple)) or \
                not all(isinstance(x, str) for x in value):
            raise KernelsightError(f"{self.source}: field {self.prefix + key!r} = {value!r}: must be a list of "
                                   f"strings")
        return list(value)

    def fail(self, key: str, why: str):
        value = self.config.get(key)
        raise KernelsightError(f"{self.source}: field {self.prefix + key!r} = {value!r}: {why}")


def _field(config: Mapping, key: str, kind: str, source: str, default: Any = _REQUIRED, prefix: str = "") -> Any:
    """config[key] checked as a schema Spec kind ('pos', 'nonneg', 'number', 'positive', 'bool', 'str');
    absent or null gives `default` (vLLM reads null as unset), or 'missing field' when it is required.
    prefix: the enclosing section in messages ('rope_scaling.')."""
    value = config.get(key)
    if value is None:
        if default is _REQUIRED:
            raise KernelsightError(f"{source}: missing field {prefix + key!r}")
        return default
    return field_value(value, Spec(kind), source, prefix + key)


def _section(config: Mapping, key: str, source: str, prefix: str = "") -> Mapping | None:
    """A nested mapping (quantization_config, rope_scaling), or None when absent or null."""
    value = config.get(key)
    if value is not None and not isinstance(value, Mapping):
        raise KernelsightError(f"{source}: field {prefix + key!r} = {value!r}: must be a mapping or null")
    return value or None
