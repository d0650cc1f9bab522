"""Readers, preparation, splits, batching and text encoding."""
