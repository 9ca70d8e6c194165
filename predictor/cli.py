"""`kernelsight <command> [overrides...]`: one entry point, one Hydra app per command.

Each command is a function taking the composed config; its primary config is
conf/<command>.yaml and it can use any config group in conf/ (hardware=,
model=, ...), command-line overrides and multirun (-m). Commands live in the
subpackage that owns them and are imported only when called, so `predictor`
never imports the simulator or torch.
"""
from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from pathlib import Path

from .errors import KernelsightError, did_you_mean
from .paths import conf_dir


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
    "roofline": Command("kernelsight.sim.commands:roofline",
                        "per-kernel roofline table of a model step, one kernel shape, or every row of a sweep file",
                        positional="sweep_file"),
    "simulate": Command("kernelsight.sim.simulate:simulate",
                        "replay a serving workload on simulated vLLM engines: TTFT/TPOT/ITL/E2E, throughput, KV cache, "
                        "GPU time per kernel family"),
    "validate": Command("kernelsight.sim.validate.commands:validate",
                        "simulate every row of a validation CSV (real serving runs) and score TTFT, TPOT and "
                        "throughput in both η tiers", positional="csv"),
    "bench": Command("kernelsight.microbench.commands:bench",
                     "collect a kernel sweep on this machine's GPU (sweep=quick|full|cpu, resume=true, dry_run=true)"),
    "bench report": Command("kernelsight.microbench.commands:bench_report",
                            "roofline and eta plots plus the eta summary table of a sweep", positional="sweep_file"),
    "bench serve": Command("kernelsight.microbench.commands:bench_serve",
                           "end-to-end serving runs of transformers' continuous batching (Poisson and closed-loop "
                           "traffic, shared prefixes) with per-token timestamps"),
    "calibrate": Command("kernelsight.calibrate.commands:calibrate",
                         "fit and evaluate per-family η models (target and cross-device tiers), write the report"),
    "calibrate publish": Command("kernelsight.calibrate.commands:calibrate_publish",
                                 "evaluate every GPU, fit the final η models and write a bundle directory"),
    "predict": Command("kernelsight.calibrate.commands:predict",
                       "predicted latency of one kernel shape, or of every row of a sweep file (with errors)",
                       positional="sweep_file"),
    "import": Command("kernelsight.calibrate.importers.commands:import_dataset",
                      "convert public reference data (aiconfigurator, vidur, neusight) into the sweep contract",
                      positional="dataset"),
    "data": Command("kernelsight.calibrate.importers.commands:data_summary",
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


def check_group_overrides(args: list[str]) -> None:
    """Catch `group=name` overrides that name no config file, with a did-you-mean."""
    root = conf_dir()
    for arg in args:
        if arg.startswith("-") or "=" not in arg:
            continue
        key, value = arg.lstrip("+~").split("=", 1)
        group = root / key
        if not group.is_dir() or not value or "," in value or "(" in value:
            continue
        choices = sorted(p.stem for p in group.glob("*.yaml"))
        if value not in choices:
            raise KernelsightError(f"{key}={value}: no such config in conf/{key}{did_you_mean(value, choices)}; "
                                   f"available: {', '.join(choices)}")


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
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    plain = [o for o in overrides if not o.startswith("-") and not o.startswith("hydra")]
    try:
        with initialize_config_dir(config_dir=str(Path(conf_dir()).resolve()), version_base="1.3"):
            compose(COMMANDS[name].config_name(name), overrides=plain)
    except (HydraException, OmegaConfBaseException) as e:
        first = next((line for line in str(e).splitlines() if line.strip()), type(e).__name__)
        raise KernelsightError(f"bad setting: {first.strip()}") from None


def run_command(name: str, overrides: list[str]) -> None:
    import hydra

    command = COMMANDS[name]
    func = _load(command.target)

    def task(cfg):
        try:
            return func(cfg)
        except KernelsightError as e:
            print(f"kernelsight {name}: error: {e}", file=sys.stderr)
            sys.exit(2)

    task.__name__ = command.config_name(name)
    main = hydra.main(config_path=str(Path(conf_dir()).resolve()), config_name=command.config_name(name),
                      version_base="1.3")(task)
    sys.argv = [f"kernelsight {name}", *overrides]
    main()


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return
    try:
        name, args = split_command(argv)
        overrides = to_overrides(COMMANDS[name], args)
        check_group_overrides(overrides)
        if not any(o in ("-h", "--help", "--hydra-help") for o in overrides):
            check_composes(name, overrides)
    except KernelsightError as e:
        print(f"kernelsight: error: {e}", file=sys.stderr)
        sys.exit(2)
    run_command(name, overrides)


if __name__ == "__main__":
    main()
