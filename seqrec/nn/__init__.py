"""Shared layers: embeddings, transformer blocks, scoring heads, losses."""
