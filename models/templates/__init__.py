"""Prompt embeddings, template mining and semantic keys (issue 6)."""
