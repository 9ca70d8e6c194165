"""Context length: vLLM's max_model_len rule for a run, and its per-request check.

vLLM derives the longest context a model allows from its config
(ModelConfig.context_limit: max_position_embeddings, stretched by
rope_scaling where vLLM stretches it). A `--max-model-len` above that is
refused unless the operator insists (env VLLM_ALLOW_LONG_MAX_MODEL_LEN=1, here
the setting `allow_long_max_model_len`): positions past the trained context
give wrong output. Unset, max_model_len is the derived limit.

Per request, vLLM's OpenAI server rejects a prompt whose length plus
max_tokens exceeds max_model_len (HTTP 400, "This model's maximum context
length is ..."), so a prompt of max_model_len tokens or more never runs; the
simulator's Engine counts such a request (and the rest of its conversation)
as failed, as `vllm bench serve` does.
"""
from __future__ import annotations

import warnings

from kernelsight.predictor.errors import KernelsightError, whole_number

from .model import ModelConfig

MIN_MAX_MODEL_LEN = 2  # one prompt token and one output token


def resolve_max_model_len(model: ModelConfig, max_model_len: int | None = None,
                          allow_long_max_model_len: bool = False) -> int:
    """The max_model_len a run uses: `max_model_len` (null: the model's context_limit), refused in one line
    naming both numbers when it exceeds the limit, unless allow_long_max_model_len (then a warning)."""
    if not isinstance(allow_long_max_model_len, bool):
        raise KernelsightError(f"allow_long_max_model_len={allow_long_max_model_len!r}: must be true or false")
    limit = model.context_limit
    if max_model_len is None:
        return limit
    length = whole_number(max_model_len, "max_model_len", MIN_MAX_MODEL_LEN,
                          hint="null: the model's maximum context")
    if length <= limit:
        return length
    derived = (f"max_position={model.max_position}" if limit == model.max_position
               else f"max_position={model.max_position} stretched by rope_scaling")
    where = f" in {model.source}" if model.source else ""
    problem = (f"max_model_len={length} is greater than the maximum context of model {model.name}, {limit} tokens "
               f"({derived}{where})")
    if not allow_long_max_model_len:
        raise KernelsightError(f"{problem}; lower it, or set allow_long_max_model_len=true to insist "
                               f"(vLLM: VLLM_ALLOW_LONG_MAX_MODEL_LEN=1)")
    warnings.warn(f"{problem}: allowed by allow_long_max_model_len; positions past the model's context give "
                  f"wrong output on a real engine", stacklevel=2)
    return length


def exceeds_max_model_len(prompt_len: int, output_len: int, max_model_len: int | None) -> bool:
    """vLLM's per-request rule: prompt plus requested output tokens above max_model_len is rejected
    (None: no limit)."""
    return bool(max_model_len) and prompt_len + output_len > max_model_len
