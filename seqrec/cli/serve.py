"""The serving commands of `seqrec`: `serve` (the HTTP service) and `export` (ONNX)."""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import logging
import math
import os
import signal
import socket
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

from seqrec.cli.common import zero_shot_run
from seqrec.errors import SeqrecError

ENV = "SEQREC_SERVE_OPTIONS"  # how `--workers N` hands the options to each worker process
TOKEN_ENV = "SEQREC_WRITE_TOKEN"  # the write token, where no --write-token-file is given
READY_TIMEOUT = 300  # seconds a worker replaced on SIGHUP may take to answer (--ready-timeout)


def build_app(options: dict) -> object:
    """The FastAPI app for serve options (run, index, session limits, ...)."""
    import torch
    from tqdm import tqdm

    from seqrec.serve import Recommender
    from seqrec.serve.app import create_app
    from seqrec.serve.batcher import MAX_QUEUE
    from seqrec.serve.metrics import Limits

    if options.get("threads"):
        torch.set_num_threads(int(options["threads"]))
    # tqdm's first bar (torch's export draws some) makes a process-shared lock: a named semaphore that a worker
    # replaced on SIGHUP left behind, one more for the resource tracker to warn of at each deploy
    tqdm.set_lock(threading.RLock())
    rec = Recommender.from_run(options["run"], device=options.get("device", "cpu"), index=options["index"],
                               engine=options.get("engine", "auto"))
    if rec.takes_text:  # text models: the encoder is ready before the first new item (an ID model imports none)
        with contextlib.suppress(ImportError):  # its weight-loading bar drew itself into the service's log
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
        rec.text_encoder()
    one = int(options.get("workers", 1)) == 1
    if options.get("catalogue_log"):  # every worker writes its changes there and follows the others'
        replayed, dropped = rec.keep_log(options["catalogue_log"], follow=True)
        changes = rec.catalogue_log.changes if rec.catalogue_log is not None else 0
        logging.getLogger("seqrec.serve").info(
            "catalogue log %s: %d line(s) replayed, %d change(s) made to it so far%s", options["catalogue_log"],
            replayed, changes, ", a cut-short last line dropped" if dropped else "")
    return create_app(rec, max_sessions=options["max_sessions"], session_events=options["session_events"],
                      session_ttl_s=options["session_ttl"], limits=Limits(options["max_body_bytes"]),
                      session_store=options.get("session_store"), metrics_folder=options.get("metrics_folder"),
                      catalogue_writable=one or bool(options.get("catalogue_log")),
                      max_queue=options.get("max_queue", MAX_QUEUE), fast_path=options.get("fast_path", True),
                      write_token=options.get("write_token"))


def service_logging() -> None:
    """A service's log lines: dated to the millisecond (it runs for days), one process or each of its workers
    (the CLI's own lines give the time of day only)."""
    fmt = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    logging.basicConfig(level=logging.INFO, format=fmt)  # (a worker process: nothing configured yet)
    for handler in logging.getLogger().handlers:
        if type(handler) is logging.StreamHandler:  # basicConfig's, not another's (a test's capture)
            handler.setFormatter(logging.Formatter(fmt))


def app_from_env() -> object:
    """uvicorn's factory in each worker process of `seqrec serve --workers N`."""
    service_logging()
    logging.getLogger("faiss").setLevel(logging.WARNING)  # it logs its loader choice at INFO on import
    log = logging.getLogger("seqrec.serve")
    try:
        app = build_app(json.loads(os.environ[ENV]))
    except SeqrecError as exc:  # one line, not a traceback; on a SIGHUP the old workers keep serving
        log.error("a worker could not start (uvicorn then says it was not ready in time): %s", exc)
        raise SystemExit(3) from None  # uvicorn's STARTUP_FAILURE
    rec = app.state.recommender  # type: ignore[attr-defined]
    log.info("worker %d serves %s (checkpoint %s)", os.getpid(), rec.run, rec.version)  # a deploy's progress
    return app


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from seqrec.serve.http_protocol import uvicorn_options

    run = Path(args.run)
    if not run.exists():
        raise SeqrecError(f"{run}: no such run folder")
    if not _loopback(args.host) and not args.public:
        raise SeqrecError(f"--host {args.host} is not a loopback address; add --public to serve other machines")
    if not 1 <= args.port <= 65535:
        raise SeqrecError(f"--port must be in 1..65535, got {args.port}")
    ready = READY_TIMEOUT if args.ready_timeout is None else args.ready_timeout
    for flag, value, least in (("--workers", args.workers, 1), ("--threads", args.threads, 0),
                               ("--max-sessions", args.max_sessions, 1), ("--session-events", args.session_events, 1),
                               ("--max-body-bytes", args.max_body_bytes, 1), ("--max-queue", args.max_queue, 1),
                               ("--ready-timeout", ready, 1)):
        if value < least:
            raise SeqrecError(f"{flag} must be >= {least}, got {value}")
    if args.ready_timeout is not None and args.workers == 1:
        raise SeqrecError("--ready-timeout is for --workers > 1 (one process has no workers to replace: a deploy "
                          "there is a restart)")
    from seqrec.train.device import pick_device

    args.device = str(pick_device(args.device, "--device"))  # one that is not there: a one-line error
    if not (args.session_ttl > 0 and math.isfinite(args.session_ttl)):
        raise SeqrecError(f"--session-ttl must be a finite number of seconds > 0, got {args.session_ttl}")
    for flag, path in (("--catalogue-log", args.catalogue_log), ("--session-store", args.session_store)):
        if path and not Path(path).resolve().parent.is_dir():
            raise SeqrecError(f"{flag} {path}: its folder does not exist")
    if args.session_store:  # one that cannot be opened is said once, before the workers start
        from seqrec.serve.session_store import SessionStore

        SessionStore(args.session_store)
    token = write_token(args.write_token_file)
    run = zero_shot_run(run, args.dataset, args.device)
    from seqrec.train.transfer import checkpoint_dir

    checkpoint_dir(run)  # a folder that holds no run is said as such, before a busy port is
    options = {"run": str(run), "index": args.index, "threads": args.threads, "workers": args.workers,
               "max_sessions": args.max_sessions, "session_events": args.session_events,
               "session_ttl": args.session_ttl, "max_body_bytes": args.max_body_bytes, "device": args.device,
               "engine": args.engine, "max_queue": args.max_queue, "fast_path": not args.no_fast_path,
               "catalogue_log": str(Path(args.catalogue_log).resolve()) if args.catalogue_log else None,
               "session_store": str(Path(args.session_store).resolve()) if args.session_store else None,
               "write_token": token}
    service_logging()
    logging.getLogger("seqrec.serve").setLevel(logging.INFO)
    if token is None and not _loopback(args.host):
        print(f"seqrec serve: warning: anyone who reaches {args.host}:{args.port} can add and remove items; "
              f"give a write token (--write-token-file FILE, or ${TOKEN_ENV}) to allow only its holders",
              file=sys.stderr, flush=True)
    _check_port(args.host, args.port)
    said = (f"seqrec serve: {run} on http://{args.host}:{args.port}/ (docs at /docs)"
            + (f"; main process {os.getpid()} (SIGHUP: replace the workers, loading {run} again)"
               if args.workers > 1 else ""))
    if args.workers == 1:
        app = build_app(options)  # a run or catalogue log that cannot be served is said before any address
        print(said, flush=True)
        with _says_stopped(f"seqrec serve: stopped ({run})"):  # uvicorn's own lines are below log_level
            uvicorn.run(app, host=args.host, port=args.port, **uvicorn_options())  # type: ignore[arg-type]
        return 0
    print(said, flush=True)
    # each worker builds its own app; they share the sessions through one store file (a temporary one unless
    # named), the catalogue's changes through a catalogue log, and their request counts through a folder
    with tempfile.TemporaryDirectory(prefix="seqrec-serve-") as scratch:
        if not options["session_store"]:  # made here, so that the workers starting together open a store there is
            from seqrec.serve.session_store import SessionStore

            options["session_store"] = str(Path(scratch) / "sessions.sqlite")
            SessionStore(options["session_store"])
        options["metrics_folder"] = str(Path(scratch) / "metrics")
        os.environ[ENV] = json.dumps(options)
        # SIGHUP: uvicorn replaces the workers one at a time, each new one answering before the old one stops
        with _says_stopped(f"seqrec serve: stopped ({run}, {args.workers} workers)"):
            uvicorn.run("seqrec.cli.serve:app_from_env", factory=True, host=args.host, port=args.port,
                        workers=args.workers, timeout_worker_healthcheck=ready, **uvicorn_options())
    return 0


@contextlib.contextmanager
def _says_stopped(line: str) -> Iterator[None]:
    """Print `line` when the service stops: on return, or on SIGTERM / SIGINT, which uvicorn catches to shut
    down gracefully and then raises again with the handlers it found (these): the line, then the process
    ends by the signal as it would have without them (exit status 128 + the signal's number)."""
    def stop(signum: int, frame: object) -> None:
        print(line, flush=True)
        signal.signal(signum, signal.SIG_DFL)
        signal.raise_signal(signum)

    main = threading.current_thread() is threading.main_thread()  # handlers can be set from there alone
    before = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)} if main else {}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
    print(line, flush=True)


def cmd_compact_log(args: argparse.Namespace) -> int:
    from seqrec.serve.catalogue_compact import compact

    n = compact(args.log)
    if n["bytes_before"] == 0:
        print(f"{args.log} is empty (no service has written it yet): nothing to compact")
        return 0
    print(f"{args.log}: {n['lines_before']:,} lines ({n['bytes_before'] / 1e6:.2f} MB) -> {n['lines_after']:,} "
          f"({n['bytes_after'] / 1e6:.2f} MB): {n['items']:,} items with a text, {n['removed']:,} removed"
          + (", a cut-short last line dropped" if n["dropped"] else ""))
    return 0


def cmd_carry_log(args: argparse.Namespace) -> int:
    from seqrec.serve import Recommender
    from seqrec.serve.catalogue_carry import carry

    run = Path(args.to)
    if not run.exists():
        raise SeqrecError(f"{run}: no such run folder")
    rec = Recommender.from_run(zero_shot_run(run, args.dataset, "cpu"))
    n = carry(args.log, rec.catalogue.raw_ids, str(rec.run), rec.version, rec.no_new_text, args.out)
    if n["already"]:
        print(f"{args.log} is already the catalogue log of {run}'s catalogue: left as it is")
        return 0
    print(f"{args.out or args.log}: the catalogue log of {run} ({len(rec.catalogue.raw_ids):,} items), carrying "
          f"{n['items']:,} item(s) added by text and {n['removed']:,} removal(s); not carried: "
          f"{n['texts_known']:,} text(s) of items the run knows (it keeps its own), {n['removed_unknown']:,} "
          "removal(s) of items it does not know")
    return 0


def write_token(path: str | None) -> str | None:
    """The write token: the first line of `path`, else $SEQREC_WRITE_TOKEN, else None (no token: catalogue
    changes are open). A token is 16 to 4096 visible ASCII characters (what a bearer header carries)."""
    if path is None:
        token, where = os.environ.get(TOKEN_ENV) or None, f"${TOKEN_ENV}"
        if token is None:
            return None
    else:
        try:
            lines = Path(path).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise SeqrecError(f"--write-token-file {path}: cannot be read ({getattr(exc, 'strerror', None) or exc})"
                              ) from None
        token, where = (lines[0] if lines else ""), f"--write-token-file {path}"
    token = token.strip()
    bad = sorted({c for c in token if not "!" <= c <= "~"})
    if bad:
        raise SeqrecError(f"{where}: a write token is visible ASCII characters only (no spaces); it holds "
                          f"{', '.join(map(repr, bad[:5]))}")
    if not 16 <= len(token) <= 4096:
        raise SeqrecError(f"{where}: a write token is 16 to 4096 characters long, this one {len(token)} (for "
                          "example: python -c 'import secrets; print(secrets.token_urlsafe(32))' > FILE)")
    return token


def _check_port(host: str, port: int) -> None:
    """A port another process listens on is a one-line error before the run is loaded, not uvicorn's later."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds it
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise SeqrecError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def cmd_export(args: argparse.Namespace) -> int:
    from seqrec.serve.export import export_run

    run = zero_shot_run(Path(args.run), args.dataset, "cpu")  # a pre-training run: on --dataset
    dest = Path(args.out) if args.out else run / f"export-{args.format}"
    replaced = dest.exists()
    manifest = export_run(run, dest, format=args.format, opset=args.opset)
    outputs = ", ".join(o["name"] for o in manifest["encoder"]["outputs"])
    print(f"exported {manifest['model']} -> {dest}{' (the earlier export there replaced)' if replaced else ''} "
          f"({manifest['format']}, opset {manifest['opset']}, {manifest['exporter']} exporter; outputs {outputs}; "
          f"{manifest['n_items']} items)")
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register `serve` and `export` on the top-level subparsers."""
    s = sub.add_parser("serve", help="serve a run over HTTP: recommendations, live catalogue, sessions, web page")
    s.add_argument("run", help="a run folder (or checkpoint folder), or a pre-training run with --dataset")
    s.add_argument("--dataset", help="with a pre-training run: the prepared dataset whose catalogue it serves "
                   "zero-shot (through the items' text alone)")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (default loopback only)")
    s.add_argument("--port", type=int, default=8000, help="TCP port to listen on (default 8000)")
    s.add_argument("--public", action="store_true", help="allow a non-loopback --host")
    s.add_argument("--index", choices=["exact", "hnsw", "ivf"], default="exact",
                   help="top-k retrieval: exact scoring, or a FAISS HNSW / IVF index")
    s.add_argument("--workers", type=int, default=1,
                   help="worker processes; with more than one, they share the sessions through a session store "
                        "(--session-store, or a temporary file) and the catalogue changes only through "
                        "--catalogue-log, which they share too")
    s.add_argument("--ready-timeout", type=int, default=None, metavar="S",
                   help="with --workers > 1 (default 300): on SIGHUP the workers are replaced one by one, each "
                        "new one (loading RUN again: a link switched to another run deploys that run) serving "
                        "before the old one stops; a new worker not answering within S seconds is given up and "
                        "the old ones kept. The first workers have no limit. It also bounds how long a worker "
                        "may hang before it is restarted")
    s.add_argument("--threads", type=int, default=0, help="torch threads per worker (0: torch's default)")
    s.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N, or auto (CUDA where there is one)")
    s.add_argument("--engine", choices=["auto", "torch", "onnx"], default="auto",
                   help="what encodes histories: the PyTorch model, or its encoder exported to ONNX and run by "
                        "ONNX Runtime (on the CPU; fewer microseconds per request); auto: onnx where it can, "
                        "else torch")
    s.add_argument("--max-sessions", type=int, default=10_000,
                   help="live sessions at most; one more is a 429 with Retry-After (default 10,000)")
    s.add_argument("--session-events", type=int, default=1_000,
                   help="most events in one session; one more is a 409 (default 1,000)")
    s.add_argument("--session-ttl", type=float, default=1800.0,
                   help="seconds before an idle session ends (default 1800)")
    s.add_argument("--session-store", metavar="FILE",
                   help="keep the sessions' events in this SQLite file (created if absent), which every worker "
                        "shares; sessions then outlive a restart until they idle out (default: in memory with "
                        "one worker, a temporary file with several)")
    s.add_argument("--catalogue-log", metavar="FILE",
                   help="keep the live catalogue's changes (items added or replaced by text, items removed) in "
                        "this JSON-lines file: replayed at start, appended to before each change is answered, "
                        "and followed for the changes other workers (or services on the same file) make")
    s.add_argument("--max-body-bytes", type=int, default=1 << 20,
                   help="largest request body; a larger one is a 413 (default 1 MiB; a history holds at most "
                        "10,000 items whatever the size)")
    s.add_argument("--max-queue", type=int, default=1024,
                   help="/recommend requests and session events that may wait for the model; more are answered "
                        "503 (Retry-After) (default 1,024)")
    s.add_argument("--write-token-file", metavar="FILE",
                   help="the catalogue changes (POST /items, POST /items/remove, DELETE /items/ID) need the token "
                        "on this file's first line, sent as 'Authorization: Bearer TOKEN'; the other requests "
                        f"stay open (default: ${TOKEN_ENV} if set, else no token: changes are open)")
    s.add_argument("--no-fast-path", action="store_true",
                   help="answer POST /recommend through FastAPI's routing like every other route (the same answers, "
                        "more CPU per request; for comparison)")
    s.set_defaults(fn=cmd_serve)
    c = sub.add_parser("compact-log", help="rewrite a catalogue log (serve --catalogue-log) as the fewest lines "
                                           "that replay to the same catalogue, services keeping it or not")
    c.add_argument("log", metavar="FILE", help="the catalogue log (what serve --catalogue-log was given)")
    c.set_defaults(fn=cmd_compact_log)
    c = sub.add_parser("carry-log", help="carry a catalogue log over to another run's catalogue (a deploy of a run "
                                         "trained again): items added by text and removals, services keeping "
                                         "it or not")
    c.add_argument("log", metavar="FILE", help="the catalogue log (what serve --catalogue-log was given)")
    c.add_argument("--to", required=True, metavar="RUN", help="the run that will serve the catalogue (the run "
                   "folder, or a pre-training run with --dataset)")
    c.add_argument("--dataset", help="with a pre-training run: the catalogue it will serve zero-shot")
    c.add_argument("--out", metavar="NEW", help="write the carried log to this new file and leave FILE as it is "
                   "(default: FILE replaced; the processes keeping it then take no more catalogue changes)")
    c.set_defaults(fn=cmd_carry_log)
    e = sub.add_parser("export", help="export a run's sequence encoder (ONNX) and item vectors")
    e.add_argument("run")
    e.add_argument("--dataset", help="with a pre-training run: the catalogue to export it for, zero-shot")
    e.add_argument("--format", choices=["onnx"], default="onnx")
    e.add_argument("--out", help="destination folder, replaced atomically (default RUN/export-FORMAT)")
    e.add_argument("--opset", type=int, help="ONNX opset version (default: the exporter's)")
    e.set_defaults(fn=cmd_export)
