"""The node's memory as the gateway reports it: the accelerator's when the model is on CUDA,
and the process's resident set always (the only meaningful number on a CPU node, and what an
upstream-backed gateway costs its host).

torch is looked up, never imported: a gateway in front of an upstream server does not load it,
and asking a process that never touched CUDA would initialise a CUDA context (hundreds of MB).
"""

from __future__ import annotations

import os
import resource
import sys
from pathlib import Path


def accelerator_memory() -> list[tuple[str, str, float]]:
    """(device, source, bytes) samples: `cuda_allocated` (tensors) and `cuda_reserved` (the
    caching allocator's pool) per initialised CUDA device, and `process_rss` for this process
    (`process_peak_rss` where /proc is missing)."""
    samples: list[tuple[str, str, float]] = []
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        for index in range(torch.cuda.device_count()):
            device = f"cuda:{index}"
            samples.append((device, "cuda_allocated", float(torch.cuda.memory_allocated(index))))
            samples.append((device, "cuda_reserved", float(torch.cuda.memory_reserved(index))))
    samples.append(("cpu", *process_rss()))
    return samples


def process_rss() -> tuple[str, float]:
    """(source, bytes): the current resident set from /proc, else the peak from getrusage."""
    statm = Path("/proc/self/statm")
    if statm.is_file():
        pages = int(statm.read_text().split()[1])
        return "process_rss", float(pages * os.sysconf("SC_PAGE_SIZE"))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return "process_peak_rss", float(peak if sys.platform == "darwin" else peak * 1024)
