"""The `seqrec` command. The only package that reads argv or owns console output.

One module per command group (`data`, `train`, `recommend`, `text`, `serve`), each registering its
commands with `add_commands(sub)`; `common` holds what they share. Command modules import `common`
and never each other; this module assembles the parser and runs a command.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from seqrec import __version__
from seqrec.cli import data, recommend, serve, text, train
from seqrec.errors import SeqrecError

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="seqrec", description="Sequential recommendation.")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    p.add_argument("--version", action="version", version=f"seqrec {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    for group in (data, train, recommend, text, serve):  # the order of `seqrec --help`
        group.add_commands(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("faiss").setLevel(logging.WARNING)  # it logs its loader choice at INFO on import
    try:
        return int(args.fn(args))
    except SeqrecError as exc:
        print(f"seqrec: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `seqrec ... | head`: the reader left; not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:  # the file system refused (no such folder, no permission, disk full): no traceback
        if args.verbose:
            raise
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"seqrec: error: {where}{exc.strerror or exc} (a file or folder could not be read or written)",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("seqrec: interrupted", file=sys.stderr)
        return 130
