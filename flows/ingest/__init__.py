"""Log ingestion: source formats, validation into the lake, quarantine, and the live stream."""
