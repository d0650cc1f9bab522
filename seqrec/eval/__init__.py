"""Metrics from ranks, and streaming full ranking."""
