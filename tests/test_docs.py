"""The docs a user copies from work: every shell example parses against the real CLI, the marked
walk-throughs run for real at tiny scale, and the generated pages are fresh.

Examples come from README.md, docs/**/*.md and the epilog of every ``--help``. A fenced block
(bash/sh/shell/console) is checked command by command: each ``lmforge ...`` command must be
accepted by ``lmforge.cli.build_parser()``, and a repository path it names (docs/, bench/, scripts/)
must exist. A block preceded by the line ``<!-- test: run -->`` is also run (bash, or Python for a python block), in
order with the other such blocks of its page, in one fresh folder per page.  A python block preceded by
``<!-- test: run while serving FOLDERS -->`` runs while ``lmforge serve FOLDERS`` answers on a free port,
which replaces the ``127.0.0.1:8000`` of the block.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import THREADS_PINNED_HERE

from lmforge.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
SHELLS = {"bash", "sh", "shell", "console"}
RUN_MARK = re.compile(r"^<!-- test: run(?: while serving (?P<serving>[^>]+?))? -->$")
SERVED_AT = "127.0.0.1:8000"
FENCE = re.compile(r"^```(\w*)\s*$")
REPO_PATH = re.compile(r"^(docs|bench|scripts)/[\w./-]+$")


def doc_pages() -> list[Path]:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [p for p in pages if p.name != "cli.md" and p.exists()]  # cli.md repeats the epilogs


def blocks(text: str) -> list[tuple[int, str, str, bool, str | None]]:
    """(line, language, body, marked to run, folders to serve while it runs) of each fenced block of a page."""
    out, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, lang, body = i, m.group(1).lower(), []
        i += 1
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        marks = [m for j in range(max(0, start - 2), start) if (m := RUN_MARK.match(lines[j].strip()))]
        serving = marks[0].group("serving") if marks else None
        out.append((start + 1, lang, "\n".join(body), bool(marks), serving))
        i += 1
    return out


def commands(script: str) -> list[str]:
    """The shell commands of a script: continuations joined, prompts and comments dropped, split at ; && || |."""
    joined = re.sub(r"\\\n\s*", " ", script)
    out, variables = [], {}
    for line in joined.splitlines():
        line = line.strip()
        if line.startswith("$ "):
            line = line[2:]
        line = re.sub(r"\$\{?(\w+)\}?", lambda m: variables.get(m.group(1), m.group(0)), line)
        assignment = re.match(r"^(\w+)=(.*)$", line)
        if assignment:  # NAME=value on its own line: later lines use it
            with contextlib.suppress(ValueError):
                variables[assignment.group(1)] = " ".join(shlex.split(assignment.group(2)))
            continue
        try:
            tokens = shlex.split(line, comments=True)
        except ValueError:
            continue
        current: list[str] = []
        for tok in tokens + [";"]:
            if tok in (";", "&&", "||", "|", "&"):
                if current:
                    out.append(shlex.join(current))
                current = []
            else:
                current.append(tok)
    return out


def lmforge_args(command: str) -> list[str] | None:
    """The arguments after ``lmforge`` (through torchrun --no-python, nohup, env settings), else None."""
    tokens = shlex.split(command)
    for i, tok in enumerate(tokens):
        if tok == "lmforge" or tok.endswith("/lmforge"):
            return tokens[i + 1 :]
    return None


def epilog_examples() -> list[tuple[str, str]]:
    """(where, command) of every `lmforge ...` line in a --help epilog, subcommands included."""
    import argparse

    out = []

    def walk(parser, path):
        if parser.epilog:
            out.extend((f"{path} --help", c) for c in commands(parser.epilog) if lmforge_args(c) is not None)
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{path} {name}")

    walk(build_parser(), "lmforge")
    return out


def all_examples() -> list[tuple[str, str]]:
    out = []
    for page in doc_pages():
        for line, lang, body, _, _ in blocks(page.read_text(encoding="utf-8")):
            if lang in SHELLS:
                out += [(f"{page.relative_to(ROOT)}:{line}", c) for c in commands(body)]
    return out + epilog_examples()


def _parse_error(argv: list[str]) -> str | None:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            build_parser().parse_args(argv)
    except SystemExit as e:
        if e.code not in (0, None):
            return err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else f"exit {e.code}"
    return None


def test_examples_are_found():
    found = [c for _, c in all_examples() if lmforge_args(c) is not None]
    assert len(found) >= 20, f"only {len(found)} lmforge examples found in the docs and --help"


def test_every_example_parses_and_its_repository_paths_exist():
    problems = []
    for where, command in all_examples():
        argv = lmforge_args(command)
        if argv is None:
            continue
        error = _parse_error(argv)
        if error:
            problems.append(f"{where}: `{command}`: {error}")
        for tok in argv:
            value = tok.split("=", 1)[-1]
            if REPO_PATH.match(value) and not (ROOT / value).exists():
                problems.append(f"{where}: `{command}`: {value} is not in the repository")
    assert not problems, "examples a user would copy fail:\n" + "\n".join(problems)


def test_parse_check_catches_a_bad_example():
    assert _parse_error(["pretrain", "bert", "--no-such-flag"]) is not None
    assert _parse_error(["pretrain", "bert", "--data", "d", "--out", "o"]) is None


def _run_pages() -> list[Path]:
    return [p for p in doc_pages() if any(b[3] for b in blocks(p.read_text(encoding="utf-8")))]


@contextlib.contextmanager
def _serving(folders: str | None, cwd: Path, env: dict):
    """``lmforge serve FOLDERS`` on a free loopback port while the block runs; yields the port (None: no server)."""
    if folders is None:
        yield None
        return
    import socket
    import time
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(["lmforge", "serve", *shlex.split(folders), "--port", str(port)], cwd=cwd, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, f"lmforge serve {folders} ended: {server.stderr.read()[-2000:]}"
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    break
            assert time.monotonic() < deadline, f"lmforge serve {folders} did not answer in 120 s"
            time.sleep(0.2)
        yield port
    finally:
        server.terminate()
        server.wait(timeout=60)


QUICK_DEMO = re.compile(r"^lmforge demo --quick --out (\S+)", re.M)


@pytest.mark.slow
@pytest.mark.parametrize("page", _run_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_marked_walkthroughs_run(page, tmp_path, request):
    # a page that builds the quick demo starts from a copy of the session's (conftest.py's quick_demo): its own
    # `lmforge demo --quick --out DIR` then reuses every step; tests/test_demo.py checks the build itself
    for folder in {f for _, _, body, marked, _ in blocks(page.read_text(encoding="utf-8")) if marked
                   for f in QUICK_DEMO.findall(body)}:
        shutil.copytree(request.getfixturevalue("quick_demo").out, tmp_path / folder)
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["LMFORGE_REPO"] = str(ROOT)
    if THREADS_PINNED_HERE:  # a user's shell: lmforge chooses its own thread count (no bitwise comparison here)
        env.pop("OMP_NUM_THREADS", None)
    for line, lang, body, marked, serving in blocks(page.read_text(encoding="utf-8")):
        if not marked:
            continue
        assert lang in SHELLS or lang == "python", f"{page.name}:{line}: only shell and python blocks can be run"
        assert serving is None or (lang == "python" and SERVED_AT in body), (
            f"{page.name}:{line}: a block run while serving is a python block that reaches {SERVED_AT}")
        with _serving(serving, tmp_path, env) as port:
            code = body if port is None else body.replace(SERVED_AT, f"127.0.0.1:{port}")
            argv = [sys.executable, "-c", code] if lang == "python" else ["bash", "-euo", "pipefail", "-c", code]
            proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, (
            f"{page.relative_to(ROOT)}:{line} failed (exit {proc.returncode}):\n{body}\n"
            f"--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"
        )


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cli_reference_is_fresh():
    text = _script("gen_cli_reference").render()
    page = ROOT / "docs" / "cli.md"
    assert page.exists() and page.read_text(encoding="utf-8") == text, (
        "docs/cli.md is stale: run python scripts/gen_cli_reference.py"
    )


def test_results_page_and_readme_table_are_fresh(capsys):
    assert _script("make_results").main(["--check"]) == 0, capsys.readouterr().err


LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_relative_links_point_at_files_that_exist():
    broken = []
    for page in [*doc_pages(), ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md"]:
        for target in LINK.findall(page.read_text(encoding="utf-8")):
            path = target.split("#", 1)[0]
            if not path or re.match(r"^[a-z]+:", path):
                continue
            if not (page.parent / path).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, "links to missing files:\n" + "\n".join(broken)
