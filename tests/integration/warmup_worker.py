"""A warm-up executor run as its own process, so a test can SIGKILL it mid-plan.

Usage: python warmup_worker.py DATA_DIR PLAN_ID MODEL_DIR REDIS_URL STALL_AFTER MARKER_FILE
It executes the plan's pending items from the ledger (registered by the test) with the tiny LLM
into the node cache (memory + SSD + Redis). Its backend call number STALL_AFTER + 1 warms
normally (the pages reach the cache), then creates MARKER_FILE and waits to be killed: the kill
lands between an item's cache write and its ledger mark, the worst place for idempotence.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import torch

from models.warmup.execute import WarmLedger, backend_target, execute_batch
from models.warmup.run import BackendSpec, NodeResources, shared_resources


class StallingBackend:
    """Delegates to a real backend; stalls after the write of call `stall_after + 1`."""

    def __init__(self, inner: Any, stall_after: int, marker: Path) -> None:
        self._inner, self._left, self._marker = inner, stall_after, marker

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def warm_prefix(self, *args: Any, **kwargs: Any) -> Any:
        result = self._inner.warm_prefix(*args, **kwargs)
        if self._left == 0:
            self._marker.write_text(str(args[1])[:80])
            time.sleep(120)
        self._left -= 1
        return result


def main() -> None:
    data_dir, plan, model_dir, redis_url, stall_after, marker = sys.argv[1:7]
    torch.set_num_threads(1)
    spec = NodeResources(BackendSpec("hf", model_dir), data_dir, redis_url, 1 << 20, 2 << 20)
    backend, cache = shared_resources(spec)
    ledger = WarmLedger(WarmLedger.path_for(data_dir, plan), backend_target(backend))
    stalling = StallingBackend(backend, int(stall_after), Path(marker))
    execute_batch(ledger.items(pending_only=True), stalling, cache, ledger)


if __name__ == "__main__":
    main()
