"""Engine metrics: vLLM's Prometheus metric records (reader.py) and the engine's one set of counters,
gauges and histograms behind ``LLM.get_metrics()`` and the server's ``/metrics`` (stats.py)."""
