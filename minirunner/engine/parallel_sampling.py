"""Parallel sampling (``n > 1``): one prompt, n completions that share the prompt's KV blocks.

Owns the child requests' ids and seeds and the fork after the prompt: completion 0 computes the prompt;
once it has, completions 1..n-1 take references to its blocks (``KVCacheManager.fork``) and each
recomputes only the last prompt token to draw its own first token. A shared block is copied on its first
write (copy-on-write, the PagedAttention paper's §4.4). Never runs the model.
"""

from __future__ import annotations

from minirunner.engine.request import Request, RequestStatus

_MASK64 = (1 << 64) - 1
_SEED_MASK = (1 << 63) - 1


def child_seed(seed: int, index: int) -> int:
    """The seed of completion ``index`` of a request seeded ``seed``: completion 0 keeps the seed (so
    n=1 and completion 0 of n>1 draw the same tokens), the others get a splitmix64 mix of (seed,
    index): distinct, reproducible, and independent of the batch."""
    if index == 0:
        return seed
    z = (seed + index * 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) & _SEED_MASK


def child_id(group_id: str, index: int) -> str:
    """Completion 0 keeps the group's id (so an n=1 request is unchanged); the others add '#i'."""
    return group_id if index == 0 else f"{group_id}#{index}"


def fork_children(parent: Request, kv) -> list[Request]:
    """Completion 0 has just computed its prompt: give every waiting sibling the prompt's blocks.
    Returns the forked siblings, in index order, for the scheduler to queue ahead of new requests
    (``Scheduler.add_forked``, which sets where each starts: the last prompt token, recomputed)."""
    children, parent.fork_children = parent.fork_children, []
    forked = []
    for child in children:
        if child.is_finished:  # aborted before the fork
            continue
        kv.fork(parent, child)
        child.status = RequestStatus.WAITING
        forked.append(child)
    return forked
