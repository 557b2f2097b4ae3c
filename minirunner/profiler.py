"""The profiler around an LLM's engine steps (vLLM's ``LLM.start_profile`` / ``stop_profile``).

Owns starting torch.profiler, marking each engine step, and writing the Chrome / Perfetto trace into the
folder the user names, else into a fresh private temporary folder (``mkdtemp``: never a fixed shared
name another user could plant a symlink at).
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import torch

from minirunner import envs


class StepProfiler:
    """One optional torch.profiler run over the steps of an engine on ``device``."""

    def __init__(self, device: torch.device):
        self.device = device
        self.profiler: torch.profiler.profile | None = None
        self.folder: Path | None = None

    def start(self, trace_dir: str | Path | None = None) -> None:
        if self.profiler is not None:
            raise ValueError("a profile is already running: call stop_profile() first")
        named = trace_dir or envs.VLLM_TORCH_PROFILER_DIR
        self.folder = Path(named) if named else None  # None: a private folder, made when writing
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.profiler = torch.profiler.profile(activities=activities)
        self.profiler.start()

    def step(self, run):
        """``run()`` (one engine step), marked as a "LLMEngine.step" range when profiling."""
        if self.profiler is None:
            return run()
        with torch.profiler.record_function("LLMEngine.step"):
            return run()

    def stop(self) -> Path:
        if self.profiler is None:
            raise ValueError("no profile is running: call start_profile() first")
        profiler, self.profiler = self.profiler, None
        profiler.stop()
        if self.folder is None:
            folder = Path(tempfile.mkdtemp(prefix="minirunner_profile_"))  # mode 0700, a new name
        else:
            folder = self.folder
            folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"minirunner_trace_{os.getpid()}_{time.time_ns()}.json"
        profiler.export_chrome_trace(str(path))
        print(f"profiler trace written to {path} (open it at https://ui.perfetto.dev)")
        return path
