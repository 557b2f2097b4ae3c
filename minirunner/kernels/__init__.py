"""Kernels of minirunner: each Triton kernel sits beside a plain-torch twin with the same signature.

The torch twins are the readable reference (and the CPU path); the Triton versions run compiled on a GPU
and in the Triton interpreter (TRITON_INTERPRET=1) on CPU. Nothing here imports minirunner.
"""
