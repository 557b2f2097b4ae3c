"""The metric records ``LLM.get_metrics()`` returns, in the shape of vLLM's ``vllm.v1.metrics.reader``.

Plain dataclasses, no Prometheus dependency: a name, labels and a value, a vector of values, or a
histogram's count, sum and cumulative buckets. ``documentation`` is the ``# HELP`` line of the rendering.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Metric:
    """A metric sample: ``name`` (vLLM's, e.g. "vllm:prompt_tokens") and its key=value ``labels``."""

    name: str
    labels: dict[str, str]


@dataclass
class Counter(Metric):
    """A monotonically increasing integer counter (its name has no ``_total``; the text rendering adds it)."""

    value: int
    documentation: str = field(default="", kw_only=True)


@dataclass
class Vector(Metric):
    """An ordered array of integer counters (vLLM has one: accepted draft tokens per position)."""

    values: list[int]
    documentation: str = field(default="", kw_only=True)


@dataclass
class Gauge(Metric):
    """A numerical value that can go up or down."""

    value: float
    documentation: str = field(default="", kw_only=True)


@dataclass
class Histogram(Metric):
    """Observations in buckets: ``buckets`` maps each upper bound (Prometheus' ``le``, as a string) to the
    cumulative count of observations at or below it, "+Inf" last (equal to ``count``); ``sum`` is the
    total of the observed values."""

    count: int
    sum: float
    buckets: dict[str, int]
    documentation: str = field(default="", kw_only=True)
