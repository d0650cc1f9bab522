"""User-facing errors.

A `SeqrecError` is a mistake in the user's input (a missing file, a bad value).
The CLI prints its message on one line and exits non-zero, without a traceback;
anything else is a bug and keeps its traceback.
"""


class SeqrecError(Exception):
    """An error caused by the user's input; its message names the file, line or value."""
