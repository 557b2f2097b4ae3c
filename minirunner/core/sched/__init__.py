"""The scheduler's output as data (output.py), read by the engine and the worker alike."""
