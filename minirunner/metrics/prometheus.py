"""Prometheus text exposition (format 0.0.4) of the engine's metrics, for the server's ``GET /metrics``.

Owns rendering a list of metric records (minirunner/metrics/reader.py: Counter, Gauge, Histogram, Vector)
as ``# HELP`` / ``# TYPE`` lines and samples; counters gain ``_total``, as prometheus_client writes them.
"""

from __future__ import annotations

import math


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: dict[str, str], **extra: str) -> str:
    items = {**labels, **extra}
    if not items:
        return ""
    return "{" + ",".join(f'{k}="{_escape(str(v))}"' for k, v in items.items()) + "}"


def _number(x: float) -> str:
    if isinstance(x, bool):
        x = int(x)
    if isinstance(x, int):
        return str(x)
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    return repr(float(x))


def _kind(metric) -> str:
    """The record's Prometheus type, from its class (reader.py's names)."""
    return type(metric).__name__.lower()


def render(metrics: list) -> str:
    """The text exposition of ``metrics``: one HELP / TYPE header per metric name (records sharing a name,
    e.g. one per label set, are grouped under it), then their samples."""
    families: dict[str, list] = {}
    for m in metrics:
        families.setdefault(m.name, []).append(m)
    lines: list[str] = []
    for name, records in families.items():
        kind = _kind(records[0])
        doc = _escape(getattr(records[0], "documentation", "") or name)
        ptype = {"counter": "counter", "gauge": "gauge", "histogram": "histogram"}.get(kind, "counter")
        family = f"{name}_total" if ptype == "counter" else name  # as prometheus_client names it
        lines.append(f"# HELP {family} {doc}")
        lines.append(f"# TYPE {family} {ptype}")
        for m in records:
            if kind == "counter":
                lines.append(f"{name}_total{_labels(m.labels)} {_number(m.value)}")
            elif kind == "gauge":
                lines.append(f"{name}{_labels(m.labels)} {_number(m.value)}")
            elif kind == "histogram":
                for le, count in m.buckets.items():
                    lines.append(f"{name}_bucket{_labels(m.labels, le=le)} {_number(count)}")
                lines.append(f"{name}_sum{_labels(m.labels)} {_number(m.sum)}")
                lines.append(f"{name}_count{_labels(m.labels)} {_number(m.count)}")
            else:  # a Vector: one counter per position, as vLLM exports accepted tokens per position
                for pos, value in enumerate(m.values):
                    lines.append(f"{name}_total{_labels(m.labels, position=str(pos))} {_number(value)}")
    return "\n".join(lines) + "\n"

