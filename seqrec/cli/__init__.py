"""The `seqrec` command. The only package that reads argv or owns console output.

One module per command group (`data`, `train`, `recommend`, `text`, `serve`), each registering its
commands with `add_commands(sub)`; `common` holds what they share. Command modules import `common`
and never each other; this module assembles the parser and runs a command.
"""

from __future__ import annotations

import argparse
import difflib
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
    for parser in _parsers(p):  # a flag is spelled out: `--text-templat` is not taken for `--text-template`
        parser.allow_abbrev = False
    return p


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """`parser` and every (sub)command parser beneath it."""
    out = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):  # (an alias maps to the same parser)
                out += _parsers(child)
    return out


def _command_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the (sub)command `args` were parsed for: its usage, not the top level's."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and getattr(args, action.dest, None) in action.choices:
            return _command_parser(action.choices[getattr(args, action.dest)], args)
    return parser


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """argv parsed; arguments the command does not take are refused by that command's parser (its usage),
    with the flag it most likely meant."""
    top = build_parser()
    args, extra = top.parse_known_args(argv)
    if extra:
        parser = _command_parser(top, args)
        flags = [o for a in parser._actions for o in a.option_strings]
        message = f"unrecognized arguments: {' '.join(extra)}"
        for arg in extra:
            close = difflib.get_close_matches(arg.split("=", 1)[0], flags, n=1) if arg.startswith("-") else []
            if close:
                message += f" (did you mean {close[0]}?)"
                break
        parser.error(message)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
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
