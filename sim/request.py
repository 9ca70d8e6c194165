"""One serving request as the engine sees it: lengths, progress, prefix identity, timestamps.

The simulator has no token ids, so a prompt's *content* is a sequence of
segments `(content_id, length)`: a content id names a run of tokens (a shared
system prompt, a trace's hash id, a request's own new text, a request's
generated output, which a later conversation turn quotes). Two prompts share a KV block exactly when
every token from position 0 to the block's end comes from the same segments at
the same offsets, which is what vLLM's chained block hashes guarantee for real
tokens. Content ids are `(kind, id)` pairs of ints so hashes are reproducible
across processes (no string hashing).
"""
from __future__ import annotations

# Content-id kinds: separate namespaces so ids from different sources never collide.
UNIQUE, SHARED_PREFIX, TRACE_HASH, OUTPUT = 0, 1, 2, 3

# Request status (vLLM's RequestStatus, reduced to what scheduling needs).
WAITING, RUNNING, PREEMPTED, FINISHED = 0, 1, 2, 3


class Request:
    """One request: what it asks for, its prefix identity, its KV blocks and its timestamps.

    While a scheduler serves it, its token counters (computed, returned,
    in flight) live in that scheduler's arrays under `slot`
    (Scheduler.progress(request) reads them); num_output_tokens is set when it
    finishes. The KV manager keeps block_ids, num_cached_blocks, fast_limit, sw_blocks and sw_start.
    """

    __slots__ = (
        "request_id", "arrival_time", "prompt_len", "output_len", "segments", "status", "slot",
        "num_output_tokens", "block_ids", "num_cached_blocks", "fast_limit", "_hashes", "sw_blocks", "sw_start",
        "num_cached_tokens", "num_preemptions", "replica", "followup",
        "first_scheduled_time", "first_token_time", "last_token_time", "finish_time",
        "queued_since", "queue_time",
    )

    def __init__(self, request_id: int, arrival_time: float, prompt_len: int, output_len: int,
                 segments: tuple = (), followup=None):
        if prompt_len < 1 or output_len < 1:
            raise ValueError(f"request {request_id}: prompt and output need >= 1 token "
                             f"(got {prompt_len}, {output_len})")
        self.request_id = request_id
        self.arrival_time = arrival_time
        self.prompt_len = prompt_len
        self.output_len = output_len
        # Prompt content; a prompt without declared segments is unique text.
        self.segments = segments or (((UNIQUE, request_id), prompt_len),)
        pos = sum(length for _, length in self.segments)
        if pos != prompt_len:
            raise ValueError(f"request {request_id}: segments cover {pos} tokens, prompt has {prompt_len}")
        self.status = WAITING
        self.slot = -1
        self.num_output_tokens = 0
        self.block_ids: list[int] = []
        self.num_cached_blocks = 0
        self.fast_limit = 0                  # see KVCacheManager: decodes below it need no allocation
        self.sw_blocks: list[int] = []       # sliding-window groups' blocks (KVCacheManager, SlidingGroups)
        self.sw_start = 0
        self._hashes: list[int] = []
        self.num_cached_tokens = -1          # prefix-cache hit at first admission (-1: not yet)
        self.num_preemptions = 0
        self.replica = 0
        self.followup = followup             # (think time s, next turn): sent after this one ends
        self.first_scheduled_time = -1.0
        self.first_token_time = -1.0
        self.last_token_time = -1.0
        self.finish_time = -1.0
        self.queued_since = arrival_time     # when it last entered the waiting queue
        self.queue_time = 0.0                # total time spent waiting (first admission and resumes)

    @property
    def private(self) -> bool:
        """Whether no other request can share a KV block of this one: its prompt is its own text and no
        later turn quotes it (KVCacheManager leaves such blocks unhashed until a preemption frees them)."""
        return self.followup is None and len(self.segments) == 1 and self.segments[0][0] == (UNIQUE, self.request_id)

    @property
    def output_content(self) -> tuple:
        """Content id of this request's generated tokens (a later turn may quote them)."""
        return (OUTPUT, self.request_id)

    def block_hash(self, index: int, block_size: int) -> int:
        """Hash of full block `index` (see block_hashes). Only valid for blocks whose tokens are all known
        (prompt and outputs returned so far). The first call hashes every full prompt block at once: an
        admitted request needs them all, and one pass over the segments is cheaper than one per block."""
        hashes = self._hashes
        if index < len(hashes):
            return hashes[index]
        return self.block_hashes(max(index + 1, self.prompt_len // block_size), block_size)[index]

    def block_hashes(self, count: int, block_size: int) -> list[int]:
        """Hashes of the first `count` full blocks (computed once, then kept).

        A block's tokens [0, end) are named by the segments before the one holding token end - 1 (chained:
        parent = hash((parent, content, length)) per segment), that segment's content and the block's end
        offset in it; the request's generated tokens are one last segment. Equal hashes therefore mean the
        same tokens from position 0, which is what vLLM's chained block hashes guarantee, at one small tuple
        hash per block."""
        hashes = self._hashes
        j = len(hashes)
        if j >= count:
            return hashes
        last = count * block_size
        parent, seg_start = 0, 0
        for content, length in (*self.segments, (self.output_content, last)):
            seg_end = seg_start + length
            if (j + 1) * block_size <= seg_end:   # blocks ending in this segment
                hashes.extend([hash((parent, content, e)) for e in range((j + 1) * block_size - seg_start,
                                                                         min(seg_end, last) - seg_start + 1,
                                                                         block_size)])
                j = len(hashes)
                if j >= count:
                    return hashes
            parent = hash((parent, content, length))
            seg_start = seg_end
        return hashes

    def __repr__(self) -> str:
        return f"Request({self.request_id}, prompt={self.prompt_len}, output={self.output_len}, status={self.status})"
