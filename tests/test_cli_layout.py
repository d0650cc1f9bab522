"""The CLI package has no import cycle: each command module imports `seqrec.cli.common` and no other
command module, and each module imports on its own in a fresh interpreter."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

CLI = Path(__file__).resolve().parents[1] / "seqrec" / "cli"
COMMAND_MODULES = ["data", "train", "recommend", "text", "serve"]


def cli_imports(path: Path) -> set[str]:
    """The `seqrec.cli...` modules a file imports, at any depth (function-local imports included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("seqrec.cli")}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.name}: relative import"
            if node.module == "seqrec.cli":  # `from seqrec.cli import x` names a submodule or the package
                found |= {f"seqrec.cli.{a.name}" for a in node.names}
            elif node.module and node.module.startswith("seqrec.cli"):
                found.add(node.module)
    return found


def test_the_package_holds_exactly_these_modules() -> None:
    assert sorted(p.stem for p in CLI.glob("*.py")) == sorted(["__init__", "__main__", "common", *COMMAND_MODULES])
    for path in CLI.glob("*.py"):
        assert len(path.read_text().splitlines()) < 400, path.name


@pytest.mark.parametrize("name", COMMAND_MODULES)
def test_command_modules_import_only_common(name: str) -> None:
    assert cli_imports(CLI / f"{name}.py") <= {"seqrec.cli.common"}


def test_common_imports_no_command_module() -> None:
    assert cli_imports(CLI / "common.py") == set()


@pytest.mark.parametrize("name", ["seqrec.cli", "seqrec.cli.common", *(f"seqrec.cli.{m}" for m in COMMAND_MODULES)])
def test_each_module_imports_alone(name: str) -> None:
    proc = subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_python_dash_m_runs_the_cli() -> None:
    proc = subprocess.run([sys.executable, "-m", "seqrec.cli", "--help"], capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=120)
    assert proc.returncode == 0 and proc.stdout.startswith("usage: seqrec"), proc.stderr


def test_the_workers_factory_string_resolves() -> None:
    """`serve --workers N` hands uvicorn an import string; it must name the factory that exists."""
    uvicorn = pytest.importorskip("uvicorn")
    from seqrec.cli import serve

    target = "seqrec.cli.serve:app_from_env"
    assert f'"{target}"' in (CLI / "serve.py").read_text()
    assert uvicorn.importer.import_from_string(target) is serve.app_from_env


def test_a_worker_that_cannot_start_says_why_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    """On a deploy (SIGHUP) a new worker may find no run behind the link: it exits with uvicorn's startup
    failure status (the old workers are kept) and logs one line, not a traceback."""
    import json
    import logging

    from seqrec.cli import serve

    monkeypatch.setenv(serve.ENV, json.dumps({"run": str(tmp_path / "gone"), "index": "exact"}))
    with caplog.at_level(logging.ERROR, logger="seqrec.serve"), pytest.raises(SystemExit) as exit_:
        serve.app_from_env()
    assert exit_.value.code == 3
    gone = tmp_path / "gone"
    assert [r.getMessage() for r in caplog.records] == [
        "a worker could not start (uvicorn then says it was not ready in time): "
        f"{gone}: no such run folder"]
