"""elementwise: residual adds, unary maps, softmax rows, embedding gathers.

Each op is (inputs read, outputs written, FLOPs) per element; a '*u' op is the
tensor-scalar form (one tensor input). Tile assumption: PyTorch's vectorised
element-wise kernel, 128 threads x 4 elements = 512 elements per block.
"""
from dataclasses import dataclass

import numpy as np

from .base import Cost, Family, Field, Shape, cdiv, elem_bytes

ELEMS_PER_BLOCK = 512

# op: (tensors read, tensors written, flops per element)
OPS = {
    "add": (2, 1, 1), "sub": (2, 1, 1), "mul": (2, 1, 1), "div": (2, 1, 1), "pow": (2, 1, 10),
    "addu": (1, 1, 1), "subu": (1, 1, 1), "mulu": (1, 1, 1), "divu": (1, 1, 1), "powu": (1, 1, 10),
    "relu": (1, 1, 1), "gelu": (1, 1, 9), "silu": (1, 1, 5), "sigmoid": (1, 1, 4), "tanh": (1, 1, 5),
    "exp": (1, 1, 2), "log": (1, 1, 2), "sqrt": (1, 1, 1), "neg": (1, 1, 1), "copy": (1, 1, 0),
    "softmax": (1, 1, 5), "embedding": (1, 1, 0),
}


@dataclass(frozen=True)
class ElementwiseShape(Shape):
    numel: int
    op: str = "add"
    dtype: str = "bf16"


def _cost(c):
    table = np.asarray([OPS[x] for x in c["op"].tolist()], dtype=np.float64).reshape(-1, 3)
    n = c["numel"]
    return Cost(flops=n * table[:, 2],
                bytes=n * (table[:, 0] + table[:, 1]) * elem_bytes(c["dtype"]),
                blocks=cdiv(n, ELEMS_PER_BLOCK))


FAMILIES = [Family(
    name="elementwise",
    fields=(Field("numel", "pos", doc="elements of the output"),
            Field("op", "choice", choices=tuple(OPS)), Field("dtype", "dtype")),
    unit="vector", dominant="numel", tile=f"{ELEMS_PER_BLOCK} elements per block",
    cost_fn=_cost, shape=ElementwiseShape)]
