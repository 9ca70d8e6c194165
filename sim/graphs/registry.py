"""The registry of model graphs: HF architecture name -> the ModelGraph that builds its kernels."""
from __future__ import annotations

from kernelsight.predictor.errors import KernelsightError

from ..model import ModelConfig
from .common import ModelGraph

GRAPHS: dict[str, ModelGraph] = {}


def register(*architectures: str):
    """Class decorator: one instance of the ModelGraph builds the kernels of these HF architectures."""
    def add(cls):
        for arch in architectures:
            if arch in GRAPHS:
                raise ValueError(f"{arch} has two model graphs: {type(GRAPHS[arch]).__name__} and {cls.__name__}")
            GRAPHS[arch] = cls()
        return cls
    return add


def graph_for(model: ModelConfig) -> ModelGraph:
    """The registered graph of the model's architecture."""
    graph = GRAPHS.get(model.architecture)
    if graph is None:
        raise KernelsightError(f"model {model.name}: architecture {model.architecture} has no model graph")
    return graph
