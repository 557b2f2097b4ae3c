"""argparse types for the simulators' command lines: integers within bounds and finite floats.

Owns refusing, as an argparse error (exit code 2, the flag named), a count so large that a simulator
would run for minutes or exhaust memory, a negative count, and NaN or infinite numbers.
"""

from __future__ import annotations

import argparse
import math


def bounded_int(low: int, high: int):
    """An argparse type: an integer within low..high."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be within {low}..{high}, got {value}")
        return value
    parse.__name__ = f"integer in {low}..{high}"
    return parse


def finite_float(low: float, high: float):
    """An argparse type: a finite number within low..high (NaN and infinities refused)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
        if not math.isfinite(value) or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be a finite number within {low:g}..{high:g}, got {text}")
        return value
    parse.__name__ = f"number in {low:g}..{high:g}"
    return parse
