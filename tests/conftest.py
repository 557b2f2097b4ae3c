"""Shared test setup. TRITON_INTERPRET must be set before triton is first imported (CPU machines)."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
