"""Measurement and teaching instruments (``minirunner bench``, operator profiling). They drive the
runner through its public API; the runner's core never imports anything from here."""
