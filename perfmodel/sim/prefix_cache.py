"""A preempted request's KV kept by a prefix cache until the free queue reaches it (vLLM V1).

vLLM V1 (``enable_prefix_caching`` on by default) does not drop a preempted request's
blocks: they return to the free block queue with their hashes. The queue is LRU:
allocations pop its head (evicting the cached block there), a freed request's blocks
join the tail in reverse order (its last block nearest the head, so a request's tail is
evicted first and what survives is a prefix), and a request re-admitted with cached
blocks takes them out of the queue ("touch") wherever they are. So when the victim
comes back it recomputes only what the allocations since its preemption ate of it
(``docs/design/prefix_caching.md``: Free, Eviction (LRU), Block Allocation).

:class:`FreeQueueCache` tracks that in token units, lazily: the queue is a stream, with
``U`` = tokens allocated from it so far (``kv_used + freed − touched``). A victim freed
with ``ahead`` free tokens in front of it has been eaten by ``U − U₀ − (ahead − t)``
tokens, ``t`` being what earlier victims' touches took out of the part ahead of it.
Only whole blocks are cached: the partial last block is lost, and the eaten part is
rounded up to blocks. A request whose whole context survives still recomputes its last
token (V1 needs a token to schedule). Completed requests' blocks are never hit again
(every prompt is distinct), so they only count as free space.
"""

from __future__ import annotations


class FreeQueueCache:
    """The preempted requests' cached prefixes in the free queue, in preemption order."""

    __slots__ = ("block", "freed", "n", "touched", "victims")

    def __init__(self, block_tokens: int) -> None:
        self.block = block_tokens
        self.freed = 0  # tokens ever returned to the free queue
        self.touched = 0  # tokens ever taken back out of it by a cache hit
        self.n = 0  # preemptions so far (the order of the victims in the queue)
        # request -> [order, U₀, free tokens ahead of it, tokens held, touched ahead since]
        self.victims: dict[int, list[int]] = {}

    def preempt(self, r: int, held: int, kv_used_after: int, capacity: int) -> None:
        """Request ``r`` freed ``held`` tokens; ``kv_used_after`` is the use once freed."""
        self.freed += held
        self.n += 1
        ahead = capacity - kv_used_after - held  # free tokens already queued in front
        self.victims[r] = [self.n, kv_used_after + self.freed - self.touched, ahead, held, 0]

    def cached(self, r: int, kv_used: int, context: int) -> int:
        """Tokens of ``r``'s ``context`` still cached now (0 if ``r`` was never preempted)."""
        v = self.victims.get(r)
        if v is None:
            return 0
        _, u0, ahead, held, t_ahead = v
        eaten = kv_used + self.freed - self.touched - u0 - (ahead - t_ahead)
        b = self.block
        partial = held % b  # the last, partial block is not cached: eaten first
        eaten_blocks = -(-max(0, eaten - partial) // b)
        return max(0, min(max(0, held // b - eaten_blocks) * b, context - 1))

    def take(self, r: int, kept: int) -> None:
        """``r`` is re-admitted with ``kept`` cached tokens: they leave the queue."""
        v = self.victims.pop(r, None)
        if v is None or kept <= 0:
            return
        self.touched += kept
        for w in self.victims.values():  # victims freed after r had r's blocks ahead
            if w[0] > v[0]:
                w[4] += kept
