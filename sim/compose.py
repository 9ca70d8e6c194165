"""A simulation's configuration as plain mappings, composed from conf/ without Hydra, and run.

`kernelsight simulate` composes conf/simulate.yaml with Hydra; `kernelsight.simulate`
(notebooks, scripts) composes the same files here: the primary config's
settings, one file per config group (model, hardware, engine, workload,
parallel), then dotted overrides with the command line's keys. Both then go
through typed_configs and run_config, so a composed mapping becomes typed
configs and a run one way only, whichever front end composed it.

Override rules (compose): a dotted key names a setting as on the command line
(`workload.request_rate`, `slo.ttft_ms`, `router`). Settings of the primary
config must exist (a typo is an error with a did-you-mean); fields inside a
group are checked by the group's typed config, which also accepts fields a file
leaves at their default. A mapping value merges into a mapping key by key, as
Hydra merges.
"""
from __future__ import annotations

from dataclasses import is_dataclass
from pathlib import Path
from typing import Any, Mapping

from kernelsight.predictor.errors import KernelsightError, did_you_mean
from kernelsight.predictor.hardware import Hardware, resolve_device
from kernelsight.predictor.paths import conf_dir, read_yaml

from .engine_profile import EngineProfile
from .model import ModelConfig, load_hf_config
from .parallel import ParallelConfig
from .run import SimulationResult, simulate
from .schema import plain
from .workload import WorkloadConfig

GROUPS = {"model": ModelConfig, "hardware": Hardware, "engine": EngineProfile, "workload": WorkloadConfig,
          "parallel": ParallelConfig}
# Settings of the command's own printing and files: the CLI handles them, a library run has no use for them.
COMMAND_ONLY = ("plots", "results_table", "quiet")


def primary(command: str = "simulate") -> tuple[dict, dict]:
    """(settings, group defaults) of conf/<command>.yaml: its own keys without Hydra's, and group -> the
    default choice its `defaults` list names."""
    raw = read_yaml(conf_dir() / f"{command}.yaml", command)
    defaults = {}
    for entry in raw.get("defaults") or ():
        if isinstance(entry, Mapping):
            defaults.update({str(k): v for k, v in entry.items() if str(k) in GROUPS})
    return {k: v for k, v in raw.items() if k not in ("defaults", "hydra")}, defaults


def group_config(group: str, value: Any) -> tuple[Any, str]:
    """(config, where it came from) of one group choice: a name in conf/<group>/ (for hardware also a GPU
    alias), a .yaml path, for model a HF config.json (or its folder), a mapping (copied), or a typed config
    (kept as it is)."""
    cls = GROUPS[group]
    if isinstance(value, cls):
        return value, f"{group} config"
    if isinstance(value, Mapping):
        return plain(value), f"{group} mapping"
    if not isinstance(value, (str, Path)) or not str(value):
        raise KernelsightError(f"{group}={value!r}: expected a name of conf/{group}/, a file, a mapping or a "
                               f"{cls.__name__}")
    path = Path(value)
    if group == "model" and (path.suffix == ".json" or (path / "config.json").is_file()) and path.exists():
        return load_hf_config(path / "config.json" if path.is_dir() else path), str(path)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        return read_yaml(path, group), str(path)
    directory = conf_dir() / group
    name = str(value)
    if group == "hardware" and not (directory / f"{name}.yaml").is_file():
        name = resolve_device(name)  # a GPU alias or device name; an unknown one says what it resembles
    candidate = directory / f"{name}.yaml"
    if candidate.is_file():
        return read_yaml(candidate, group), f"conf/{group}/{name}.yaml"
    choices = sorted(p.stem for p in directory.glob("*.yaml"))
    raise KernelsightError(f"{group}={name}: no such config in conf/{group}{did_you_mean(name, choices)}; "
                           f"available: {', '.join(choices)}")


def compose(groups: Mapping[str, Any] | None = None, overrides: Mapping[str, Any] | None = None,
            command: str = "simulate") -> tuple[dict, dict]:
    """(config, sources) as Hydra would compose conf/<command>.yaml: the primary's settings, each group's
    config (groups: group -> choice, see group_config; absent: the primary's default), then `overrides`
    (dotted key -> value, applied in order). sources: group -> where its config came from, for errors."""
    cfg, defaults = primary(command)
    sources = {}
    for group, default in defaults.items():
        choice = (groups or {}).get(group)
        cfg[group], sources[group] = group_config(group, default if choice is None else choice)
    unknown = [g for g in groups or () if g not in defaults]
    if unknown:
        raise KernelsightError(f"{unknown[0]}: not a config group of {command}; groups: {', '.join(defaults)}")
    for key, value in (overrides or {}).items():
        override(cfg, str(key), value)
    return cfg, sources


def override(cfg: dict, key: str, value: Any) -> None:
    """Set dotted `key` of a composed config (see the module docstring for what is checked)."""
    parts = key.split(".")
    node, path = cfg, []
    for part in parts[:-1]:
        path.append(part)
        node = _child(node, part, path, cfg)
    last = parts[-1]
    if not isinstance(node, dict):
        raise KernelsightError(f"{key}: {'.'.join(path)} is {_what(node)}, not a section of settings")
    in_group = parts[0] in GROUPS and len(parts) > 1
    if last not in node and not in_group:
        _unknown(key, last, node)
    if isinstance(value, Mapping) and isinstance(node.get(last), dict):
        for sub, item in value.items():
            override(cfg, f"{key}.{sub}", item)
    else:
        node[last] = plain(value)


def _child(node: Any, part: str, path: list, cfg: dict) -> Any:
    where = ".".join(path)
    if not isinstance(node, dict):
        raise KernelsightError(f"{where}: {'.'.join(path[:-1])} is {_what(node)}, not a section of settings")
    if part not in node:
        if path[0] in GROUPS and len(path) > 1:
            node[part] = {}  # a group field the file leaves at its default; its typed config checks it
        else:
            _unknown(where, part, node)
    return node[part]


def _what(node: Any) -> str:
    if is_dataclass(node):
        return f"a {type(node).__name__} object (pass a name or a mapping to override its fields)"
    return f"{node!r}"


def _unknown(key: str, part: str, node: dict) -> None:
    raise KernelsightError(f"{key}: unknown setting{did_you_mean(part, node)}; known here: "
                           f"{', '.join(map(str, node))}")


def typed_configs(cfg: Mapping, sources: Mapping | None = None) -> tuple[ModelConfig, Hardware, EngineProfile,
                                                                          ParallelConfig]:
    """(model, hardware on the layout's scale-out network, engine, parallel) of a composed config, each
    validated with its file named (sources: group -> file; typed configs pass through)."""
    sources = sources or {}

    def typed(group: str):
        cls, value = GROUPS[group], cfg[group]
        if isinstance(value, cls):
            return value
        source = sources.get(group, f"{group} config")
        try:
            return cls.from_mapping(plain(value), source)
        except KernelsightError as exc:
            if source == f"{group} mapping" and "missing field" in str(exc):  # a partial mapping given as the group
                raise KernelsightError(f"{exc}; a mapping passed as {group}= is the whole group config: to change "
                                       f"fields of a shipped one, pass them as overrides, e.g. "
                                       f"**{{'{group}.{next(iter(value), 'field')}': ...}}") from None
            raise

    parallel = typed("parallel")
    return typed("model"), typed("hardware").on_network(parallel.net_gbs_per_gpu), typed("engine"), parallel


def workload_config(cfg: Mapping) -> WorkloadConfig:
    """The composed config's workload, typed and checked."""
    value = cfg["workload"]
    return value if isinstance(value, WorkloadConfig) else WorkloadConfig.from_config(plain(value))


def run_config(cfg: Mapping, sources: Mapping | None = None, *, out_dir: Path | None = None,
               keep_requests: bool = False, progress=None) -> SimulationResult:
    """Simulate a composed conf/simulate.yaml config (Hydra's, as plain values, or compose's).

    out_dir: also write the run's tables and trace there (sim.run). keep_requests: keep the per-request
    table in memory. progress: a tqdm-like factory for a bar over finished requests (sim.run.run)."""
    model, hw, engine, parallel = typed_configs(cfg, sources)
    predictor = cfg.get("predictor") or {}
    return simulate(model, hw, engine, parallel, workload_config(cfg), num_requests=cfg.get("num_requests"),
                    seed=cfg.get("seed", 0), router=str(cfg.get("router", "least_outstanding")),
                    tier=predictor.get("tier", "auto"), bundle=predictor.get("bundle"),
                    max_model_len=cfg.get("max_model_len"),
                    allow_long_max_model_len=cfg.get("allow_long_max_model_len", False), slo=cfg.get("slo"),
                    out_dir=out_dir, trace_steps=cfg.get("trace_steps", 2000),
                    trace_kernel_steps=cfg.get("trace_kernel_steps", 20), keep_requests=keep_requests,
                    progress=progress, intervals=bool(cfg.get("intervals", False)))
