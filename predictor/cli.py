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
from pathlib import Path

from .errors import KernelsightError, did_you_mean
from .paths import conf_dir

# command: (implementation "module:function", one-line help)
COMMANDS = {
    "roofline": ("kernelsight.sim.commands:roofline",
                 "per-kernel roofline table of a model step, one kernel shape, or every row of a sweep file"),
    "import": ("kernelsight.calibrate.importers.commands:import_dataset",
               "convert public reference data (aiconfigurator, vidur, neusight) into the sweep contract"),
    "data": ("kernelsight.calibrate.importers.commands:data_summary",
             "rows of committed data per device and family"),
}

USAGE = """usage: kernelsight <command> [key=value ...] [-m] [--help] [--cfg job]

Commands:
{commands}

Configuration is Hydra: `kernelsight <command> --help` lists the command's
settings and config groups (hardware=, model=, ...); `-m` runs a sweep over
comma-separated values, e.g. `kernelsight roofline -m hardware=h100_sxm,a100_sxm`.
"""


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = "\n".join(f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items())
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


def run_command(name: str, args: list[str]) -> None:
    import hydra

    target, _ = COMMANDS[name]
    func = _load(target)

    def task(cfg):
        try:
            return func(cfg)
        except KernelsightError as e:
            print(f"kernelsight {name}: error: {e}", file=sys.stderr)
            sys.exit(2)

    task.__name__ = name
    main = hydra.main(config_path=str(Path(conf_dir()).resolve()), config_name=name, version_base="1.3")(task)
    sys.argv = [f"kernelsight {name}", *args]
    main()


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return
    name, args = argv[0], argv[1:]
    try:
        if name not in COMMANDS:
            raise KernelsightError(f"unknown command {name!r}{did_you_mean(name, COMMANDS)}; "
                                   f"run `kernelsight --help` for the list")
        check_group_overrides(args)
    except KernelsightError as e:
        print(f"kernelsight: error: {e}", file=sys.stderr)
        sys.exit(2)
    run_command(name, args)


if __name__ == "__main__":
    main()
