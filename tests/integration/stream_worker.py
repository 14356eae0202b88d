"""A stream consumer run as its own process, so a test can SIGKILL it mid-batch.

Usage: python stream_worker.py REDIS_URL LAKE_DIR STREAM MARKER_FILE
It processes one batch; after the lake commit and before XACK it creates MARKER_FILE and
waits to be killed.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import redis

from data_contracts.lake import Lake
from models.ingest.stream import StreamConsumer


def main() -> None:
    url, lake_dir, stream, marker = sys.argv[1:5]

    def wait_to_be_killed(entry_ids: list[str]) -> None:
        Path(marker).write_text(str(len(entry_ids)))
        time.sleep(120)

    client = redis.Redis.from_url(url)
    consumer = StreamConsumer(
        client,
        Lake(Path(lake_dir)),
        stream,
        "victim",
        batch_size=400,
        after_write=wait_to_be_killed,
    )
    consumer.ensure_group()
    consumer.run_once(block_ms=5000)


if __name__ == "__main__":
    main()
