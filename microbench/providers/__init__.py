"""Registry of kernel providers: one module per kernel family, each defining BENCH.

Adding a provider is adding it to its family module's BENCH; adding a family's
benchmark is adding a module named after the family. Collectives are measured
by microbench.collectives, not here.
"""
from __future__ import annotations

import importlib
import pkgutil

import torch

from kernelsight.predictor.errors import KernelsightError, did_you_mean
from kernelsight.predictor.families import COLLECTIVES, REGISTRY, get_family

from .base import FamilyBench, Provider

BENCHES: dict[str, FamilyBench] = {}
for _mod in sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name != "base"):
    _bench = importlib.import_module(f"{__name__}.{_mod}").BENCH
    if _bench.family != _mod or _bench.family not in REGISTRY:
        raise RuntimeError(f"providers/{_mod}.py benchmarks {_bench.family!r}: module and family must match")
    BENCHES[_bench.family] = _bench


def get_bench(family: str) -> FamilyBench:
    get_family(family)  # unknown names get the family registry's did-you-mean
    if family in COLLECTIVES:
        raise KernelsightError(f"{family} is a collective: list it under sweep.collectives.ops, not sweep.families")
    return BENCHES[family]


def _matches(selector: str, provider: Provider) -> bool:
    return selector in (provider.name, provider.library)


def check_selectors(selectors, family: str | None = None, where: str = "providers") -> None:
    """Every selector (a library such as 'triton' or a full provider name) must name something.

    With `family`, it must name a provider of that family.
    """
    pool = BENCHES[family].providers if family else [p for b in BENCHES.values() for p in b.providers]
    choices = sorted({p.name for p in pool} | {p.library for p in pool})
    for sel in selectors:
        if not any(_matches(str(sel), p) for p in pool):
            scope = f"family {family!r}" if family else "any family"
            raise KernelsightError(f"{where}: unknown provider {sel!r} for {scope}{did_you_mean(str(sel), choices)}; "
                                   f"known: {', '.join(choices)}")


def select(family: str, selectors, device: torch.device) -> tuple[list[Provider], dict[str, str]]:
    """The family's providers named by `selectors` that can run on `device`, and why the others cannot."""
    chosen, unavailable = [], {}
    for p in get_bench(family).providers:
        if not any(_matches(str(s), p) for s in selectors):
            continue
        why = p.unavailable(device)
        if why:
            unavailable[p.name] = why
        else:
            chosen.append(p)
    return chosen, unavailable


__all__ = ["BENCHES", "FamilyBench", "Provider", "check_selectors", "get_bench", "select"]
