"""`kernelsight <command> [overrides...]`: one entry point, one Hydra app per command.

Each command is a function taking the composed config; its primary config is
conf/<command>.yaml and it can use any config group in conf/ (hardware=,
model=, ...), command-line overrides and multirun (-m). One module of this
package per command (roofline.py, simulate.py, ...) turns the config into
typed library calls, prints tables and writes files; it is imported only when
its command runs, so `kernelsight --help` never imports the simulator or torch.

A bad input is one line and exit code 2; Ctrl-C is one line saying what the
command kept and how to continue (a command states it with on_interrupt;
nothing written otherwise) and exit code 130, as a shell reports SIGINT.
"""
from __future__ import annotations

import hashlib
import importlib
import json
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from kernelsight.predictor.errors import KernelsightError, did_you_mean
from kernelsight.predictor.paths import conf_dir


@dataclass(frozen=True)
class Command:
    """A command: its implementation ("module:function"), help line, and the config
    key a bare positional argument fills (`kernelsight predict FILE` = `sweep=FILE`)."""

    target: str
    help: str
    positional: str | None = None

    def config_name(self, name: str) -> str:
        return name.replace(" ", "_")


COMMANDS = {
    "roofline": Command("kernelsight.cli.roofline:roofline",
                        "per-kernel roofline table of a model step, one kernel shape, or every row of a sweep file",
                        positional="sweep_file"),
    "simulate": Command("kernelsight.cli.simulate:simulate",
                        "replay a serving workload on simulated vLLM engines: TTFT/TPOT/ITL/E2E, throughput, KV cache, "
                        "GPU time per kernel family"),
    "plan": Command("kernelsight.cli.plan:plan",
                    "search GPUs, layouts and vLLM settings for the cheapest deployment that serves a load within "
                    "latency SLOs: ranked table, Pareto front, every candidate in Parquet"),
    "validate": Command("kernelsight.cli.validate:validate",
                        "simulate every row of a validation CSV (real serving runs) and score TTFT, TPOT and "
                        "throughput in both η tiers", positional="csv"),
    "bench": Command("kernelsight.cli.bench:bench",
                     "collect a kernel sweep on this machine's GPU (sweep=quick|full|cpu, resume=true, dry_run=true)"),
    "bench report": Command("kernelsight.cli.bench:bench_report",
                            "roofline and eta plots plus the eta summary table of a sweep", positional="sweep_file"),
    "bench serve": Command("kernelsight.cli.bench:bench_serve",
                           "end-to-end serving runs of transformers' continuous batching (Poisson and closed-loop "
                           "traffic, shared prefixes) with per-token timestamps"),
    "calibrate": Command("kernelsight.cli.calibrate:calibrate",
                         "fit and evaluate per-family η models (target and cross-device tiers), write the report"),
    "calibrate publish": Command("kernelsight.cli.calibrate:calibrate_publish",
                                 "evaluate every GPU, fit the final η models and write a bundle directory"),
    "calibrate energy": Command("kernelsight.cli.calibrate:calibrate_energy",
                                "fit and evaluate the kernel power model on NVML energy readings, write the "
                                "report and the energy artifact the simulator prices energy with"),
    "predict": Command("kernelsight.cli.predict:predict",
                       "predicted latency of one kernel shape, or of every row of a sweep file (with errors)",
                       positional="sweep_file"),
    "import": Command("kernelsight.cli.data:import_dataset",
                      "convert public reference data (aiconfigurator, vidur, neusight) into the sweep contract",
                      positional="dataset"),
    "data": Command("kernelsight.cli.data:data_summary",
                    "rows of committed data per device and family", positional="path"),
}

# Hydra's own flags pass through untouched; other --key value pairs become key=value.
_HYDRA_FLAGS = {"-h", "--help", "--hydra-help", "-m", "--multirun", "--info", "-i", "--resolve",
                "--version", "-r", "--run", "--shell-completion", "-sc"}
_HYDRA_FLAGS_WITH_VALUE = {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn",
                           "--config-dir", "-cd", "--experimental-rerun"}

USAGE = """usage: kernelsight <command> [key=value ...] [-m] [--help] [--cfg job]

Commands:
{commands}

Configuration is Hydra: `kernelsight <command> --help` lists the command's
settings and config groups (hardware=, model=, ...); `-m` runs a sweep over
comma-separated values, e.g. `kernelsight roofline -m hardware=h100_sxm,a100_sxm`.
"""


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = "\n".join(f"  {name:<{width}}  {cmd.help}" for name, cmd in COMMANDS.items())
    return USAGE.format(commands=lines)


def _load(target: str):
    module, func = target.split(":")
    return getattr(importlib.import_module(module), func)


def check_group_overrides(args: list[str]) -> list[str]:
    """Catch `group=name` overrides (each name of a multirun's `group=a,b`) that name no config file, with a
    did-you-mean; returns the overrides with a GPU alias or device name written as its config
    (`hardware=h100` -> `hardware=h100_sxm`). Sweep functions (`glob(...)`) and file paths pass as given."""
    root = conf_dir()
    checked, files = [], {}
    for arg in args:
        checked.append(arg)
        if arg.startswith("-") or "=" not in arg:
            continue
        prefix = arg[:len(arg) - len(arg.lstrip("+~"))]
        key, value = arg[len(prefix):].split("=", 1)
        group = root / key
        if not group.is_dir() or not value or "(" in value or "[" in value:
            continue
        choices = sorted(p.stem for p in group.glob("*.yaml"))
        names = [_file_choice(key, name, files) or _config_name(key, name, choices) for name in value.split(",")]
        checked[-1] = f"{prefix}{key}={','.join(names)}"
    if files:
        checked.append(f"hydra.searchpath=[file://{_file_groups(files)}]")
    return checked


def _file_choice(group: str, value: str, files: dict) -> str | None:
    """A group choice given as a file (a .yaml of the group; for model also a HF config.json or its folder):
    the name it gets in the search path _file_groups writes (None when the value is not a file)."""
    path = Path(value).expanduser()
    if not ((path.suffix in (".yaml", ".json") and path.is_file()) or (path / "config.json").is_file()):
        if path.suffix in (".yaml", ".json") or "/" in value:
            raise KernelsightError(f"{group}={value}: no such file" + (" (nor a folder with a config.json)"
                                                                        if group == "model" else ""))
        return None
    from kernelsight.sim.compose import group_config  # the simulator only for a file: a name needs none

    config, _ = group_config(group, str(path))
    data = config.as_dict() if hasattr(config, "as_dict") else config  # a HF config read, or the YAML mapping
    name = f"file-{hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:12]}"
    files[(group, name)] = data
    from .config import FILE_CHOICES

    FILE_CHOICES[(group, name)] = str(path / "config.json" if path.is_dir() else path)
    return name


def _file_groups(files: dict) -> Path:
    """A config search path holding each file choice as <group>/<name>.yaml (in the user cache)."""
    import yaml

    from kernelsight.predictor.paths import cache_dir

    root = cache_dir() / "cli_configs"
    for (group, name), data in files.items():
        (root / group).mkdir(parents=True, exist_ok=True)
        (root / group / f"{name}.yaml").write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return root


def _config_name(group: str, name: str, choices: list[str]) -> str:
    """The config file a group choice names: itself, or for hardware the GPU an alias names."""
    if name in choices or name.endswith(".yaml"):
        return name
    canonical = _gpu_config(name) if group == "hardware" else None
    if canonical in choices:
        return canonical
    raise KernelsightError(f"{group}={name}: no such config in conf/{group}{did_you_mean(name, choices)}; "
                           f"available: {', '.join(choices)}")


def _gpu_config(name: str) -> str | None:
    """The catalog key of a GPU alias or device name (its conf/hardware file's name), None if unknown."""
    from kernelsight.predictor.hardware import resolve_device

    try:
        return resolve_device(name)
    except KernelsightError:
        return None


def to_overrides(command: Command, args: list[str]) -> list[str]:
    """Friendly argv to Hydra overrides: a bare FILE fills the positional key, --key v is key=v."""
    out, i = [], 0
    while i < len(args):
        arg = args[i]
        if arg in _HYDRA_FLAGS:
            out.append(arg)
        elif arg.split("=", 1)[0] in _HYDRA_FLAGS_WITH_VALUE:
            out.append(arg)
            if "=" not in arg and i + 1 < len(args):
                out.append(args[i + 1])
                i += 1
        elif arg.startswith("--"):
            key = arg[2:]
            if "=" in key:
                out.append(key)
            elif i + 1 < len(args) and not args[i + 1].startswith("-"):
                out.append(f"{key}={args[i + 1]}")
                i += 1
            else:
                out.append(f"{key}=true")
        elif "=" not in arg and not arg.startswith(("-", "~", "+")):
            if command.positional is None:
                raise KernelsightError(f"unexpected argument {arg!r}: settings are key=value")
            out.append(f"{command.positional}={arg}")
        else:
            out.append(arg)
        i += 1
    return out


def split_command(argv: list[str]) -> tuple[str, list[str]]:
    """The command name (one or two words, e.g. 'bench report') and the rest."""
    if len(argv) > 1 and f"{argv[0]} {argv[1]}" in COMMANDS:
        return f"{argv[0]} {argv[1]}", argv[2:]
    if argv[0] not in COMMANDS:
        raise KernelsightError(f"unknown command {argv[0]!r}{did_you_mean(argv[0], COMMANDS)}; "
                               f"run `kernelsight --help` for the list")
    return argv[0], argv[1:]


def check_composes(name: str, overrides: list[str]) -> None:
    """Compose a single run's config first, so an unknown key or bad value is one line, not Hydra's page."""
    if any(o in ("-m", "--multirun") for o in overrides):
        return  # sweeps are checked by Hydra per job
    plain = [o for o in overrides if not o.startswith("-") and (not o.startswith("hydra") or
                                                               o.startswith("hydra.searchpath="))]
    _compose(name, plain)


def single_job(overrides: list[str]) -> bool:
    """Whether the command is one job of plain settings (no Hydra flag, no hydra.* setting or hydra/ group
    but the search path): it then runs on one compose (compose_job) instead of Hydra's app, which composes
    the config twice more; Hydra's app gives nothing such a job uses."""
    return not any(o.startswith("-") or (o.lstrip("+~").startswith(("hydra.", "hydra/")) and
                                         not o.startswith("hydra.searchpath=")) for o in overrides)


def compose_job(name: str, overrides: list[str]):
    """The job's config as Hydra's app hands it to the command, with the running job's HydraConfig (config
    choices, overrides, run mode) set as Hydra's app sets it; a bad setting is one line."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import open_dict

    cfg = _compose(name, overrides, hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.mode = RunMode.RUN
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg


def _compose(name: str, overrides: list[str], hydra_config: bool = False):
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        with initialize_config_dir(config_dir=str(Path(conf_dir()).resolve()), version_base="1.3",
                                   job_name=COMMANDS[name].config_name(name)):
            return compose(COMMANDS[name].config_name(name), overrides=overrides, return_hydra_config=hydra_config)
    except (HydraException, OmegaConfBaseException) as e:
        first = next((line for line in str(e).splitlines() if line.strip()), type(e).__name__)
        raise KernelsightError(f"bad setting: {first.strip()}") from None


@contextmanager
def on_interrupt(kept):
    """Say what an interrupted command keeps: `kept` (text, or a function called at the interrupt) becomes
    the dispatcher's `kernelsight <command>: interrupted: <kept>` line. The innermost one wins."""
    try:
        yield
    except KeyboardInterrupt as e:
        if not hasattr(e, "kept"):
            e.kept = kept() if callable(kept) else kept
        raise


def exit_interrupted(name: str, exc: KeyboardInterrupt) -> None:
    """Ctrl-C: one line on what was kept (on_interrupt; by default nothing), exit code 130 as a shell's."""
    print(f"kernelsight {name}: interrupted: {getattr(exc, 'kept', 'nothing written')}", file=sys.stderr)
    sys.exit(130)


def run_command(name: str, overrides: list[str]) -> None:
    command = COMMANDS[name]
    job = compose_job(name, overrides) if single_job(overrides) else None
    func = _load(command.target)

    def task(cfg):
        try:
            return func(cfg)
        except KernelsightError as e:
            print(f"kernelsight {name}: error: {e}", file=sys.stderr)
            sys.exit(2)
        except OSError as e:  # a file the command reads or writes outside the checked paths: full disk, ...
            where = f"{e.filename}: " if e.filename else ""
            why = (e.strerror or str(e) or type(e).__name__).splitlines()[0]
            print(f"kernelsight {name}: error: {where}{why}", file=sys.stderr)
            sys.exit(2)
        except KeyboardInterrupt as e:
            exit_interrupted(name, e)

    if job is not None:
        task(job)
        return
    import hydra

    task.__name__ = command.config_name(name)
    main = hydra.main(config_path=str(Path(conf_dir()).resolve()), config_name=command.config_name(name),
                      version_base="1.3")(task)
    sys.argv = [f"kernelsight {name}", *overrides]
    main()


def _freeze_heap_at_exit() -> None:
    """Once per process: at exit (after the exit handlers registered later, so after whatever a command set up),
    move every object into the permanent generation, so that the interpreter's shutdown does not collect and
    free the heap object by object: about 0.1 s of every command's exit over numpy, Hydra and a finished run,
    for memory the process gives back anyway. The standard streams are still flushed at shutdown, and the
    commands close what they write before they return (files, Parquet writers, plots), so only that clean-up
    is skipped. Not where a device library was loaded (`kernelsight bench`): triton's bindings report every
    one of their objects still alive at shutdown as a leak."""
    global _FREEZE_REGISTERED
    if not _FREEZE_REGISTERED:
        import atexit

        atexit.register(_freeze_heap)
        _FREEZE_REGISTERED = True


_FREEZE_REGISTERED = False
_KEEP_SHUTDOWN = ("torch", "triton")  # libraries whose shutdown wants their objects freed


def _freeze_heap() -> None:
    if not any(name in sys.modules for name in _KEEP_SHUTDOWN):
        import gc

        gc.freeze()


def main(argv: list[str] | None = None) -> None:
    _freeze_heap_at_exit()
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return
    name = argv[0]
    try:
        name, args = split_command(argv)
        overrides = check_group_overrides(to_overrides(COMMANDS[name], args))
        if not single_job(overrides) and not any(o in ("-h", "--help", "--hydra-help") for o in overrides):
            check_composes(name, overrides)
        run_command(name, overrides)
    except KernelsightError as e:
        print(f"kernelsight: error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt as e:  # before the command started (the task catches its own)
        exit_interrupted(name, e)


if __name__ == "__main__":
    main()
