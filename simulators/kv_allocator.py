"""The KV allocator simulation: contiguous reservations (first fit) against paged blocks.

Owns ``simulate_allocator`` (a step-by-step model of a server filling a fixed KV budget), its result
and the block-size sweep. Pure Python/numpy; it never imports torch and never runs a model. Every
share it reports is measured over the steps where memory limits the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from simulators.kv_memory import Workload, blocks_needed, buddy_reservation, next_pow2, reserved_slots

MAX_TOKENS_MODES = ("oracle", "oracle_buddy", "pow2")

@dataclass
class AllocResult:
    """Averages over the saturated steps (at least one request still waiting after admission, so
    memory is what limits the batch), as shares of the whole KV budget; they sum to 1.

    token: slots holding a KV entry; reservation: reserved for tokens a request will still make;
    internal: allocated but never used (beyond the final length, or the end of the last block);
    external: free slots no waiting request could be given (holes too small, or too few).
    """

    policy: str
    workload: str
    budget_slots: int
    block_size: int | None
    token_share: float
    reservation_share: float
    internal_share: float
    external_share: float
    mean_running: float
    max_running: int
    num_saturated_steps: int
    num_steps: int
    num_preemptions: int
    max_slack_per_request: int  # largest (allocated - tokens - future reservation) seen
    trace: dict = field(default_factory=dict, repr=False)  # per-step arrays, for plots
    # the placement at step ``layout_step``: (start slot, slots, tokens held, request) per holder;
    # contiguous policies only (a paged request's blocks are anywhere, so it has no start)
    layout: list = field(default_factory=list, repr=False)
    layout_step: int | None = None

    @property
    def waste_share(self) -> float:
        return 1.0 - self.token_share

    def as_dict(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k not in ("trace", "layout")}
        d["waste_share"] = self.waste_share
        return d


class _FirstFit:
    """Contiguous allocation in one address range [0, size): first hole big enough wins."""

    def __init__(self, size: int):
        self.size = size
        self.blocks: dict[int, tuple[int, int]] = {}  # request -> (start, length)

    def alloc(self, rid: int, length: int) -> bool:
        start = 0
        for s, n in sorted(self.blocks.values()):
            if s - start >= length:
                break
            start = s + n
        if start + length > self.size:
            return False
        self.blocks[rid] = (start, length)
        return True

    def free(self, rid: int) -> None:
        del self.blocks[rid]


def simulate_allocator(
    workload: Workload,
    budget_slots: int,
    policy: str,
    block_size: int = 16,
    max_tokens: str | int = "oracle",
    record_trace: bool = False,
    layout_step: int | None = None,
) -> AllocResult:
    """Serve ``workload`` (all requests waiting at step 0, first come first served) with a KV
    budget of ``budget_slots`` token slots and report how the memory was used.

    Step model: a request admitted at a step holds its prompt's KV; each later step adds one
    token; it finishes when it holds prompt + output tokens and frees its memory.

    policy "max_model_len": reserve max_model_len contiguous slots per request.
    policy "max_tokens": reserve prompt + max_tokens contiguous slots (Orca-style). ``max_tokens``:
      "oracle"        exactly the output length, placed first fit (no rounding at all);
      "oracle_buddy"  the same, rounded up to a power of two as a buddy allocator does;
      "pow2"          the paper's Pow2: the output over-reserved up to 2x (its next power of two,
                      e.g. 25 -> 32), then rounded up to a power of two as a buddy allocator does;
      an int          a cap every request sends (outputs longer than the cap are cut to it).
    Buddy reservations are capped at max_model_len and placed first fit (the rounding is the
    buddy allocator's; its address alignment is not modelled).
    policy "paged": blocks of ``block_size`` slots allocated as tokens arrive; when a request needs
    a block and none is free, the most recently admitted request is preempted (its blocks freed; it
    goes back to the head of the queue and later resumes with the tokens it had). Recomputing its
    KV costs nothing here, so the paged batch size is an upper bound for a real server.

    ``layout_step``: record where every reservation sits at that step (for a memory-map picture).
    """
    if policy not in ("max_model_len", "max_tokens", "paged"):
        raise ValueError(f"unknown policy {policy!r}: max_model_len, max_tokens or paged")
    prompts = list(workload.prompt_lens)
    outputs = list(workload.output_lens)
    buddy = False
    if isinstance(max_tokens, int) and not isinstance(max_tokens, bool):
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        outputs = [min(o, max_tokens) for o in outputs]
        caps = [max_tokens] * len(prompts)
    elif max_tokens in ("oracle", "oracle_buddy"):
        caps, buddy = list(outputs), max_tokens == "oracle_buddy"
    elif max_tokens == "pow2":
        caps, buddy = [next_pow2(o) for o in outputs], True
    else:
        raise ValueError(f"max_tokens must be one of {MAX_TOKENS_MODES} or an int, got {max_tokens!r}")
    final = [p + o for p, o in zip(prompts, outputs, strict=True)]
    paged = policy == "paged"
    if paged:
        if block_size < 1:
            raise ValueError("block_size must be >= 1")
        num_blocks = budget_slots // block_size
        reserve = [blocks_needed(f, block_size) * block_size for f in final]  # only for the check
    else:
        reserve = [reserved_slots(policy, p, c, workload.max_model_len)
                   for p, c in zip(prompts, caps, strict=True)]
        if buddy and policy == "max_tokens":
            reserve = [buddy_reservation(p, c, workload.max_model_len)
                       for p, c in zip(prompts, caps, strict=True)]
    too_big = max(reserve) if not paged else blocks_needed(max(final), block_size) * block_size
    if too_big > budget_slots:
        raise ValueError(f"one request needs {too_big} slots but the budget is {budget_slots}")

    waiting = list(range(len(prompts)))  # queue, head first
    running: list[int] = []  # admission order
    tokens = [0] * len(prompts)
    blocks = [0] * len(prompts)
    free_blocks = num_blocks if paged else 0
    ff = None if paged else _FirstFit(budget_slots)
    sums = {"token": 0, "reservation": 0, "internal": 0, "external": 0, "running": 0}
    per_step: dict[str, list] = {k: [] for k in ("token", "reservation", "internal", "external",
                                                 "running", "saturated")}
    saturated_steps = max_running = preemptions = max_slack = step = 0
    layout: list = []

    while waiting or running:
        while waiting:  # admission, FCFS: stop at the first request that does not fit
            rid = waiting[0]
            n = tokens[rid] or prompts[rid]
            if paged:
                need = blocks_needed(n, block_size)
                if need > free_blocks:
                    break
                free_blocks -= need
                blocks[rid] = need
            elif not ff.alloc(rid, reserve[rid]):
                break
            tokens[rid] = n
            running.append(rid)
            waiting.pop(0)
        tok = sum(tokens[r] for r in running)
        if paged:
            alloc = sum(blocks[r] for r in running) * block_size
            res, internal = 0, alloc - tok
            slack = max((blocks[r] * block_size - tokens[r] for r in running), default=0)
        else:
            alloc = sum(reserve[r] for r in running)
            res = sum(final[r] - tokens[r] for r in running)
            internal = alloc - tok - res
            slack = max((reserve[r] - final[r] for r in running), default=0)
        max_slack = max(max_slack, slack)
        ext = budget_slots - alloc
        saturated = bool(waiting)
        if saturated:
            saturated_steps += 1
            for k, v in (("token", tok), ("reservation", res), ("internal", internal),
                         ("external", ext), ("running", len(running))):
                sums[k] += v
            max_running = max(max_running, len(running))
        if step == layout_step and ff is not None:
            layout = sorted((s, n, tokens[r], r) for r, (s, n) in ff.blocks.items())
        if record_trace:
            for k, v in (("token", tok), ("reservation", res), ("internal", internal),
                         ("external", ext), ("running", len(running)), ("saturated", saturated)):
                per_step[k].append(v)

        # advance one step: finished requests free their memory, the others grow by one token
        still = []
        for rid in running:
            if tokens[rid] >= final[rid]:
                if paged:
                    free_blocks += blocks[rid]
                else:
                    ff.free(rid)
            else:
                still.append(rid)
        running = still
        if paged:
            i = 0
            while i < len(running):
                rid = running[i]
                if blocks_needed(tokens[rid] + 1, block_size) > blocks[rid]:
                    while free_blocks == 0:
                        victim = running.pop()  # the most recently admitted request
                        free_blocks += blocks[victim]
                        blocks[victim] = 0
                        waiting.insert(0, victim)
                        preemptions += 1
                        if victim == rid:
                            break
                    if blocks[rid] == 0:  # rid preempted itself; it resumes later
                        break
                    free_blocks -= 1
                    blocks[rid] += 1
                tokens[rid] += 1
                i += 1
        else:
            for rid in running:
                tokens[rid] += 1
        step += 1

    denom = max(saturated_steps, 1) * budget_slots
    trace = {k: np.asarray(v) for k, v in per_step.items()} if record_trace else {}
    return AllocResult(
        policy=policy if policy != "max_tokens" else f"max_tokens ({max_tokens})",
        workload=workload.name,
        budget_slots=budget_slots,
        block_size=block_size if paged else None,
        token_share=sums["token"] / denom,
        reservation_share=sums["reservation"] / denom,
        internal_share=sums["internal"] / denom,
        external_share=sums["external"] / denom,
        mean_running=sums["running"] / max(saturated_steps, 1),
        max_running=max_running,
        num_saturated_steps=saturated_steps,
        num_steps=step,
        num_preemptions=preemptions,
        max_slack_per_request=max_slack,
        trace=trace,
        layout=layout,
        layout_step=layout_step,
    )


def block_size_sweep(workload: Workload, budget_slots: int,
                     block_sizes: Sequence[int] = (1, 2, 4, 8, 16, 32, 64, 128, 256)) -> list[dict]:
    """Paged simulation for each block size: token share, waste and mean batch size."""
    rows = []
    for b in block_sizes:
        r = simulate_allocator(workload, budget_slots, "paged", block_size=b)
        rows.append({"block_size": b, "token_share": r.token_share,
                     "internal_share": r.internal_share, "external_share": r.external_share,
                     "mean_running": r.mean_running, "num_preemptions": r.num_preemptions})
    return rows




POLICY_ROWS = {  # the rows notebook 02 and the CLI compare, named as in the paper where it has them
    "Max": ("max_model_len", {}),
    "Pow2": ("max_tokens", {"max_tokens": "pow2"}),
    "Oracle + buddy": ("max_tokens", {"max_tokens": "oracle_buddy"}),
    "Oracle, exact": ("max_tokens", {"max_tokens": "oracle"}),
    "paged": ("paged", {}),
}


def compare_policies(workload: Workload, budget_slots: int, block_size: int = 16) -> dict[str, AllocResult]:
    """``simulate_allocator`` for every row of ``POLICY_ROWS`` on the same workload and budget."""
    return {name: simulate_allocator(workload, budget_slots, policy, block_size=block_size, **kw)
            for name, (policy, kw) in POLICY_ROWS.items()}
