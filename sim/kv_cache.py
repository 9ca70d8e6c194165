"""Paged KV-cache manager with prefix caching, following vLLM v1's block pool.

Semantics kept from vllm/v1/core (kv_cache_manager.py, block_pool.py,
kv_cache_utils.py), for one full-attention KV group:

- A fixed pool of blocks of `block_size` tokens. A request owns a list of
  blocks; a block shared through a prefix hit has a reference count > 1.
- A *full* block gets a hash chained on its parent's hash; a block is cached
  (findable by hash) from the moment its tokens are scheduled, as in vLLM's
  allocate_slots, so a later request in the same step can already hit it.
- Lookups walk the request's block hashes from the start and stop at the first
  miss, so hits only happen on identical prefixes; at most num_tokens - 1 tokens
  hit, because the last prompt token must be computed to sample from it.
- Free blocks sit in one queue in eviction order: freeing appends at the tail
  (a request's blocks in reverse, so its tail blocks are evicted first),
  allocating pops from the head and evicts the popped block's hash. A hit on a
  free cached block takes it out of the queue (vLLM's `touch`).
- Allocation is all or nothing: if the free queue cannot supply the new blocks
  (counting hit blocks that must leave the free queue), nothing changes.

The manager does not track token counts: callers pass a request's computed
tokens (vLLM's num_computed_tokens) and known tokens (prompt plus outputs
returned; only those can be hashed).

Speed: a decode adds one token; while computed + 1 < request.fast_limit the
token fits the request's blocks and the scheduler makes no call. A decode
that needs a new block takes one with append_block, which caches nothing:
blocks filled by decodes are cached when the request frees its blocks
(finish or preemption), not in the step they fill. Nobody can look them up
in between: their content is the request's own output, which only the
request itself (after a preemption, when its blocks were freed) or a later
conversation turn (after it finished) can ask for. So hits and evictions are
vLLM's, at one short KV-manager call per 16 decoded tokens. The same holds for
every block of a private request (Request.private: its prompt is its own text and
no later turn quotes it): only the request itself, after a preemption, can ask
for them, so they are hashed and cached when a preemption frees them and never
otherwise (lookups for it find nothing before its first preemption). Hits and
block choices are vLLM's; only its count of evicted hashes leaves these out.

Local-attention layers (SlidingGroups): vLLM's hybrid allocator puts a
model's full-attention layers in one KV-cache group and its sliding-window
(or chunked local-attention) layers in `groups` more groups of as many layers,
all drawing blocks of that many layers from one pool. A request holds its full
group's blocks (block_ids, hashed as above) and, per local group, only the
blocks its window still reads (sw_blocks, from block sw_start on): at each
allocation vLLM frees the blocks of tokens no later token reads first
(remove_skipped_blocks), then allocates up to the new length in every group.
Kept approximate: local blocks hold no hash (a full-group prefix hit counts as
a hit in every group, its window blocks taken fresh from the queue: the same
count leaves it), and a decode frees its out-of-window block when it next
allocates, at most one step after vLLM would.
"""
from __future__ import annotations

from dataclasses import dataclass

from kernelsight.sim.request import FINISHED, Request


@dataclass(frozen=True)
class SlidingGroups:
    """The local-attention groups of vLLM's hybrid KV-cache allocator beside the one full-attention group
    (memory.kv_groups decides them): `groups` of them, each keeping the last `window` tokens (a sliding
    window) or, `chunked`, the tokens of the current `window`-token attention chunk (Llama-4); max_chunk,
    the scheduler's token budget, bounds what one prefill chunk allocates in them (request_blocks)."""

    groups: int
    window: int
    max_chunk: int
    chunked: bool = False

    def __post_init__(self):
        if self.groups < 1 or self.window < 1 or self.max_chunk < 1:
            raise ValueError(f"sliding KV groups need groups, window and max_chunk >= 1, got {self}")

    def skipped_blocks(self, num_computed: int, block_size: int) -> int:
        """Leading blocks no later token reads (vLLM get_num_skipped_tokens // block_size: a sliding window's
        tokens below num_computed - window + 1, a chunk's those before the chunk num_computed is in)."""
        if self.chunked:
            return num_computed // self.window * self.window // block_size
        skipped = num_computed - self.window + 1
        return skipped // block_size if skipped > 0 else 0

    def held_blocks(self, block_size: int) -> int:
        """Most blocks one group holds for a request (vLLM SlidingWindowSpec / ChunkedLocalAttentionSpec
        max_memory_usage_bytes): its window, or chunk, and one prefill chunk."""
        if self.chunked:
            return -(-(self.window + self.max_chunk) // block_size)
        return -(-(self.window - 1 + self.max_chunk) // block_size) + 1


def request_blocks(num_tokens: int, block_size: int, sliding: SlidingGroups | None = None) -> int:
    """Most blocks a request of num_tokens holds at once: all its tokens' in the full-attention group and, in
    each local-attention group, at most SlidingGroups.held_blocks."""
    full = -(-num_tokens // block_size)
    if sliding is None:
        return full
    return full + sliding.groups * min(full, sliding.held_blocks(block_size))


class KVCacheManager:
    """Owns the block pool, the prefix-cache index and the per-request block tables."""

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True,
                 sliding: SlidingGroups | None = None):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"KV cache needs at least one block of at least one token "
                             f"(got {num_blocks} blocks of {block_size})")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.sliding = sliding
        self.sliding_groups = sliding.groups if sliding else 0   # blocks a new sliding-window block takes
        self.ref_cnt = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        # Free queue, in eviction order: the blocks never used yet (ids _fresh..n-1, in id order), then a doubly
        # linked list of the freed ones (head/tail sentinels at n, n + 1). Freed blocks join the tail, allocation
        # pops the front, so the never-used ones go first and need no links: a run's pool costs no per-block
        # set-up beyond its tables (a plan simulates many short runs on pools of up to millions of blocks).
        self._head, self._tail = num_blocks, num_blocks + 1
        self._fresh = 0
        self._next, self._prev = [0] * (num_blocks + 2), [0] * (num_blocks + 2)
        self._next[self._head], self._prev[self._tail] = self._tail, self._head
        self.num_free = num_blocks
        # hash -> a cached block with it; further blocks with the same hash (identical blocks
        # computed twice, which vLLM also keeps) wait in _dupes.
        self._cached: dict[int, int] = {}
        self._dupes: dict[int, list[int]] = {}
        self.prefix_queries = 0   # tokens looked up (vLLM PrefixCacheStats.queries)
        self.prefix_hits = 0      # tokens found
        self.evictions = 0

    # ----- stats -----
    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    @property
    def usage(self) -> float:
        """Fraction of blocks held by requests (cached free blocks count as free, as in vLLM)."""
        return self.num_used / self.num_blocks

    @property
    def hit_rate(self) -> float:
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0

    def blocks_needed(self, num_tokens: int) -> int:
        return request_blocks(num_tokens, self.block_size, self.sliding)

    # ----- free queue -----
    def _remove_free(self, block: int) -> None:
        p, n = self._prev[block], self._next[block]
        self._next[p] = n
        self._prev[n] = p
        self.num_free -= 1

    def _pop_free_blocks(self, count: int) -> list[int]:
        """The `count` blocks at the head of the free queue (as many _pop_free calls), hashes evicted in order."""
        fresh = min(count, self.num_blocks - self._fresh)
        out = list(range(self._fresh, self._fresh + fresh))
        self._fresh += fresh
        self.num_free -= count
        if fresh == count:   # never-used blocks hold no hash
            return out
        nxt, head, block_hash, cached, dupes = self._next, self._head, self.block_hash, self._cached, self._dupes
        append = out.append
        evicted = 0
        b = nxt[head]
        for _ in range(count - fresh):  # the queue walked and hashes evicted in one pass, in queue order
            append(b)
            h = block_hash[b]
            if h is not None:
                block_hash[b] = None
                if dupes and h in dupes:
                    self._uncache(h, b)
                else:   # the only block with this hash
                    del cached[h]
                evicted += 1
            b = nxt[b]
        nxt[head] = b
        self._prev[b] = head
        self.evictions += evicted
        return out

    def free_order(self) -> list[int]:
        """Free block ids from the next to be evicted to the last (for tests and inspection)."""
        out, b = list(range(self._fresh, self.num_blocks)), self._next[self._head]
        while b != self._tail:
            out.append(b)
            b = self._next[b]
        return out

    # ----- prefix-cache index -----
    def _lookup(self, h: int) -> int | None:
        return self._cached.get(h)

    def _uncache(self, h: int, block: int) -> None:
        if self._cached[h] == block:
            extra = self._dupes.get(h)
            if extra:
                self._cached[h] = extra.pop()
                if not extra:
                    del self._dupes[h]
            else:
                del self._cached[h]
        else:
            extra = self._dupes[h]
            extra.remove(block)
            if not extra:
                del self._dupes[h]

    def num_cached_prefix_blocks(self, request: Request, num_known: int) -> int:
        """How many leading full blocks of the request's known tokens are cached (no side effects)."""
        return len(self.get_computed_blocks(request, num_known))

    def get_computed_blocks(self, request: Request, num_known: int) -> list[int]:
        """Cached blocks of the longest cached prefix (at most num_known - 1 tokens); no ref taken."""
        if not self.enable_caching or (not request.num_preemptions and request.private):
            return []
        bs = self.block_size
        limit = (num_known - 1) // bs
        hits = []
        while len(hits) < limit:
            block = self._lookup(request.block_hash(len(hits), bs))
            if block is None:
                break
            hits.append(block)
        return hits

    def record_lookup(self, num_known: int, num_hit_tokens: int) -> None:
        self.prefix_queries += num_known
        self.prefix_hits += num_hit_tokens

    # ----- allocation -----
    def allocate_slots(self, request: Request, num_computed: int, num_known: int, num_new_tokens: int,
                       computed_blocks: list[int] = ()) -> bool:
        """Give the request room for `num_new_tokens` more tokens after its `num_computed` ones.

        computed_blocks: prefix-cache hits found by get_computed_blocks for a
        request being admitted (num_computed = 0). Full blocks up to
        min(computed + new, num_known) are cached. Returns False (and changes
        nothing) when the free queue cannot supply the blocks.
        """
        bs = self.block_size
        blocks = request.block_ids
        ref = self.ref_cnt
        sw_new = 0
        if computed_blocks:
            num_computed += len(computed_blocks) * bs
            total = num_computed + num_new_tokens
            need = -(-total // bs) - len(blocks) - len(computed_blocks)
            evictable = sum(1 for b in computed_blocks if ref[b] == 0)
            if self.sliding_groups:    # a new request: its window below the hit, and the new tokens, in every group
                sw_start = self.sliding.skipped_blocks(num_computed, bs)
                sw_new = self.sliding_groups * max(-(-total // bs) - sw_start, 0)
            if need + evictable + sw_new > self.num_free:
                return False
            if self.sliding_groups:
                request.sw_start = sw_start
            for b in computed_blocks:
                if ref[b] == 0:
                    self._remove_free(b)
                ref[b] += 1
            blocks.extend(computed_blocks)
            request.num_cached_blocks = len(blocks)
        else:
            total = num_computed + num_new_tokens
            need = -(-total // bs) - len(blocks)
            if self.sliding_groups:
                sw_new = self.sliding_groups * max(-(-total // bs) - self._slide(request, num_computed), 0)
            if need + sw_new > self.num_free:
                return False
        if sw_new:  # vLLM's groups in layer order: the sliding ones come first in every shipped model
            new = self._pop_free_blocks(sw_new)
            for b in new:
                ref[b] = 1
            request.sw_blocks.extend(new)
        if need > 0:
            new = self._pop_free_blocks(need)
            for b in new:
                ref[b] = 1
            blocks.extend(new)
        if self.enable_caching and not request.private:
            num_full = (total if total < num_known else num_known) // bs
            if num_full > request.num_cached_blocks:
                self._cache_full_blocks(request, num_full)
        request.fast_limit = len(blocks) * bs + 1
        return True

    def append_block(self, request: Request, num_computed: int) -> bool:
        """Room for one decoded token after `num_computed` (the prompt's already): allocate_slots for a
        decode, except that the full blocks the decodes filled are left for free() to cache (see the module
        docstring). A new block only when the token starts one, after the sliding groups gave back what fell
        out of their window; False when none is free (the blocks given back stay free, as in vLLM)."""
        blocks = request.block_ids
        if num_computed >= len(blocks) * self.block_size:
            sw = self.sliding_groups
            if sw:
                self._slide(request, num_computed)
            if self.num_free < 1 + sw:
                return False
            new = self._pop_free_blocks(1 + sw)
            ref = self.ref_cnt
            for b in new:
                ref[b] = 1
            if sw:
                request.sw_blocks.extend(new[:sw])
            blocks.append(new[-1])
        request.fast_limit = len(blocks) * self.block_size + 1
        return True

    def append_blocks(self, requests: list[Request], used_after: list | None = None) -> bool:
        """append_block for each of `requests` in order, each decoding a token that starts a new block (a
        request may come again for its next block): the same blocks and evictions as one call each, from one
        pop of the free queue (what the sliding groups give back joins its tail, as one call at a time would
        leave it: no call reaches those blocks). False, changing nothing, when fewer blocks are free than the
        calls take (the caller then goes one by one, preempting where vLLM would). used_after: if given,
        receives the blocks in use after each call."""
        sw = self.sliding_groups
        if len(requests) * (1 + sw) > self.num_free:
            return False
        ref, bs = self.ref_cnt, self.block_size
        used = self.num_used
        new = self._pop_free_blocks(len(requests) * (1 + sw))
        for b in new:
            ref[b] = 1
        if not sw:
            for req, b in zip(requests, new):
                blocks = req.block_ids
                blocks.append(b)
                req.fast_limit = len(blocks) * bs + 1
            if used_after is not None:
                used_after.extend(range(used + 1, used + len(requests) + 1))
            return True
        popped_free = self.num_free
        for i, req in enumerate(requests):
            blocks = req.block_ids
            self._slide(req, len(blocks) * bs)
            k = i * (1 + sw)
            req.sw_blocks.extend(new[k:k + sw])
            blocks.append(new[k + sw])
            req.fast_limit = len(blocks) * bs + 1
            if used_after is not None:
                used_after.append(used + (i + 1) * (1 + sw) - (self.num_free - popped_free))
        return True

    def _slide(self, request: Request, num_computed: int) -> int:
        """Give back the request's sliding-window blocks no token after num_computed reads (vLLM
        remove_skipped_blocks); returns the block index its sliding groups have allocated up to."""
        start = request.sw_start
        end = start + len(request.sw_blocks) // self.sliding_groups
        drop = min(self.sliding.skipped_blocks(num_computed, self.block_size), end) - start
        if drop > 0:
            self._release_sliding(request, drop)
        return end

    def _release_sliding(self, request: Request, count: int) -> None:
        """Give back the first `count` held blocks of each sliding group, group by group, each newest first,
        to the tail of the free queue (vLLM's order: groups in layer order, a group's blocks in reverse)."""
        sw, held = self.sliding_groups, request.sw_blocks
        self._release([held[k * sw + g] for g in range(sw) for k in range(count - 1, -1, -1)])
        del held[:count * sw]
        request.sw_start += count

    def _release(self, blocks) -> None:
        """Drop a reference to each block; those left without one join the tail of the free queue in order."""
        ref, nxt, prev, tail = self.ref_cnt, self._next, self._prev, self._tail
        last = prev[tail]
        freed = 0
        for b in blocks:
            r = ref[b] - 1
            ref[b] = r
            if not r:
                nxt[last] = b
                prev[b] = last
                last = b
                freed += 1
        nxt[last] = tail
        prev[tail] = last
        self.num_free += freed

    def _cache_full_blocks(self, request: Request, num_full: int) -> None:
        blocks = request.block_ids
        hashes = request.block_hashes(num_full, self.block_size)
        block_hash = self.block_hash
        cached = self._cached
        start = request.num_cached_blocks
        for h, b in zip(hashes[start:num_full], blocks[start:num_full]):
            block_hash[b] = h
            if cached.setdefault(h, b) != b:   # b had no hash, so the index cannot hold it already
                self._dupes.setdefault(h, []).append(b)
        request.num_cached_blocks = num_full

    def free(self, request: Request, num_cacheable: int = 0) -> None:
        """Release the request's blocks, tail first, so its last blocks are evicted first (its sliding-window
        blocks before them).

        num_cacheable: min(computed, known) tokens of the request; full blocks
        within them not cached yet (filled by decodes) are cached first.
        """
        if self.enable_caching and num_cacheable // self.block_size > request.num_cached_blocks and not (
                request.status == FINISHED and request.private):   # nobody can ask for those blocks again
            self._cache_full_blocks(request, min(num_cacheable // self.block_size, len(request.block_ids)))
        if request.sw_blocks:    # the sliding groups first (vLLM's group order)
            self._release_sliding(request, len(request.sw_blocks) // self.sliding_groups)
        request.sw_start = 0
        self._release(reversed(request.block_ids))
        request.block_ids = []
        request.num_cached_blocks = 0
        request.fast_limit = 0

    def check_invariants(self) -> None:
        """Conservation: every block is either free (ref 0, in the queue once) or held (ref > 0)."""
        free = self.free_order()
        assert len(free) == self.num_free == len(set(free)), "free queue corrupted"
        held = sum(1 for r in self.ref_cnt if r > 0)
        assert held + self.num_free == self.num_blocks, f"blocks not conserved: {held} held + {self.num_free} free"
        assert all(self.ref_cnt[b] == 0 for b in free), "a free block has references"
        for h, b in self._cached.items():
            assert self.block_hash[b] == h, "prefix index out of sync"
        for h, extra in self._dupes.items():
            assert h in self._cached and extra and all(self.block_hash[b] == h for b in extra), "duplicates out of sync"
        indexed = len(self._cached) + sum(map(len, self._dupes.values()))
        assert indexed == sum(h is not None for h in self.block_hash), "a hashed block is not indexed"
