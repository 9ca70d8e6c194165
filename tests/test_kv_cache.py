"""KV-cache manager: block conservation, vLLM's free-queue order, prefix hits on identical prefixes only."""
import json
import random

import pytest

from kernelsight.sim.kv_cache import KVCacheManager, SlidingGroups, request_blocks
from kernelsight.sim.request import FINISHED, OUTPUT, SHARED_PREFIX, UNIQUE, Request

BS = 4


def req(rid, segments, output_len=8):
    return Request(rid, 0.0, sum(n for _, n in segments), output_len, tuple(segments))


def admit(kv, r, known=None):
    """vLLM's admission: look up the cached prefix, allocate the rest of the prompt."""
    known = r.prompt_len if known is None else known
    hits = kv.get_computed_blocks(r, known)
    assert kv.allocate_slots(r, 0, known, known - len(hits) * BS, hits)
    return len(hits) * BS


def test_allocation_counts_blocks_and_conserves_them():
    kv = KVCacheManager(10, BS)
    a = req(1, [((UNIQUE, 1), 9)])
    assert admit(kv, a) == 0
    assert len(a.block_ids) == 3 and kv.num_free == 7 and kv.usage == pytest.approx(0.3)
    kv.check_invariants()
    # a decode that stays inside the last block needs no new block; the next one does
    assert kv.allocate_slots(a, 9, 10, 1) and len(a.block_ids) == 3
    assert a.fast_limit == 13                  # decodes computing up to 12 tokens fit
    assert kv.allocate_slots(a, 12, 13, 1) and len(a.block_ids) == 4
    kv.free(a)
    assert kv.num_free == 10 and a.block_ids == []
    kv.check_invariants()


def test_allocation_is_all_or_nothing():
    kv = KVCacheManager(4, BS)
    a, b = req(1, [((UNIQUE, 1), 12)]), req(2, [((UNIQUE, 2), 12)])
    admit(kv, a)
    before = (kv.num_free, kv.free_order())
    assert not kv.allocate_slots(b, 0, 12, 12)
    assert (kv.num_free, kv.free_order()) == before and b.block_ids == []
    kv.check_invariants()


def test_free_appends_blocks_in_reverse_so_the_tail_is_evicted_first():
    kv = KVCacheManager(8, BS)
    a = req(1, [((UNIQUE, 1), 12)])
    admit(kv, a)
    blocks = list(a.block_ids)
    kv.free(a)
    assert kv.free_order()[-3:] == blocks[::-1]
    assert kv.free_order()[:5] == [3, 4, 5, 6, 7]     # never-used blocks are handed out first


def test_prefix_hits_only_on_identical_prefixes():
    kv = KVCacheManager(64, BS)
    system = ((SHARED_PREFIX, 7), 8)
    a = req(1, [system, ((UNIQUE, 1), 8)])
    admit(kv, a)
    same_system = req(2, [system, ((UNIQUE, 2), 8)])
    assert len(kv.get_computed_blocks(same_system, 16)) == 2          # the 8 system-prompt tokens
    identical = req(3, [system, ((UNIQUE, 1), 8)])                    # same tokens as a
    assert len(kv.get_computed_blocks(identical, 16)) == 3            # all but the last token's block
    other_system = req(4, [((SHARED_PREFIX, 8), 8), ((UNIQUE, 1), 8)])
    assert kv.get_computed_blocks(other_system, 16) == []             # same suffix, other prefix: no hit
    shifted = req(5, [((UNIQUE, 9), 4), system, ((UNIQUE, 1), 4)])    # a's tokens at other positions
    assert kv.get_computed_blocks(shifted, 16) == []
    assert kv.num_cached_prefix_blocks(same_system, 16) == 2


def test_a_fully_cached_prompt_still_computes_its_last_token():
    kv = KVCacheManager(16, BS)
    a = req(1, [((SHARED_PREFIX, 1), 8)])
    admit(kv, a)
    b = req(2, [((SHARED_PREFIX, 1), 8)])
    hit = admit(kv, b)
    assert hit == 4                            # (8 - 1) // 4 = 1 block: the last block is recomputed
    assert b.block_ids[0] == a.block_ids[0] and kv.ref_cnt[a.block_ids[0]] == 2
    kv.check_invariants()


def test_hit_on_a_free_cached_block_takes_it_out_of_the_free_queue():
    kv = KVCacheManager(8, BS)
    a = req(1, [((SHARED_PREFIX, 1), 8), ((UNIQUE, 1), 4)])
    admit(kv, a)
    cached = a.block_ids[:2]
    kv.free(a)
    assert all(kv.ref_cnt[x] == 0 for x in cached) and kv.num_free == 8
    b = req(2, [((SHARED_PREFIX, 1), 8), ((UNIQUE, 2), 4)])
    assert admit(kv, b) == 8
    assert b.block_ids[:2] == cached and not set(cached) & set(kv.free_order())
    kv.check_invariants()


def test_eviction_pops_the_least_recently_freed_cached_blocks():
    kv = KVCacheManager(6, BS)
    a = req(1, [((SHARED_PREFIX, 1), 12)])
    b = req(2, [((SHARED_PREFIX, 2), 12)])
    admit(kv, a)
    admit(kv, b)
    kv.free(a)          # a's blocks are older in the free queue than b's
    kv.free(b)
    c = req(3, [((UNIQUE, 3), 12)])
    admit(kv, c)        # takes 3 blocks from the head: exactly a's
    assert kv.evictions == 3
    assert kv.get_computed_blocks(req(4, [((SHARED_PREFIX, 1), 12)]), 12) == []
    assert len(kv.get_computed_blocks(req(5, [((SHARED_PREFIX, 2), 12)]), 12)) == 2
    kv.check_invariants()


def test_identical_blocks_computed_twice_stay_findable_after_one_is_evicted():
    kv = KVCacheManager(8, BS)
    a = req(1, [((SHARED_PREFIX, 1), 8)])
    b = req(2, [((SHARED_PREFIX, 1), 8)])
    assert kv.allocate_slots(a, 0, 8, 8) and kv.allocate_slots(b, 0, 8, 8)   # no lookup: both compute
    kv.free(a)
    admit(kv, req(3, [((UNIQUE, 3), 24)]))     # evicts a's copies (oldest free blocks first)
    kv.check_invariants()
    assert len(kv.get_computed_blocks(req(4, [((SHARED_PREFIX, 1), 8)]), 8)) == 1


def test_decode_filled_blocks_are_cached_by_free_and_hit_by_a_later_turn():
    kv = KVCacheManager(16, BS)
    a = req(1, [((UNIQUE, 1), 4)], output_len=9)
    admit(kv, a)
    for computed in range(4, 12):           # decode 8 tokens (known = computed + 1)
        assert kv.allocate_slots(a, computed, computed + 1, 1)
    kv.free(a, num_cacheable=12)
    # the next turn quotes the prompt and the 9-token answer, then asks more
    turn2 = req(2, [((UNIQUE, 1), 4), ((OUTPUT, 1), 9), ((UNIQUE, 2), 3)])
    assert len(kv.get_computed_blocks(turn2, 16)) == 3     # prompt block + the 2 full output blocks


def test_disabled_caching_never_hits():
    kv = KVCacheManager(8, BS, enable_caching=False)
    a = req(1, [((SHARED_PREFIX, 1), 8)])
    admit(kv, a)
    kv.free(a, 8)
    assert kv.get_computed_blocks(req(2, [((SHARED_PREFIX, 1), 8)]), 8) == []
    assert kv.hit_rate == 0.0


def test_random_operations_conserve_blocks():
    rng = random.Random(0)
    kv = KVCacheManager(40, BS)
    live = []
    for step in range(400):
        if live and rng.random() < 0.4:
            r, computed = live.pop(rng.randrange(len(live)))
            kv.free(r, computed)
        else:
            group = rng.randrange(3)
            r = req(step, [((SHARED_PREFIX, group), 8), ((UNIQUE, step), rng.randint(1, 12))])
            hits = kv.get_computed_blocks(r, r.prompt_len)
            new = r.prompt_len - len(hits) * BS
            if kv.allocate_slots(r, 0, r.prompt_len, new, hits):
                live.append((r, r.prompt_len))
        kv.check_invariants()
        assert kv.num_used + kv.num_free == kv.num_blocks


def test_append_blocks_takes_and_evicts_what_one_append_block_per_request_would():
    """The batched call (a step's decodes, a fast-forwarded run) equals append_block request by request:
    the same block ids from the free queue's head, the same evictions; too few free blocks change nothing."""
    def state():
        kv = KVCacheManager(7, BS)
        old = req(9, [((UNIQUE, 9), 16)])
        admit(kv, old)
        kv.free(old, 16)                  # 4 cached free blocks, at the head once a and b are admitted
        a, b = req(1, [((UNIQUE, 1), 8)]), req(2, [((UNIQUE, 2), 4)])
        admit(kv, a), admit(kv, b)
        return kv, a, b

    one, a1, b1 = state()
    for r, computed in ((a1, 8), (b1, 4), (a1, 12)):
        assert one.append_block(r, computed)
    many, a2, b2 = state()
    assert many.append_blocks([a2, b2, a2])
    assert (a2.block_ids, b2.block_ids, a2.fast_limit) == (a1.block_ids, b1.block_ids, a1.fast_limit)
    assert (many.free_order(), many.evictions) == (one.free_order(), one.evictions) and many.evictions == 3
    many.check_invariants()
    assert not many.append_blocks([a2] * (many.num_free + 1)) and len(a2.block_ids) == 4 and many.num_free == 1


def test_never_used_blocks_go_first_in_id_order_then_the_freed_ones():
    # A fresh pool is the queue 0..n-1; freed blocks join behind the never-used ones, and an allocation
    # that drains the never-used ones continues with the freed ones, evicting their hashes in order.
    kv = KVCacheManager(6, BS)
    assert kv.free_order() == [0, 1, 2, 3, 4, 5]
    a, b = req(1, [((SHARED_PREFIX, 1), 8)]), req(2, [((UNIQUE, 2), 4)])   # a's blocks are cached when allocated
    admit(kv, a)
    admit(kv, b)
    assert a.block_ids == [0, 1] and b.block_ids == [2]
    kv.free(a)
    assert kv.free_order() == [3, 4, 5, 1, 0]
    c = req(3, [((UNIQUE, 3), 20)])
    admit(kv, c)
    assert c.block_ids == [3, 4, 5, 1, 0] and kv.num_free == 0 and kv.evictions == 2
    kv.check_invariants()


# ----- sliding-window groups (vLLM's hybrid allocator) -----

def sliding_kv(num_blocks, groups=2, window=3 * BS):
    return KVCacheManager(num_blocks, BS, sliding=SlidingGroups(groups, window, max_chunk=64))


def test_sliding_groups_keep_only_their_window():
    """A prompt takes its blocks in the full group and in every sliding group; each later allocation first
    gives back the sliding blocks below num_computed - window + 1 (vLLM remove_skipped_blocks), newest first
    per group, then takes the new block in every group."""
    kv = sliding_kv(40)
    a = req(1, [((UNIQUE, 1), 5 * BS)])
    admit(kv, a)
    assert len(a.block_ids) == 5 and len(a.sw_blocks) == 10 and kv.num_free == 25
    sw = list(a.sw_blocks)      # block k of group g at k * 2 + g
    # decoding token 20 (a new block): tokens below 20 - 12 + 1 = 9 are out of every window: blocks 0 and 1
    assert kv.append_block(a, 5 * BS)
    assert a.sw_start == 2 and len(a.sw_blocks) == 2 * 4 and len(a.block_ids) == 6
    assert kv.free_order()[-4:] == [sw[2], sw[0], sw[3], sw[1]]
    assert kv.num_free == 25 + 4 - 3
    # decodes keep window / block_size + 1 blocks per sliding group at a new block
    for computed in range(6 * BS, 12 * BS, BS):
        assert kv.append_block(a, computed)
        assert len(a.sw_blocks) == 2 * (3 + 1) and len(a.block_ids) == computed // BS + 1
    kv.check_invariants()
    kv.free(a)
    assert kv.num_free == 40 and a.sw_blocks == [] and a.sw_start == 0
    kv.check_invariants()


def test_sliding_groups_start_at_the_window_of_a_prefix_hit():
    kv = sliding_kv(60)
    shared = ((SHARED_PREFIX, 0), 6 * BS)
    a = req(1, [shared, ((UNIQUE, 1), BS)])
    admit(kv, a)
    kv.free(a, a.prompt_len)
    b = req(2, [shared, ((UNIQUE, 2), 2 * BS)])
    free = kv.num_free
    assert admit(kv, b) == 6 * BS
    # the window below the hit: tokens from 24 - 12 + 1 = 13 on, blocks 3.. of 8; taken in both groups
    assert b.sw_start == 3 and len(b.sw_blocks) == 2 * 5
    assert kv.num_free == free - 6 - 2 - 10
    kv.check_invariants()


def test_a_failed_sliding_allocation_keeps_what_it_gave_back():
    kv = sliding_kv(12)
    a = req(1, [((UNIQUE, 1), 4 * BS)])
    admit(kv, a)                    # 4 + 8 blocks: the pool is full
    assert kv.num_free == 0
    assert not kv.append_block(a, 4 * BS)      # blocks 0 of both groups given back (2), 3 needed
    assert kv.num_free == 2 and a.sw_start == 1 and len(a.block_ids) == 4
    kv.check_invariants()


def test_sliding_append_blocks_equals_one_append_block_per_request():
    def state():
        kv = sliding_kv(80)
        old = req(9, [((UNIQUE, 9), 4 * BS)])
        admit(kv, old)
        kv.free(old, 4 * BS)
        a, b = req(1, [((UNIQUE, 1), 5 * BS)]), req(2, [((UNIQUE, 2), 2 * BS)])
        admit(kv, a), admit(kv, b)
        return kv, a, b

    one, a1, b1 = state()
    used = []
    for r, computed in ((a1, 5 * BS), (b1, 2 * BS), (a1, 6 * BS), (b1, 3 * BS), (a1, 7 * BS)):
        assert one.append_block(r, computed)
        used.append(one.num_used)
    many, a2, b2 = state()
    used_many = []
    assert many.append_blocks([a2, b2, a2, b2, a2], used_many)
    assert used_many == used
    for x, y in ((a1, a2), (b1, b2)):
        assert (x.block_ids, x.sw_blocks, x.sw_start, x.fast_limit) == (y.block_ids, y.sw_blocks, y.sw_start,
                                                                       y.fast_limit)
    assert (many.free_order(), many.evictions) == (one.free_order(), one.evictions)
    many.check_invariants()
    assert not many.append_blocks([a2] * (many.num_free // 3 + 1))


def test_chunked_groups_keep_the_current_attention_chunk():
    """Chunked local attention (Llama-4): at each allocation the blocks before the chunk the request's next
    token is in go back (vLLM ChunkedLocalAttentionManager), all at once at a chunk boundary."""
    kv = KVCacheManager(60, BS, sliding=SlidingGroups(1, 4 * BS, max_chunk=64, chunked=True))
    a = req(1, [((UNIQUE, 1), 6 * BS)])
    admit(kv, a)
    assert len(a.block_ids) == 6 and len(a.sw_blocks) == 6
    assert kv.append_block(a, 6 * BS)       # next token 24, in the chunk from 16: blocks 0-3 go back
    assert a.sw_start == 4 and len(a.sw_blocks) == 3 and kv.num_free == 60 - 7 - 3
    assert kv.append_block(a, 7 * BS)       # same chunk: nothing goes back
    assert a.sw_start == 4 and len(a.sw_blocks) == 4
    assert kv.append_block(a, 8 * BS)       # token 32 starts a chunk: blocks 4-7 go back
    assert a.sw_start == 8 and len(a.sw_blocks) == 1
    kv.check_invariants()


def test_request_blocks_bound_a_request_by_its_window_and_one_chunk():
    sliding = SlidingGroups(6, 1024, max_chunk=8192)
    assert request_blocks(100_000, 16) == 6250
    # full group: every token; each sliding group: (1023 + 8192) / 16 rounded up, plus one
    assert request_blocks(100_000, 16, sliding) == 6250 + 6 * 577
    assert request_blocks(300, 16, sliding) == 19 * 7     # shorter than the window: every group holds it all
    chunked = SlidingGroups(3, 8192, max_chunk=8192, chunked=True)
    assert request_blocks(100_000, 16, chunked) == 6250 + 3 * 1024      # (8192 + 8192) / 16


def test_a_refused_admission_with_a_prefix_hit_leaves_no_window_state_behind():
    """A hit admission that does not fit changes nothing, so a later admission without the hit (its blocks
    evicted meanwhile) takes every block its prompt needs in the sliding groups."""
    kv = sliding_kv(30)
    shared = ((SHARED_PREFIX, 0), 6 * BS)
    a = req(1, [shared, ((UNIQUE, 1), BS)])
    admit(kv, a)
    kv.free(a, a.prompt_len)
    hog = req(2, [((UNIQUE, 2), 5 * BS)])
    admit(kv, hog)                           # 15 of the 30 blocks, from the never-used ones first
    b = req(3, [shared, ((UNIQUE, 3), 4 * BS)])
    hits = kv.get_computed_blocks(b, b.prompt_len)
    assert len(hits) == 6 and not kv.allocate_slots(b, 0, b.prompt_len, 4 * BS, hits)
    assert b.sw_start == 0 and b.sw_blocks == [] and b.block_ids == []
    kv.free(hog, hog.prompt_len)
    assert kv.allocate_slots(b, 0, b.prompt_len, b.prompt_len)    # no hit: all 10 blocks in every group
    assert len(b.block_ids) == 10 and len(b.sw_blocks) == 2 * 10 and b.sw_start == 0
    kv.check_invariants()


def test_a_private_requests_blocks_are_hashed_only_when_a_preemption_frees_them():
    # Its prompt is its own text and no later turn quotes it: only itself, after a preemption, can hit its blocks
    kv = KVCacheManager(16, BS)
    a = req(1, [((UNIQUE, 1), 12)])
    assert a.private and not req(2, [((SHARED_PREFIX, 7), 4), ((UNIQUE, 2), 8)]).private
    admit(kv, a)
    assert kv.block_hash[:3] == [None] * 3 and kv.get_computed_blocks(a, 12) == []
    kv.free(a, 12)                          # preempted: freed with 12 computed tokens, its 3 blocks cached
    a.num_preemptions += 1
    assert admit(kv, a) == 8                # its own first two blocks hit (the last prompt token is recomputed)
    kv.check_invariants()
    a.status = FINISHED
    kv.free(a, 12)
    b = req(3, [((UNIQUE, 3), 4)])
    b.status = FINISHED
    admit(kv, b)
    held = list(b.block_ids)
    kv.free(b, 4)                           # finished: never hashed (nobody can ask for it)
    assert held and all(kv.block_hash[x] is None for x in held)
    kv.check_invariants()


@pytest.mark.parametrize("blocks", [2000, 140])   # 140 blocks: preemptions, private requests hit their own blocks
def test_leaving_private_blocks_unhashed_changes_no_result(monkeypatch, blocks):
    from kernelsight.sim.engine import Engine, build_replicas
    from kernelsight.sim.pricing import StepTime
    from kernelsight.sim.scheduler import SchedulerConfig
    from kernelsight.sim.workload import Workload, WorkloadConfig

    class Linear:
        def step_time(self, batch):
            gpu = 0.006 + 4e-5 * batch.num_tokens
            return StepTime(gpu, 0.001, gpu + 0.001)

    def simulate():
        cfg = SchedulerConfig(max_num_batched_tokens=512, max_num_seqs=64, block_size=16)
        w = Workload(WorkloadConfig.from_config({"name": "poisson", "arrival": "poisson", "request_rate": 40.0,
                                                 "input": {"dist": "lognormal", "mean": 300, "sigma": 0.8,
                                                           "max": 1500},
                                                 "output": {"dist": "lognormal", "mean": 120, "sigma": 0.8,
                                                            "max": 600}}))
        engine = Engine(build_replicas(1, cfg, blocks, Linear))
        return engine.run(w.requests(400, 3))

    fast = simulate()
    monkeypatch.setattr(Request, "private", property(lambda self: False))   # every block hashed as vLLM does
    every = simulate()
    assert json.dumps(fast, sort_keys=True) == json.dumps(every, sort_keys=True)   # bit for bit, NaN too
    assert (fast["preemptions"] > 0) == (blocks == 140)
    assert (fast["prefix_cache_hit_rate"] > 0) == (blocks == 140)   # only re-admitted requests hit
