"""The A/B replay: a trace against the hybrid cache with and without warm-up (issue 7)."""
