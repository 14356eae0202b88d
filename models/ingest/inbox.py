"""What an inbox of log files stands for: the files given, or the log files of a directory."""

from __future__ import annotations

from pathlib import Path

LOG_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet", ".gz")


def expand_paths(paths: list[str]) -> list[str]:
    """Files as given; a directory stands for the log files in it (sorted, not recursive).

    The scheduled `ingest` deployment points at an inbox directory: re-reading a file there adds
    nothing (the lake drops rows it holds), so files are never moved or deleted by ingestion.
    """
    files: list[str] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            files.extend(
                str(p) for p in sorted(path.iterdir()) if p.is_file() and p.suffix in LOG_SUFFIXES
            )
        else:
            files.append(raw)
    return files
