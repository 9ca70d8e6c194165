"""Model graphs: what each architecture family runs per layer, registered by HF architecture name.

An architecture is a small ModelGraph (common.py has the pieces they share: GEMMs, norms, GQA attention,
MLP, MoE) registered in registry.py: dense GQA decoders (dense.py), MoE decoders (moe.py: Mixtral,
Qwen3-MoE, MiniMax-M2, OLMoE, Granite-MoE, ...), gpt-oss (gpt_oss.py), Llama-4 (llama4.py) and DeepSeek's MLA (deepseek.py).
sim/graph.py assembles a step from them: embedding, norms, the model graph's layers, pipeline hops,
attention per layer kind, LM head and sampler. A new architecture is a new module registering its graph
(and imported here); nothing else dispatches on the architecture name.
"""
from __future__ import annotations

from ..model import SUPPORTED_ARCHS
from . import deepseek, dense, gpt_oss, llama4, moe  # noqa: F401  (each registers its graphs)
from .registry import GRAPHS, graph_for

__all__ = ["graph_for"]

assert set(GRAPHS) == set(SUPPORTED_ARCHS), "every supported architecture has a model graph"
