"""From a composed Hydra config to the library's plain values and typed configs.

Library packages take dicts, lists and dataclasses; this is the one place that
reads OmegaConf nodes and the running Hydra job (config choices for error
messages, multirun job numbers, the command-line overrides).
"""
from __future__ import annotations

from omegaconf import DictConfig, ListConfig, OmegaConf

from kernelsight.predictor.errors import KernelsightError
from kernelsight.predictor.hardware import Hardware
from kernelsight.sim import compose
from kernelsight.sim.engine_profile import EngineProfile
from kernelsight.sim.model import ModelConfig
from kernelsight.sim.parallel import ParallelConfig


def container(node):
    """A config node as plain dicts and lists, interpolations resolved (anything else unchanged)."""
    if isinstance(node, (DictConfig, ListConfig)):
        return OmegaConf.to_container(node, resolve=True)
    return node


def flag(cfg, key: str) -> bool:
    """A true/false setting of the composed config, or one line naming it (plots=maybe is not false)."""
    value = cfg.get(key)
    if not isinstance(value, bool):
        raise KernelsightError(f"{key}={value!r}: must be true or false")
    return value


# (group, choice) -> the file the user named, for choices given as a file (cli._file_choice): Hydra composes
# them from a copy in the user cache, whose name means nothing to the user.
FILE_CHOICES: dict[tuple[str, str], str] = {}


def config_source(group: str) -> str:
    """conf/<group>/<choice>.yaml of the running Hydra job (the user's file for a choice given as one), for
    error messages."""
    try:
        from hydra.core.hydra_config import HydraConfig

        choice = HydraConfig.get().runtime.choices[group]
    except (ImportError, ValueError, KeyError):
        return f"{group} config"
    return FILE_CHOICES.get((group, choice)) or f"conf/{group}/{choice}.yaml"


def parallel_config(cfg) -> ParallelConfig:
    return ParallelConfig.from_mapping(container(cfg.parallel), config_source("parallel"))


def hardware_config(cfg, parallel: ParallelConfig) -> Hardware:
    """The configured GPU on the layout's scale-out network."""
    hw = Hardware.from_mapping(container(cfg.hardware), config_source("hardware"))
    return hw.on_network(parallel.net_gbs_per_gpu)


def group_sources() -> dict:
    """Config group -> conf/<group>/<choice>.yaml of the running Hydra job, for error messages."""
    return {group: config_source(group) for group in compose.GROUPS}


def typed_configs(cfg) -> tuple[ModelConfig, Hardware, EngineProfile, ParallelConfig]:
    """(model, hardware, engine, parallel) of a composed config, each validated with its file named: the
    library's sim.compose.typed_configs, which kernelsight.simulate uses too."""
    return compose.typed_configs(container(cfg), group_sources())


def hydra_job() -> tuple[bool, int]:
    """(inside a Hydra multirun?, job number)."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hc = HydraConfig.get()
        if hc.mode != RunMode.MULTIRUN:
            return False, 0
        return True, int(hc.job.num)
    except (ImportError, ValueError):
        return False, 0


def sweep_dir() -> str:
    """The multirun's sweep directory (hydra.sweep.dir)."""
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get().sweep.dir


def task_overrides() -> list[str]:
    """The running job's command-line overrides (none outside a Hydra app)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return list(HydraConfig.get().overrides.task)
    except (ImportError, ValueError):
        return []
