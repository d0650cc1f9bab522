"""The manual runs: every code block marked runnable in README.md and docs/*.md, on tiny generated data.

A block is runnable when its info string carries the word `run` (```` ```bash run ```` or
```` ```python run ````; see docs/getting-started.md, "Contributing"). The blocks of one page run in order,
in one fresh folder holding `log.csv` (user_id, item_id, timestamp), `log.parquet` (another shop's
log of the same catalogue), `items.csv` (item_id, title, brand)
and a copy of `configs/`, with `$SEQREC_HOME` inside it: a page's blocks may use what its earlier blocks
made, never another page's. Shell blocks hold `seqrec` commands only (run in-process through
`seqrec.cli.main`; each must exit 0); Python blocks are executed as written.

Also: the generated pages (docs/cli.md, docs/api.md, docs/results.md and the README's headline table) are
what their generators give now.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import polars as pl
import pytest

from seqrec.cli import build_parser, main
from tests.conftest import synthetic_log

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(?P<info>[^`\n]*)\n(?P<code>.*?)^```\s*$", re.M | re.S)


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    code: str

    def where(self) -> str:
        page = self.page.relative_to(ROOT) if self.page.is_relative_to(ROOT) else self.page
        return f"{page}:{self.line}"


def runnable_blocks(page: Path) -> list[Block]:
    """The fenced blocks of `page` whose info string is `<lang> run ...`."""
    text = page.read_text()
    out = []
    for m in FENCE.finditer(text):
        words = m.group("info").split()
        if len(words) >= 2 and "run" in words[1:]:
            out.append(Block(page, text.count("\n", 0, m.start()) + 1, words[0], m.group("code")))
    return out


def shell_commands(code: str) -> list[list[str]]:
    """Each command of a shell block as argv: continuation lines joined, comments and blank lines dropped."""
    return [argv for line in code.replace("\\\n", " ").splitlines() if (argv := shlex.split(line, comments=True))]


def run_block(block: Block, capsys: pytest.CaptureFixture[str]) -> None:
    if block.lang in ("bash", "sh", "shell", "console"):
        for argv in shell_commands(block.code):
            assert argv[0] == "seqrec", f"{block.where()}: a runnable shell block runs seqrec only, not {argv[0]!r}"
            code = main(argv[1:])
            out = capsys.readouterr()
            assert code == 0, f"{block.where()}: `{shlex.join(argv)}` exited {code}: {out.err.strip()[-500:]}"
    elif block.lang == "python":
        exec(compile(block.code, block.where(), "exec"), {"__name__": "__doc_block__"})
        capsys.readouterr()
    else:
        raise AssertionError(f"{block.where()}: no runner for a runnable {block.lang!r} block")


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """What a page's runnable blocks start from: a small shop log, its item table, the shipped configs."""
    raw = synthetic_log(n_users=60, n_items=30)
    log = raw.interactions.frame.rename({"user": "user_id", "item": "item_id"})
    log.write_csv(tmp_path / "log.csv")
    other = synthetic_log(n_users=60, n_items=30, seed=1).interactions.frame  # a second shop, the same catalogue
    other.rename({"user": "user_id", "item": "item_id"}).write_parquet(tmp_path / "log.parquet")
    colours, things = ["red", "blue", "green"], ["drill", "saw", "tape", "glue", "tool"]
    pl.DataFrame({"item_id": [f"i{i}" for i in range(30)],
                  "title": [f"{colours[i % 3]} {things[i % 5]} {i}" for i in range(30)],
                  "brand": [["Acme", "Bolt"][i % 2] for i in range(30)]}).write_csv(tmp_path / "items.csv")
    shutil.copytree(ROOT / "configs", tmp_path / "configs")
    monkeypatch.setenv("SEQREC_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


RUNNABLE = [p for p in PAGES if runnable_blocks(p)]


@pytest.mark.parametrize("page", RUNNABLE, ids=[str(p.relative_to(ROOT)) for p in RUNNABLE])
def test_runnable_blocks(page: Path, workspace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for block in runnable_blocks(page):
        run_block(block, capsys)


def test_a_newcomer_finds_every_step_runnable() -> None:
    """Prepare a CSV with an item table, train, evaluate, recommend and the Python top-k: each in a tested block."""
    commands = [" ".join(argv) for p in RUNNABLE for b in runnable_blocks(p) if b.lang == "bash"
                for argv in shell_commands(b.code)]
    python = "\n".join(b.code for p in RUNNABLE for b in runnable_blocks(p) if b.lang == "python")
    for needed in ("seqrec data prepare", "--items", "seqrec train", "seqrec evaluate", "seqrec recommend",
                   "seqrec data stats", "seqrec finetune", "seqrec pretrain"):
        assert any(needed in c for c in commands), f"no runnable block has {needed!r}"
    assert "Recommender.from_run" in python and ".recommend(" in python
    readme = [b.lang for b in runnable_blocks(ROOT / "README.md")]
    assert "bash" in readme and "python" in readme


def test_a_broken_block_fails(workspace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    page = workspace / "broken.md"
    page.write_text("```bash run\nseqrec train --dataset nowhere --out runs/x\n```\n"
                    "```python run\nraise ValueError('broken')\n```\n"
                    "```bash run\nls runs\n```\n")
    bad_command, bad_python, not_seqrec = runnable_blocks(page)
    with pytest.raises(AssertionError, match="exited 2: seqrec: error: no prepared dataset"):
        run_block(bad_command, capsys)
    with pytest.raises(ValueError, match="broken"):
        run_block(bad_python, capsys)
    with pytest.raises(AssertionError, match="seqrec only"):
        run_block(not_seqrec, capsys)


def test_marker_and_continuations() -> None:
    assert shell_commands('seqrec a \\\n  --b "c d"  # why\n\n# only a comment\nseqrec e\n') == [
        ["seqrec", "a", "--b", "c d"], ["seqrec", "e"]]
    unmarked = ROOT / "README.md"
    assert "make demo" in unmarked.read_text() and not any("make demo" in b.code for b in runnable_blocks(unmarked))


SHELL = ("bash", "sh", "shell", "console")
GENERATED = ("cli.md", "api.md", "results.md")  # reference and results pages: usage text, not commands


def shown_commands(code: str) -> list[list[str]]:
    """The `seqrec` commands of a shell block that is not run (it needs a service, real data or a long
    training): each command of a pipeline or list, its environment assignments and redirection left out;
    a synopsis (`[--flag ...]`) is not a command."""
    out = []
    for line in code.replace("\\\n", " ").splitlines():
        for part in re.split(r"\s(?:\|\||&&|\||;|&)\s|\s&$", line):
            argv = shlex.split(part.split(" > ")[0].split(" 2> ")[0], comments=True)
            while argv and re.match(r"^[A-Za-z_]+=", argv[0]):
                argv = argv[1:]
            if argv and argv[0].endswith("seqrec") and not any(a.startswith("[") for a in argv):
                out.append(argv)
    return out


def test_commands_shown_but_not_run_parse() -> None:
    """Every `seqrec` command in a shell block that is not marked runnable still parses: its command and
    flags exist and its values are of their types (a renamed flag is found here, not by a reader)."""
    parser, shown = build_parser(), 0
    for page in PAGES:
        if page.name in GENERATED:
            continue
        text = page.read_text()
        for m in FENCE.finditer(text):
            words = m.group("info").split()
            if not words or words[0] not in SHELL or "run" in words[1:]:
                continue
            where = f"{page.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}"
            for argv in shown_commands(m.group("code")):
                shown += 1
                try:
                    parser.parse_args(argv[1:])
                except SystemExit as exc:
                    assert not exc.code, f"{where}: `{shlex.join(argv)}` does not parse"
    assert shown >= 30, f"only {shown} commands found: is the block search broken?"


def test_shown_commands_are_found() -> None:
    code = ("SEQREC_HOME=/x seqrec data stats a | head\nseqrec serve RUN [--port 8000]\n"
            ".venv/bin/seqrec a --b \\\n  c > out.txt\n")
    assert shown_commands(code) == [["seqrec", "data", "stats", "a"], [".venv/bin/seqrec", "a", "--b", "c"]]


def _module(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_reference_pages_are_up_to_date(tmp_path: Path) -> None:
    """docs/cli.md and docs/api.md are what docs/gen_reference.py writes now: run `make docs` after
    changing the command line or a public docstring."""
    gen = _module(ROOT / "docs" / "gen_reference.py", "gen_reference")
    for path in gen.write(tmp_path):
        committed = ROOT / "docs" / path.name
        assert committed.is_file() and committed.read_text() == path.read_text(), (
            f"docs/{path.name} is out of date: run `make docs`")


def test_results_pages_are_generated(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/results.md and the README's headline table are what benchmarks/report.py writes from
    benchmarks/results/*.json: no number typed by hand. Run `python benchmarks/report.py` after a benchmark."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    for name in ("common", "tables", "report"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    report = _module(ROOT / "benchmarks" / "report.py", "report")
    assert (ROOT / "docs" / "results.md").read_text() == "\n".join(report.results_page()), (
        "docs/results.md is out of date: run `python benchmarks/report.py`")
    readme = (ROOT / "README.md").read_text()
    block = readme.split(report.START, 1)[1].split(report.END, 1)[0]
    assert block == "\n" + "\n".join(report.headline()) + "\n", "README's headline table is out of date"
