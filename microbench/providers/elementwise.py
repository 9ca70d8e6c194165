"""elementwise: residual adds, unary maps, row softmax and embedding gathers through torch.

Softmax and embedding work on rows of ROW elements (one row of numel when
numel is not a multiple); the embedding gathers numel/ROW random rows from a
table of 4x as many rows (at least 1024). Inputs keep every op finite: positive
bases for pow/log/sqrt, denominators away from zero. inductor.elementwise is the
same torch code compiled by Inductor (the Triton kernels torch.compile'd models run).
"""
from __future__ import annotations

import torch

from .base import FamilyBench, Provider, TORCH_DTYPES, inductor_provider, randn

ROW = 4096
SCALAR = 1.5

# op: (torch implementation on (a, b), float32 reference on (a, b)); b is None for one-input ops
_BINARY = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "pow": torch.pow}
_UNARY = {"relu": torch.relu, "gelu": torch.nn.functional.gelu, "silu": torch.nn.functional.silu,
          "sigmoid": torch.sigmoid, "tanh": torch.tanh, "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt,
          "neg": torch.neg, "copy": torch.clone, "softmax": lambda a: torch.softmax(a, -1)}
_POSITIVE = {"pow", "powu", "log", "sqrt"}


def _row(numel: int) -> int:
    return ROW if numel % ROW == 0 else numel


def make_inputs(shape, device, gen):
    n, op, dt = shape.numel, shape.op, shape.dtype
    if op == "embedding":
        rows = n // _row(n)
        vocab = max(1024, 4 * rows)
        return {"table": randn((vocab, _row(n)), dt, device, gen),
                "ids": torch.randint(0, vocab, (rows,), generator=gen, device=device)}
    a = randn((n // _row(n), _row(n)) if op == "softmax" else (n,), dt, device, gen)
    if op in _POSITIVE:
        a = (a.float().abs() + 0.5).to(a.dtype)
    inputs = {"a": a}
    if op in _BINARY:
        b = randn((n,), dt, device, gen, scale=0.5 if op == "pow" else 1.0)
        if op == "div":
            b = (b.float().sign() * (b.float().abs() + 0.5)).to(TORCH_DTYPES[dt])
        inputs["b"] = b
    return inputs


def _apply(op: str, inputs: dict, cast=lambda t: t):
    if op == "embedding":
        return cast(inputs["table"])[inputs["ids"]]
    a = cast(inputs["a"])
    if op in _BINARY:
        return _BINARY[op](a, cast(inputs["b"]))
    if op.endswith("u") and op[:-1] in _BINARY:
        return _BINARY[op[:-1]](a, SCALAR)
    return _UNARY[op](a)


def reference(shape, inputs, options):
    return _apply(shape.op, inputs, cast=lambda t: t.float())


def _torch_build(shape, inputs):
    return lambda: _apply(shape.op, inputs)


def _native(shape, inputs):
    return _apply(shape.op, inputs)


BENCH = FamilyBench(family="elementwise", make_inputs=make_inputs, reference=reference,
                    providers=(Provider("torch.elementwise", _torch_build),
                               inductor_provider("inductor.elementwise", _native)))
