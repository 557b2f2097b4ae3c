"""The scheduler's waiting queue under each scheduling policy (vLLM's ``request_queue.py``): FCFS, or
priority (lowest value first, ties by arrival), and the order running requests are served and preempted in.

Owns the order of waiting and running requests and the check of a request's ``priority`` argument;
the scheduler (engine/scheduler.py) decides what runs.
"""

from __future__ import annotations

import bisect
from collections import deque

SCHEDULING_POLICIES = ("fcfs", "priority")


def check_priority(priority, policy: str) -> int:
    """vLLM's rule: a priority is an integer (lower runs first) and only the "priority" policy takes a
    non-zero one. Raises ValueError with vLLM's phrase and what to do."""
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ValueError(f"priority must be an integer (lower values are served first), got {priority!r}")
    if priority != 0 and policy != "priority":
        raise ValueError(f"Got priority {priority} but Priority scheduling is not enabled: pass "
                         "LLM(scheduling_policy='priority') (the default 'fcfs' serves in arrival order)")
    return priority


def check_priorities(priority, num_prompts: int, policy: str) -> list[int]:
    """``LLM.generate``'s ``priority``: None (all 0) or one integer per prompt, each checked."""
    if priority is None:
        return [0] * num_prompts
    if isinstance(priority, (str, bytes)) or not hasattr(priority, "__len__") or len(priority) != num_prompts:
        got = repr(priority) if isinstance(priority, (str, bytes)) or not hasattr(priority, "__len__") \
            else f"{len(priority)} priorities"
        raise ValueError(f"got {got} for {num_prompts} prompts: the lengths of prompts and priority must "
                         "be the same (one integer per prompt)")
    return [check_priority(p, policy) for p in priority]


def check_policy(policy) -> None:
    if policy not in SCHEDULING_POLICIES:
        raise ValueError(f"scheduling_policy must be one of {list(SCHEDULING_POLICIES)}, got {policy!r}")


def priority_key(request) -> tuple:
    """Served first: the lowest priority value, then the earliest arrival, then the lowest completion
    index (an n > 1 group's completions share their parent's place)."""
    return request.priority, request.arrival_time, request.index


class FCFSRequestQueue(deque):
    """Waiting requests in arrival order; a preempted request goes back to the front."""

    @staticmethod
    def add_running(running: list, request) -> None:
        """Admitted requests run in admission order; the newest is preempted first (``running.pop()``)."""
        running.append(request)


class PriorityRequestQueue:
    """Waiting requests kept sorted by ``priority_key``: a preempted request, or a forked completion,
    goes back to its place by priority and arrival, not to the front. The deque methods the scheduler
    uses (append, appendleft, extendleft, popleft, remove, [0], iteration) all keep that order."""

    def __init__(self):
        self._items: list = []

    def append(self, request) -> None:
        bisect.insort(self._items, request, key=priority_key)

    appendleft = append

    def extendleft(self, requests) -> None:
        for request in requests:
            self.append(request)

    def popleft(self):
        return self._items.pop(0)

    def remove(self, request) -> None:
        self._items.remove(request)

    def __getitem__(self, i):
        return self._items[i]

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self):
        return iter(self._items)

    def __reversed__(self):
        return reversed(self._items)

    @staticmethod
    def add_running(running: list, request) -> None:
        """Running requests are kept in priority order too: the scheduler serves them in list order
        and preempts from the end, so the victim is vLLM's: the lowest priority (largest value), latest
        arrival. Serving in this order also means a request already scheduled this step is never the
        one preempted."""
        bisect.insort(running, request, key=priority_key)


def create_request_queue(policy: str):
    check_policy(policy)
    return PriorityRequestQueue() if policy == "priority" else FCFSRequestQueue()
