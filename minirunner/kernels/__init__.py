"""Kernels of minirunner: each Triton kernel sits beside a plain-torch twin with the same signature.

The torch twins are the readable reference (and the CPU path); the Triton versions run compiled on a GPU
and in the Triton interpreter (TRITON_INTERPRET=1) on CPU. One kernel is C: the CPU's paged decode
attention (paged_decode_cpu.c, built and loaded by paged_decode_cpu.py), the twin of
``paged_attention_ref.paged_decode_ref`` that compiled CPU decode steps call. Nothing here imports
minirunner.
"""
