"""What one engine step runs: the scheduler's decision and the model graph's input."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StepBatch:
    """One scheduled step of a continuous-batching engine.

    prefill_new[i]: prompt tokens computed this step for prefilling request i
        (a chunk under chunked prefill);
    prefill_ctx[i]: tokens of that request already in the KV cache before the
        chunk (prefix-cache hits plus earlier chunks);
    decode_ctx[j]: KV length decoding request j attends over, its new token included;
    prefill_sampled: prefill chunks that finish their prompt this step and
        sample a first token (decodes always sample one).
    dp_tokens: tokens the step's forward pass runs at when attention data-parallel ranks step together
        (engine.LockstepGroup: the largest rank's count when vLLM pads every rank to it; a rank with
        nothing scheduled runs a dummy batch of dp_tokens and no sequence); 0: its own tokens.
    moe_tokens: tokens each MoE layer gathers from all attention data-parallel ranks when they run
        unpadded (their sum); 0: the forward's tokens times the ranks (equal or padded batches).
    """

    prefill_new: tuple = ()
    prefill_ctx: tuple = ()
    decode_ctx: tuple = ()
    prefill_sampled: int = 0
    dp_tokens: int = 0
    moe_tokens: int = 0

    def __post_init__(self):
        if len(self.prefill_new) != len(self.prefill_ctx):
            raise ValueError("prefill_new and prefill_ctx must have one entry per prefilling request")

    @property
    def num_prefill_tokens(self) -> int:
        return sum(self.prefill_new)

    @property
    def num_decode_tokens(self) -> int:
        return len(self.decode_ctx)

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens

    @property
    def forward_tokens(self) -> int:
        """Tokens the token-wise kernels run at (before CUDA-graph padding)."""
        return max(self.num_tokens, self.dp_tokens)

    @property
    def num_seqs(self) -> int:
        return len(self.prefill_new) + len(self.decode_ctx)

    @property
    def num_sampled(self) -> int:
        return self.prefill_sampled + len(self.decode_ctx)
