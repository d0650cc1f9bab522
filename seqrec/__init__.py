"""seqrec: sequential recommendation with transferable, text-based item representations."""

__version__ = "0.1.0"
