"""Recommendations from a saved run."""

from seqrec.serve.recommender import Recommendation, Recommender

__all__ = ["Recommendation", "Recommender"]
