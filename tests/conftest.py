"""Fixtures shared by the test modules."""
from __future__ import annotations

import sys

import pytest


@pytest.fixture
def run_cli(capsys, monkeypatch):
    """`kernelsight <argv>` in process (cli.main), with Hydra's global state cleared before and after.

    run_cli(argv, cwd=None, crash_as_code=False) -> (exit code, stdout, stderr): the code is 0 on return and the
    SystemExit code otherwise. cwd, if given, is the working directory (restored after the test); sys.argv is
    restored too. With crash_as_code an exception that escapes the CLI (a crash, not a refusal) comes back as the
    code, a string naming it, instead of being raised.
    """
    def run(argv: list[str], cwd=None, crash_as_code: bool = False) -> tuple[object, str, str]:
        from hydra.core.global_hydra import GlobalHydra

        from kernelsight import cli

        if cwd is not None:
            monkeypatch.chdir(cwd)
        monkeypatch.setattr(sys, "argv", list(sys.argv))
        GlobalHydra.instance().clear()
        capsys.readouterr()
        try:
            cli.main(argv)
            code = 0
        except SystemExit as e:
            code = e.code
        except Exception as e:
            if not crash_as_code:
                raise
            code = f"{type(e).__name__} raised: {str(e).splitlines()[0] if str(e) else ''}"
        finally:
            GlobalHydra.instance().clear()
        out, err = capsys.readouterr()
        return code, out, err

    return run
