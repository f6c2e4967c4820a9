"""Nothing lost, nothing overwritten: the CLI run as a user would, against hostile inputs and failing disks.

Every refusal is checked the same way: exit status 2, one line on stderr, no traceback, and the
folder that was at risk unchanged.  Unwritable folders and full disks are real filesystems where
the machine allows it (a read-only and a 16 KiB tmpfs, mounted when the tests run as root, as CI
does); elsewhere the same OS errors are injected at the OS-call level by a small wrapper around
the CLI (see ``_INJECT``).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lmforge.storage.folders import LOCK, MARKER, folder_kind

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
_EXE = Path(sys.executable).parent / "lmforge"
LMFORGE = [str(_EXE)] if _EXE.is_file() else [sys.executable, "-m", "lmforge.cli"]
GPT_SETS = ["n_positions=32", "batch_size=2", "eval_batches=1"]
# the same device and precision on every machine: some tests compare a subprocess's weights with their own
GPT_FLAGS = ["--device", "cpu", "--precision", "fp32"]


def cli(*args, prefix: list[str] | None = None, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    cmd = (prefix or LMFORGE) + ["-q", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=ENV, **kw)


def refused(proc: subprocess.CompletedProcess, *words: str) -> str:
    """Assert a one-line refusal (exit 2, no traceback) containing ``words``; return the line."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    for w in words:
        assert w.lower() in lines[0].lower(), (w, lines[0])
    return lines[0]


def ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
    return proc


def digest(folder: Path) -> dict[str, str]:
    """sha256 of every file under ``folder`` (the bookkeeping files aside)."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name not in (MARKER, LOCK)
    }


# -- fixtures ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gpt_dir(tmp_path_factory, bpe_shards) -> Path:
    """A tiny GPT model folder (two steps), written by the real driver."""
    from lmforge.train.pretrain import pretrain, run_configs

    out = tmp_path_factory.mktemp("rel") / "gpt"
    pretrain("gpt", bpe_shards, out, *run_configs("gpt", "tiny", n_positions=32, batch_size=2, eval_batches=1,
                                                   max_steps=2, device="cpu"), progress=False)
    return out


@pytest.fixture
def gpt_copy(gpt_dir, tmp_path) -> Path:
    dst = tmp_path / "gpt"
    shutil.copytree(gpt_dir, dst)
    return dst


@pytest.fixture(scope="module")
def task_files(tmp_path_factory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("task")
    rows = ["text,label"] + [f"{'good fine great' if i % 2 else 'bad awful poor'} day {i},{i % 2}" for i in range(12)]
    (d / "train.csv").write_text("\n".join(rows) + "\n")
    (d / "test.csv").write_text("\n".join(rows[:7]) + "\n")
    return d / "train.csv", d / "test.csv"


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory, gpt_dir) -> Path:
    out = tmp_path_factory.mktemp("hf") / "export"
    ok(cli("export-hf", gpt_dir, "--out", out))
    return out


def writing_commands(out: Path, gpt_dir, tiny_corpus, bpe_tokenizer_dir, bpe_shards, task_files, export_dir):
    """Each writing command with ``out`` as its output folder."""
    train, test = task_files
    return {
        "prepare": ["prepare", "--tokenizer", bpe_tokenizer_dir, "--out", out, tiny_corpus],
        "tokenizer": ["tokenizer", "train", "--kind", "bpe", "--vocab-size", "300", "--out", out, tiny_corpus],
        "pretrain": ["pretrain", "gpt", "--data", bpe_shards, "--out", out, "--config", "tiny", "--set", "max_steps=1",
                     *GPT_FLAGS, "--set", *GPT_SETS],
        "finetune": ["finetune", gpt_dir, "--task", "classify", "--train", train, "--test", test, "--out", out,
                     "--epochs", "1", "--batch-size", "4", "--max-len", "16"],
        "export-hf": ["export-hf", gpt_dir, "--out", out],
        "import-hf": ["import-hf", export_dir, "--out", out],
    }


COMMANDS = ["prepare", "tokenizer", "pretrain", "finetune", "export-hf", "import-hf"]


@pytest.fixture
def command_args(gpt_dir, tiny_corpus, bpe_tokenizer_dir, bpe_shards, task_files, export_dir):
    return lambda name, out: writing_commands(out, gpt_dir, tiny_corpus, bpe_tokenizer_dir, bpe_shards, task_files,
                                              export_dir)[name]


# -- real failing filesystems when allowed, injected OS errors otherwise ----------------------------------
_INJECT = """
import builtins, errno, io, os, sys
ROOT, CODE = os.path.realpath(sys.argv[1]), int(sys.argv[2])
def hit(path, writing):
    try:
        p = os.path.realpath(os.fspath(path))
    except TypeError:
        return False
    inside = p == ROOT or p.startswith(ROOT + os.sep)
    if not inside or not writing:
        return False
    name = os.path.basename(p)
    if CODE == errno.ENOSPC and (".lmforge" in name or ".lock" in name):
        return False  # a full disk still takes a tiny file: the marker, the probe and the lock get through
    return True
def fail(path):
    raise OSError(CODE, os.strerror(CODE), os.fspath(path))
_open = builtins.open
def open_(file, mode="r", *a, **k):
    if isinstance(file, (str, bytes, os.PathLike)) and hit(file, any(c in mode for c in "wax+")):
        fail(file)
    return _open(file, mode, *a, **k)
builtins.open = io.open = open_
_osopen = os.open
def osopen(path, flags, *a, **k):
    if hit(path, flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)) and not (CODE == errno.ENOSPC and ".tmp" in str(path)):
        fail(path)
    return _osopen(path, flags, *a, **k)
os.open = osopen
_mkdir = os.mkdir
def mkdir(path, *a, **k):
    if CODE != errno.ENOSPC and hit(path, True):
        fail(path)
    return _mkdir(path, *a, **k)
os.mkdir = mkdir
sys.argv = ["lmforge", *sys.argv[3:]]
from lmforge.cli import main
sys.exit(main())
"""


def _try_mount(target: Path, options: str) -> bool:
    """Mount a tmpfs (root only); LMFORGE_TEST_NO_MOUNT=1 takes the injected-error path instead."""
    if os.geteuid() != 0 or shutil.which("mount") is None or os.environ.get("LMFORGE_TEST_NO_MOUNT") == "1":
        return False
    target.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(target)], capture_output=True)
    return proc.returncode == 0


@contextlib.contextmanager
def failing_dir(tmp_path: Path, code: int):
    """A folder where writing fails with ``code`` (EROFS or ENOSPC); yields ``(folder, cli prefix)``."""
    target = tmp_path / ("ro" if code == errno.EROFS else "full")
    options = "ro,size=64k" if code == errno.EROFS else "size=16k"
    if _try_mount(target, options):
        try:
            yield target, None
        finally:
            subprocess.run(["umount", "-l", str(target)], capture_output=True)
        return
    target.mkdir(parents=True, exist_ok=True)
    script = tmp_path / "inject.py"
    script.write_text(_INJECT)
    yield target, [sys.executable, str(script), str(target), str(code)]


# -- 1. every output folder says what it is ---------------------------------------------------------------
def test_folders_say_what_they_are(gpt_dir, bpe_tokenizer_dir, bpe_shards, export_dir):
    assert folder_kind(gpt_dir) == "model"
    assert folder_kind(export_dir) == "export"
    assert json.loads((export_dir / MARKER).read_text())["kind"] == "export"
    assert folder_kind(bpe_shards) == "shards"  # written by the library: inferred from its files
    assert folder_kind(bpe_tokenizer_dir) == "tokenizer"


def test_finetune_into_its_own_model_is_refused(gpt_copy, task_files):
    before = digest(gpt_copy)
    train, test = task_files
    line = refused(cli("finetune", gpt_copy, "--task", "classify", "--train", train, "--test", test,
                       "--out", gpt_copy, "--overwrite"), "the folder this command reads")  # even with --overwrite
    assert str(gpt_copy) in line
    assert digest(gpt_copy) == before


def test_finetune_into_a_folder_of_other_files_is_refused_before_training(tmp_path, gpt_dir, task_files):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "config.json").write_text('{"mine": true}')
    (out / "notes.txt").write_text("keep me")
    train, test = task_files
    t0 = time.monotonic()
    refused(cli("finetune", gpt_dir, "--task", "classify", "--train", train, "--test", test, "--out", out),
            "lmforge did not write", "--overwrite")
    assert time.monotonic() - t0 < 60
    assert (out / "config.json").read_text() == '{"mine": true}' and (out / "notes.txt").read_text() == "keep me"


def test_tokenizer_train_into_a_model_is_refused(gpt_copy, tiny_corpus):
    before = digest(gpt_copy)
    refused(cli("tokenizer", "train", "--kind", "bpe", "--vocab-size", "300", "--out", gpt_copy, tiny_corpus),
            "is a model folder, not a tokenizer folder")
    assert digest(gpt_copy) == before


def test_prepare_and_pretrain_refuse_folders_of_other_kinds(gpt_copy, tiny_corpus, bpe_tokenizer_dir, bpe_shards,
                                                            tmp_path):
    before = digest(gpt_copy)
    refused(cli("prepare", "--tokenizer", bpe_tokenizer_dir, "--out", gpt_copy, tiny_corpus), "is a model folder")
    assert digest(gpt_copy) == before
    tok = tmp_path / "tok"
    shutil.copytree(bpe_tokenizer_dir, tok)
    tok_before = digest(tok)
    refused(cli("pretrain", "gpt", "--data", bpe_shards, "--out", tok, *GPT_FLAGS, "--set", *GPT_SETS),
            "is a tokenizer folder, not a model folder")
    assert digest(tok) == tok_before


def test_import_hf_replaces_a_model_only_with_overwrite_and_leaves_nothing_behind(gpt_copy, export_dir):
    (gpt_copy / "vocab.txt").write_text("[PAD]\n[UNK]\n")  # what a BERT folder would leave behind
    before = digest(gpt_copy)
    refused(cli("import-hf", export_dir, "--out", gpt_copy), "already holds a model folder", "--overwrite")
    assert digest(gpt_copy) == before
    ok(cli("import-hf", export_dir, "--out", gpt_copy, "--overwrite"))
    assert not (gpt_copy / "vocab.txt").exists() and not (gpt_copy / "training_state").exists()
    import lmforge

    assert lmforge.load(gpt_copy).model_type == "gpt"
    assert not list(gpt_copy.parent.glob(f".{gpt_copy.name}.*"))  # no temp or old folder, no lock


def test_export_hf_replaces_an_earlier_export(export_dir, gpt_dir, tmp_path):
    out = tmp_path / "e"
    shutil.copytree(export_dir, out)
    (out / "model.safetensors").write_bytes(b"stale")
    refused(cli("export-hf", gpt_dir, "--out", out), "already holds an HF export folder", "--overwrite")
    assert (out / "model.safetensors").read_bytes() == b"stale"
    ok(cli("export-hf", gpt_dir, "--out", out, "--overwrite"))
    assert (out / "model.safetensors").read_bytes() != b"stale" and folder_kind(out) == "export"


# -- 2. unwritable folders and full disks: one line, before any long work --------------------------------
@pytest.mark.parametrize("command", COMMANDS)
def test_output_under_a_file_is_one_line(command, command_args, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    out = blocker / "sub" / "out"
    t0 = time.monotonic()
    line = refused(cli(*command_args(command, out)))
    assert str(blocker) in line and "is a file" in line, line
    assert time.monotonic() - t0 < 60


@pytest.mark.parametrize("command", COMMANDS)
def test_read_only_folder_is_one_line(command, command_args, tmp_path):
    with failing_dir(tmp_path, errno.EROFS) as (ro, prefix):
        out = ro / "out"
        line = refused(cli(*command_args(command, out), prefix=prefix))
        assert "read-only" in line and str(ro) in line, line
        assert not out.exists()


@pytest.mark.slow
@pytest.mark.parametrize("command", COMMANDS)
def test_full_disk_is_one_line(command, command_args, tmp_path):
    with failing_dir(tmp_path, errno.ENOSPC) as (full, prefix):
        out = full / "out"
        line = refused(cli(*command_args(command, out), prefix=prefix))
        assert "no space left" in line and str(full) in line, line


def test_out_of_memory_is_one_line_naming_the_size(bpe_shards, tmp_path):
    out = tmp_path / "m"
    line = refused(cli("pretrain", "gpt", "--data", bpe_shards, "--out", out, "--config", "tiny", "--device", "cpu",
                       "--set", "max_steps=1", "n_positions=100000000000"), "out of memory", "GiB")
    assert "n_positions" in line
    assert not out.exists()  # a failed command leaves no empty folder behind


# -- 3. one writer per folder ------------------------------------------------------------------------------
def test_a_second_writer_is_refused_and_a_dead_ones_lock_is_recovered(tmp_path, tiny_corpus):
    import socket

    out = tmp_path / "tok"
    lock = tmp_path / ".tok.lock"  # a folder renamed into place when complete is locked beside it
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        lock.write_text(json.dumps({"pid": holder.pid, "host": socket.gethostname(), "since": "now"}))
        args = ["tokenizer", "train", "--kind", "bpe", "--vocab-size", "300", "--out", out, tiny_corpus]
        line = refused(cli(*args), "being written by another lmforge run", f"pid {holder.pid}")
        assert str(lock) in line
    finally:
        holder.kill()
        holder.wait()
    proc = ok(cli(*args))  # the holder is gone: its lock is stale
    assert (out / "tokenizer.json").is_file() and not lock.exists()
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_two_pretrain_runs_on_one_folder(bpe_shards, tmp_path):
    out = tmp_path / "m"
    args = ["pretrain", "gpt", "--data", bpe_shards, "--out", out, "--config", "tiny", "--set", "max_steps=100",
            *GPT_FLAGS, "--set", *GPT_SETS]
    first = subprocess.Popen(LMFORGE + ["-q", *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=ENV)
    try:
        deadline = time.monotonic() + 60
        while not (out / LOCK).exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        second = cli(*args)
        if first.poll() is None:  # the first run was still writing all along
            refused(second, "being written by another lmforge run", str(first.pid))
        else:
            refused(second)  # too late to meet the lock: the finished model is refused instead
    finally:
        stdout, stderr = first.communicate(timeout=300)
    assert first.returncode == 0, stderr
    events = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [e["step"] for e in events if e["split"] == "train"]
    assert steps == sorted(steps) and len(steps) == len(set(steps))  # one run's log, not two interleaved


# -- 4. nothing non-finite is ever saved; resume with a lower lr works -----------------------------------
def test_divergence_keeps_the_last_finite_checkpoint_and_resume_with_lower_lr_works(bpe_shards, tmp_path):
    out = tmp_path / "m"
    line = refused(cli("pretrain", "gpt", "--data", bpe_shards, "--out", out, "--config", "tiny", *GPT_FLAGS,
                       "--set", "max_steps=8", *GPT_SETS, "lr=1e4", "warmup_steps=0", "save_every=1", "log_every=10",
                       "grad_clip=0"), "non-finite", "--resume --set lr=")
    state = json.loads((out / "training_state" / "state.json").read_text())
    assert 1 <= state["step"] < 8 and f"step {state['step']}" in line
    import torch

    from lmforge.storage.files import load_safetensors

    for name in ("model.safetensors", "training_state/model.safetensors", "training_state/optimizer.safetensors"):
        assert all(bool(torch.isfinite(t).all()) for t in load_safetensors(out / name).values()), name
    ok(cli("generate", out, "--prompt", "In the", "--max-new-tokens", "3"))
    proc = ok(cli("pretrain", "gpt", "--data", bpe_shards, "--out", out, "--resume", "--set", "lr=1e-4"))
    assert "after 8 steps" in proc.stdout
    assert json.loads((out / "training_state" / "state.json").read_text())["step"] == 8


def test_readers_refuse_non_finite_weights(gpt_copy, bpe_shards, task_files, tmp_path):
    from safetensors.torch import save_file

    from lmforge.storage.files import load_safetensors

    state = load_safetensors(gpt_copy / "model.safetensors")
    name = sorted(state)[0]
    state[name][0] = float("nan")
    save_file(state, str(gpt_copy / "model.safetensors"))  # (as an lmforge that recorded no weights hash saved it)
    marker = json.loads((gpt_copy / MARKER).read_text())
    del marker["sha256"]
    (gpt_copy / MARKER).write_text(json.dumps(marker))
    train, test = task_files
    refused(cli("generate", gpt_copy, "--prompt", "In the"), "non-finite", name)
    refused(cli("embed", gpt_copy, "a python bit him", "python code", "--word", "python"), "non-finite")
    refused(cli("evaluate", "lm", gpt_copy, "--data", bpe_shards, "--batches", "1"), "non-finite")
    refused(cli("finetune", gpt_copy, "--task", "classify", "--train", train, "--test", test,
                "--out", tmp_path / "run"), "non-finite")


def test_tokenizer_and_model_must_agree(gpt_copy, tiny_corpus, tmp_path):
    tok = tmp_path / "tok"
    ok(cli("tokenizer", "train", "--kind", "bpe", "--vocab-size", "300", "--out", tok, tiny_corpus))
    for f in tok.glob("*.json"):  # another tokenizer's files copied into the model folder
        shutil.copy(f, gpt_copy / f.name)
    proc = cli("generate", gpt_copy, "--prompt", "In the")
    refused(proc, "300 tokens", "built for 500")
    assert proc.stdout == ""


# -- 5. a model folder is complete or absent: kill inside every write of the first checkpoint -------------
def _killed_run(out: Path, argv: list[str], target: str, n: int) -> bool:
    """Run the CLI in a forked child that dies (os._exit, no cleanup) at the ``n``-th call of ``os.<target>``.

    Returns whether the kill point was reached.
    """
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            calls = [0]
            real = getattr(os, target)

            def die(*a, **k):
                calls[0] += 1
                if calls[0] == n:
                    os._exit(137)
                return real(*a, **k)

            setattr(os, target, die)
            import logging

            from lmforge.cli import main

            logging.disable(logging.CRITICAL)
            sys.stdout, sys.stderr = io.StringIO(), io.StringIO()
            code = main(["-q", *argv])
        except BaseException:
            code = 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 137


@pytest.mark.slow
def test_a_kill_inside_the_first_checkpoint_leaves_nothing_or_a_resumable_folder(bpe_shards, tmp_path):
    from lmforge.cli import main

    args = ["pretrain", "gpt", "--data", str(bpe_shards), "--config", "tiny", "--set", "max_steps=1",
            *GPT_FLAGS, "--set", *GPT_SETS, "save_every=1"]
    ref = tmp_path / "ref"
    assert main(["-q", *args, "--out", str(ref)]) == 0
    from lmforge.storage.files import load_safetensors

    want = load_safetensors(ref / "model.safetensors")
    kills = 0
    for target in ("replace", "rename"):  # every file and folder write commits by one of these
        for n in range(1, 40):
            out = tmp_path / f"{target}{n}"
            if not _killed_run(out, [*args, "--out", str(out)], target, n):
                break  # the run finished before the n-th call: every call of this kind was tried
            kills += 1
            from lmforge.train.checkpoint import find_state_dir

            resumable = find_state_dir(out) is not None
            argv = [*args, "--out", str(out)] + (["--resume"] if resumable else [])
            assert main(["-q", *argv]) == 0, (target, n, resumable, sorted(p.name for p in out.iterdir()))
            got = load_safetensors(out / "model.safetensors")
            assert got.keys() == want.keys() and all(got[k].equal(want[k]) for k in want), (target, n)
            shutil.rmtree(out)
    assert kills >= 10


# -- 6. the smaller items ------------------------------------------------------------------------------------
def test_val_fraction_zero_is_refused_before_pretraining(tiny_corpus, bpe_tokenizer_dir, tmp_path):
    shards = tmp_path / "s0"
    proc = ok(cli("prepare", "--tokenizer", bpe_tokenizer_dir, "--out", shards, "--val-fraction", "0", tiny_corpus))
    assert "no validation split" in proc.stderr
    out = tmp_path / "m"
    refused(cli("pretrain", "gpt", "--data", shards, "--out", out, *GPT_FLAGS, "--set", *GPT_SETS),
            "no validation split", "--val-fraction")
    assert not out.exists()
    refused(cli("prepare", "--tokenizer", bpe_tokenizer_dir, "--out", shards, "--val-fraction", "1", tiny_corpus),
            "--val-fraction")


def test_prepare_removes_what_killed_runs_left(tiny_corpus, bpe_tokenizer_dir, tmp_path):
    out = tmp_path / "shards"
    left = [tmp_path / ".shards.tmp-deadbeef", tmp_path / ".shards.old-deadbeef"]
    for d in left:
        d.mkdir()
        (d / "train.tokens.bin").write_bytes(b"\0" * 64)
    ok(cli("prepare", "--tokenizer", bpe_tokenizer_dir, "--out", out, tiny_corpus))
    assert not any(d.exists() for d in left) and folder_kind(out) == "shards"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shards"]


def test_resume_removes_temp_files_of_killed_writes(gpt_copy, bpe_shards):
    leftover = gpt_copy / ".tokenizer.json.x1y2z3.tmp"
    leftover.write_text("{")
    ok(cli("pretrain", "gpt", "--data", bpe_shards, "--out", gpt_copy, "--resume", "--set", "max_steps=3"))
    assert not leftover.exists() and not list(gpt_copy.glob(".*.tmp"))


@pytest.mark.parametrize("bad", [["--max-new-tokens", "-3"], ["--temperature", "-1"], ["--top-p", "2"],
                                 ["--top-k", "-1"]])
def test_generate_checks_its_arguments_before_printing(gpt_dir, bad):
    proc = cli("generate", gpt_dir, "--prompt", "UNIQUE-PROMPT", *bad)
    refused(proc, bad[0].lstrip("-").replace("-", "_"))
    assert "UNIQUE-PROMPT" not in proc.stdout


@pytest.mark.slow
def test_generate_caps_max_new_tokens_and_logs_the_window_once(gpt_dir):
    proc = subprocess.run(LMFORGE + ["generate", str(gpt_dir), "--prompt", "In the", "--max-new-tokens", "100000",
                                     "--temperature", "1", "--seed", "0"],
                          capture_output=True, text=True, timeout=600, env=ENV)
    ok(proc)
    assert "capped at 4096" in proc.stderr
    assert proc.stderr.count("sliding window") == 1, proc.stderr


def test_lr_inf_is_refused_by_the_config_check(bpe_shards, tmp_path):
    out = tmp_path / "m"
    refused(cli("pretrain", "gpt", "--data", bpe_shards, "--out", out, "--set", "lr=inf"), "lr must be a finite")
    assert not out.exists()


@pytest.mark.parametrize(("encoding", "name"), [("utf-16", "UTF-16"), ("utf-16-le", "UTF-16"), ("utf-32", "UTF-32")])
def test_utf16_input_is_named(encoding, name, bpe_tokenizer_dir, tmp_path):
    f = tmp_path / "corpus.txt"
    f.write_bytes("The snake bit him.\nPython is a language.\n".encode(encoding))
    line = refused(cli("prepare", "--tokenizer", bpe_tokenizer_dir, "--out", tmp_path / "s", f), name, "iconv")
    assert "binary" not in line


def test_empty_word_and_text_are_clear_errors(gpt_dir, tmp_path):
    refused(cli("embed", gpt_dir, "one sentence", "another one", "--word", ""), "--word is empty")
    refused(cli("predict", tmp_path, "--text", "   "), "--text is empty")


def test_weight_files_honour_the_umask(bpe_shards, tmp_path):
    out = tmp_path / "m"
    ok(cli("pretrain", "gpt", "--data", bpe_shards, "--out", out, "--config", "tiny", "--set", "max_steps=1",
           *GPT_FLAGS, "--set", *GPT_SETS, preexec_fn=lambda: os.umask(0o027)))
    for f in ("model.safetensors", "config.json", "training_state/model.safetensors",
              "training_state/optimizer.safetensors"):
        assert (out / f).stat().st_mode & 0o777 == 0o640, f
    assert (out / "training_state").stat().st_mode & 0o777 == 0o750


def test_a_long_line_is_read_in_bounded_pieces():
    from lmforge.data.textfiles import _bounded_lines

    words = [f"w{i}" for i in range(400_000)]
    text = " ".join(words).encode() + b"\nshort line\n" + "宽".encode() * 1000  # a final line without spaces
    pieces = list(_bounded_lines(io.BytesIO(text), limit=1 << 16))
    assert max(len(p) for _, p in pieces) <= 1 << 16
    assert b"".join(p for _, p in pieces) == text  # nothing lost, nothing doubled
    first = [p for n, p in pieces if n == 1]
    assert len(first) > 10 and all(p.endswith(b" ") for p in first[:-1])  # cut between words
    assert [p for n, p in pieces if n == 2] == [b"short line\n"]
    for _, p in pieces:
        p.decode("utf-8")  # no character cut in two
