"""Nothing lost, round two: the CLI against kills at chosen instants, tampered folders and odd numbers.

Every case drives ``lmforge`` as a user would (``lmforge.cli.main`` with its stderr and exit status).
A kill at a chosen instant is a forked child that sends itself SIGKILL just before its n-th rename,
replace or folder deletion of the path at risk (what ``kill -9`` at that instant does), for every n
until the command finishes; the next command then has to find the old folder or the new one, whole.
Where the system swaps two folders in one step (Linux's ``renameat2``), the kills are also tried on a
system without it, by making the C library unreachable in the child, as on another OS.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import io
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path

import pytest

from lmforge.cli import main
from lmforge.storage.folders import LOCK, MARKER

GPT_SETS = ["n_positions=32", "batch_size=2", "eval_batches=1", "device=cpu"]


def cli(*args) -> tuple[int, str, str]:
    """Run ``lmforge -q ARGS`` in this process: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["-q", *map(str, args)])
    return rc, out.getvalue(), err.getvalue()


def refused(result: tuple[int, str, str], *words: str) -> str:
    """Assert a one-line refusal (exit 2, no traceback) containing ``words``; return the line."""
    rc, _, err = result
    assert rc == 2, result
    assert "Traceback" not in err, err
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, err
    for w in words:
        assert w.lower() in lines[0].lower(), (w, lines[0])
    return lines[0]


def ok(result: tuple[int, str, str]) -> tuple[int, str, str]:
    assert result[0] == 0, result
    return result


def digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name not in (MARKER, LOCK)}


def _no_libc(*a, **k):
    raise OSError("no C library here")  # a system where folders cannot be swapped in one step


def killed(argv: list, at: Path, n: int, *, exchange: bool = True, tmpdir: Path | None = None) -> bool:
    """Run the CLI in a forked child killed (SIGKILL) just before its ``n``-th ``os.replace`` / ``os.rename`` /
    ``shutil.rmtree`` of ``at``, a ``.AT.*`` sibling of it, or a file inside it; True if the kill came."""
    at = Path(os.path.abspath(at))
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 3
        try:
            calls = [0]

            def touches(path) -> bool:
                p = os.path.abspath(os.fspath(path))
                base, parent = os.path.basename(p), os.path.dirname(p)
                return parent == str(at) or (parent == str(at.parent) and (base == at.name or
                                                                            base.startswith(f".{at.name}.")))

            def watch(fn):
                def wrapped(*a, **k):
                    if any(touches(x) for x in a[:2] if isinstance(x, (str, os.PathLike))):
                        calls[0] += 1
                        if calls[0] == n:
                            os.kill(os.getpid(), signal.SIGKILL)
                    return fn(*a, **k)
                return wrapped

            os.replace, os.rename, shutil.rmtree = watch(os.replace), watch(os.rename), watch(shutil.rmtree)
            if not exchange:
                ctypes.CDLL = _no_libc
            if tmpdir is not None:
                tempfile.tempdir = str(tmpdir)
            logging.disable(logging.CRITICAL)
            sys.stdout, sys.stderr = io.StringIO(), io.StringIO()
            code = main(["-q", *map(str, argv)])
        except BaseException:
            code = 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


# -- fixtures ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gpt_dir(tmp_path_factory, bpe_shards) -> Path:
    from lmforge.train.pretrain import pretrain, run_configs

    out = tmp_path_factory.mktemp("rel2") / "gpt"
    pretrain("gpt", bpe_shards, out, *run_configs("gpt", "tiny", n_positions=32, batch_size=2, eval_batches=1,
                                                   device="cpu", max_steps=2), progress=False)
    return out


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory, wordpiece_shards) -> Path:
    from lmforge.train.pretrain import pretrain, run_configs

    out = tmp_path_factory.mktemp("rel2") / "bert"
    pretrain("bert", wordpiece_shards, out, *run_configs("bert", "tiny", max_position_embeddings=32, max_seq_length=32,
                                                         batch_size=2, eval_batches=1, device="cpu", max_steps=2),
             progress=False)
    return out


@pytest.fixture(scope="module")
def task_files(tmp_path_factory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("task2")
    rows = ["text,label"] + [f"{'good fine great' if i % 2 else 'bad awful poor'} day {i},{i % 2}" for i in range(12)]
    (d / "train.csv").write_text("\n".join(rows) + "\n")
    (d / "test.csv").write_text("\n".join(rows[:7]) + "\n")
    return d / "train.csv", d / "test.csv"


def finetune_args(gpt_dir: Path, task_files, out: Path) -> list:
    train, test = task_files
    return ["finetune", gpt_dir, "--task", "classify", "--train", train, "--test", test, "--out", out,
            "--epochs", "1", "--batch-size", "4", "--max-len", "16", "--seed", "0"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, gpt_dir, task_files) -> Path:
    out = tmp_path_factory.mktemp("run2") / "ft"
    ok(cli(*finetune_args(gpt_dir, task_files, out)))
    return out


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory, gpt_dir) -> Path:
    out = tmp_path_factory.mktemp("hf2") / "export"
    ok(cli("export-hf", gpt_dir, "--out", out))
    return out


# -- 1. a staged replace never leaves the path empty --------------------------------------------------------
def _old_copy(src: Path, dst: Path) -> dict[str, str]:
    """``dst``: a copy of ``src`` whose README.md says OLD (what the kill must not lose); its digest."""
    shutil.copytree(src, dst)
    (dst / "README.md").write_text("OLD\n")
    return digest(dst)


def _is_old(folder: Path) -> bool:
    readme = folder / "README.md"
    return readme.is_file() and readme.read_text() == "OLD\n"


@pytest.mark.parametrize("exchange", [True, False], ids=["swap", "two-renames"])
@pytest.mark.parametrize("command", ["export-hf", "finetune", "import-hf"])
def test_a_kill_at_any_instant_of_a_replacement_leaves_the_old_folder_or_the_new(
        command, exchange, tmp_path, gpt_dir, run_dir, export_dir, task_files):
    target = tmp_path / "target"
    if command == "export-hf":
        old, argv = _old_copy(export_dir, target), ["export-hf", gpt_dir, "--out", target, "--overwrite"]
        reader = ["import-hf", target, "--out"]
    elif command == "finetune":
        old, argv = _old_copy(run_dir, target), [*finetune_args(gpt_dir, task_files, target), "--overwrite"]
        reader = ["predict", target, "--text", "good day"]
    else:
        old, argv = _old_copy(gpt_dir, target), ["import-hf", export_dir, "--out", target, "--overwrite"]
        reader = ["generate", target, "--prompt", "In the", "--max-new-tokens", "1"]
    kills = 0
    for n in range(1, 8):
        if not killed(argv, target, n, exchange=exchange):
            break
        kills += 1
        was_there = target.is_dir()
        rc, _, err = cli(*reader, *([tmp_path / f"read{n}"] if command == "export-hf" else []))
        assert rc == 0, (n, err, sorted(p.name for p in tmp_path.iterdir()))
        if not was_there:
            assert "restored" in err, err  # the reader says what it did
        assert digest(target) == old or not _is_old(target), n  # the old folder whole, or the new one
    assert kills >= (1 if exchange else 2)
    ok(cli(*argv))  # the next writer runs through and leaves nothing beside the folder
    assert not _is_old(target)
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".target.")]


def test_the_next_writer_puts_a_moved_aside_folder_back_and_never_deletes_it(tmp_path, gpt_dir, export_dir):
    model = tmp_path / "m"
    old = _old_copy(gpt_dir, model)
    aside = tmp_path / ".m.old-1a2b3c4d"  # what a kill between the two renames of a replacement leaves
    model.rename(aside)
    rc, _, err = cli("import-hf", export_dir, "--out", model)
    restored, refusal = err.strip().splitlines()  # what was put back, then why nothing more is done
    assert rc == 2 and "restored" in restored and ".m.old-1a2b3c4d" in restored
    assert "already holds a model" in refusal and "--overwrite" in refusal
    assert digest(model) == old and not aside.exists()


def test_a_reader_says_what_a_leftover_old_copy_is(tmp_path, gpt_dir):
    model = tmp_path / "m"
    shutil.copytree(gpt_dir, model)
    aside = tmp_path / ".m.old-1a2b3c4d"
    shutil.copytree(gpt_dir, aside)
    rc, _, err = cli("generate", model, "--prompt", "In the", "--max-new-tokens", "1")
    assert rc == 0 and str(aside) in err and "previous copy" in err, err
    assert aside.exists()  # a reader deletes nothing


# -- 2. a tokenizer folder is one tokenizer ---------------------------------------------------------------
def _vocab_lines(folder: Path) -> int:
    return len((folder / "vocab.txt").read_text(encoding="utf-8").splitlines())


def test_bpe_into_a_wordpiece_folder_leaves_no_wordpiece_vocabulary(tmp_path, wordpiece_tokenizer_dir, tiny_corpus):
    tok = tmp_path / "tok"
    shutil.copytree(wordpiece_tokenizer_dir, tok)
    refused(cli("tokenizer", "train", "--kind", "bpe", "--vocab-size", "300", "--out", tok, tiny_corpus),
            "already holds a tokenizer folder", "--overwrite")
    ok(cli("tokenizer", "train", "--kind", "bpe", "--vocab-size", "300", "--out", tok, "--overwrite", tiny_corpus))
    assert not (tok / "vocab.txt").exists()
    ok(cli("tokenizer", "encode", "--tokenizer", tok, "hello"))


def test_tokenizer_files_of_two_tokenizers_are_refused(tmp_path, bpe_tokenizer_dir, wordpiece_tokenizer_dir,
                                                       tiny_corpus):
    tok = tmp_path / "tok"
    shutil.copytree(bpe_tokenizer_dir, tok)
    shutil.copy(wordpiece_tokenizer_dir / "vocab.txt", tok / "vocab.txt")
    refused(cli("tokenizer", "encode", "--tokenizer", tok, "hello"), "do not belong together", "vocab.txt")
    refused(cli("prepare", "--tokenizer", tok, "--out", tmp_path / "s", tiny_corpus), "do not belong together")
    assert not (tmp_path / "s").exists()


def test_a_kill_inside_a_tokenizer_save_leaves_one_whole_tokenizer(tmp_path, wordpiece_tokenizer_dir, tiny_corpus):
    from lmforge.tokenization import Tokenizer

    tok = tmp_path / "tok"
    argv = ["tokenizer", "train", "--kind", "wordpiece", "--vocab-size", "300", "--out", tok, "--overwrite",
            tiny_corpus]
    kills = 0
    for n in range(1, 12):
        shutil.rmtree(tok, ignore_errors=True)
        shutil.copytree(wordpiece_tokenizer_dir, tok)  # the old tokenizer: 500 tokens
        if not killed(argv, tok, n):
            break
        kills += 1
        ok(cli("tokenizer", "encode", "--tokenizer", tok, "hello"))
        size = Tokenizer.load(tok).vocab_size
        assert size in (300, 500) and _vocab_lines(tok) == size, (n, size, _vocab_lines(tok))
    assert kills >= 2  # written beside and swapped in: a kill at the swap, and one at the old copy's removal


# -- 3. a tokenizer swapped for another of the same size ----------------------------------------------------
def _swap_tokenizer(model: Path, other: Path, dst: Path, *, whole: bool) -> Path:
    shutil.copytree(model, dst)
    names = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"] if whole \
        else ["tokenizer.json"]
    if whole:
        (dst / "vocab.txt").unlink(missing_ok=True)
    for name in names:
        if (other / name).exists():
            shutil.copy(other / name, dst / name)
    return dst


@pytest.mark.parametrize("whole", [False, True], ids=["tokenizer.json", "every-file"])
def test_a_gpt_tokenizer_in_a_bert_folder_is_one_line(whole, tmp_path, bert_dir, gpt_dir):
    from lmforge.tokenization import Tokenizer

    assert Tokenizer.load(gpt_dir).vocab_size == Tokenizer.load(bert_dir).vocab_size  # the same size
    bad = _swap_tokenizer(bert_dir, gpt_dir, tmp_path / "bert", whole=whole)
    refused(cli("fill-mask", bad, "the [MASK] is here"), "tokenizer")
    refused(cli("embed", bad, "a python bit him", "python is a language", "--word", "python"), "tokenizer")


def test_a_bert_tokenizer_in_a_gpt_folder_is_one_line(tmp_path, bert_dir, gpt_dir):
    bad = _swap_tokenizer(gpt_dir, bert_dir, tmp_path / "gpt", whole=True)
    rc, out, err = cli("generate", bad, "--prompt", "In the", "--max-new-tokens", "3")
    refused((rc, out, err), "wordpiece", "bpe")
    assert out == ""


# -- 4. a hand-edited plan ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def plan_file(tmp_path_factory, bpe_shards) -> Path:
    from lmforge.data.shards import Shards
    from lmforge.train.budget import parse_budget, plan_budget
    from lmforge.train.pretrain import default_train_config

    plan = plan_budget("gpt", Shards.open(bpe_shards), parse_budget("600tok"), "tiny",
                       default_train_config("gpt", batch_size=2, eval_batches=1, device="cpu"),
                       model_fields={"n_positions": 32})
    return plan.save(tmp_path_factory.mktemp("plan") / "plan.json")


@pytest.mark.parametrize(("where", "key", "value", "word"), [
    ("", "max_steps", "ten", "max_steps"),
    ("model", "n_layer", -2, "n_layer"),
    ("train", "lr", "fast", "lr"),
])
def test_a_hand_edited_plan_is_one_line_and_leaves_no_folder(where, key, value, word, plan_file, bpe_shards,
                                                             tmp_path):
    data = json.loads(plan_file.read_text())
    (data[where] if where else data)[key] = value
    bad = tmp_path / "plan.json"
    bad.write_text(json.dumps(data))
    out = tmp_path / "m"
    refused(cli("pretrain", "gpt", "--data", bpe_shards, "--out", out, "--plan", bad), "plan", word)
    assert not out.exists()


def test_a_plan_refused_at_its_start_leaves_no_folder(plan_file, bpe_shards, wordpiece_tokenizer_dir, tmp_path):
    out = tmp_path / "m"
    refused(cli("pretrain", "gpt", "--data", bpe_shards, "--out", out, "--plan", plan_file, "--tokenizer",
                wordpiece_tokenizer_dir), "tokenizer")
    assert not out.exists()


def test_a_killed_planned_run_leaves_nothing_in_the_temp_folder(plan_file, bpe_shards, tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    out = tmp_path / "m"
    assert killed(["pretrain", "gpt", "--data", bpe_shards, "--out", out, "--plan", plan_file], out, 3, tmpdir=tmp)
    assert list(tmp.iterdir()) == []


# -- 6. an output never lands on an input -------------------------------------------------------------------
def test_predict_out_over_the_run_or_its_model_is_refused(run_dir, gpt_dir, task_files, tmp_path):
    gpt_dir, run_dir = shutil.copytree(gpt_dir, tmp_path / "gpt"), shutil.copytree(run_dir, tmp_path / "ft")
    config = json.loads((run_dir / "config.json").read_text())
    (run_dir / "config.json").write_text(json.dumps({**config, "model_dir": str(gpt_dir)}))  # the run of the copy
    before, model_before = digest(run_dir), digest(gpt_dir)
    for target in (run_dir / "config.json", gpt_dir / "config.json", run_dir / "new.jsonl"):
        line = refused(cli("predict", run_dir, "--text", "good day", "--out", target), "--out", "reads")
        assert str(target) in line
    test = tmp_path / "test.csv"
    shutil.copy(task_files[1], test)
    refused(cli("predict", run_dir, "--file", test, "--out", test), "is the file this command reads")
    refused(cli("evaluate", "run", run_dir, "--test", test, "--out", run_dir / "records.jsonl"), "reads")
    assert digest(run_dir) == before and digest(gpt_dir) == model_before
    assert test.read_text() == task_files[1].read_text()


def test_folder_outputs_inside_or_around_an_input_are_refused(gpt_dir, tmp_path, tiny_corpus):
    model = tmp_path / "gpt"
    shutil.copytree(gpt_dir, model)
    before = digest(model)
    refused(cli("export-hf", model, "--out", model / "hf"), "lies inside", "reads")
    folder = tmp_path / "tok"
    folder.mkdir()
    corpus = shutil.copy(tiny_corpus, folder / "corpus.txt")
    refused(cli("tokenizer", "train", "--kind", "bpe", "--vocab-size", "300", "--out", folder, "--overwrite",
                corpus), "holds", "reads")
    assert digest(model) == before and sorted(p.name for p in folder.iterdir()) == ["corpus.txt"]


def test_every_command_declares_the_paths_it_writes():
    """What the output check relies on: a command with an --out (or OUT_DIR) names it among its writes."""
    import argparse

    from lmforge.cli import build_parser

    def leaves(parser, name=""):
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            yield name, parser
        for action in subs:
            for sub_name, sub in action.choices.items():
                yield from leaves(sub, f"{name} {sub_name}".strip())

    checked = 0
    for name, parser in leaves(build_parser()):
        outputs = {a.dest for a in parser._actions} & {"out", "out_dir"}
        declared = {w.lstrip("-").replace("-", "_") for w in parser._defaults.get("writes", ())}
        assert outputs <= declared, (name, outputs, declared)
        checked += bool(outputs)
    assert checked >= 10


# -- 7. every number from the command line is range-checked -------------------------------------------------
@pytest.mark.parametrize(("args", "words"), [
    (["generate", "{gpt}", "--prompt", "In the", "--seed", str(10**23)], ["seed"]),
    (["generate", "{gpt}", "--prompt", "In the", "--temperature", "nan"], ["temperature", "finite"]),
    (["generate", "{gpt}", "--prompt", "In the", "--seed", "-1", "--temperature", "1"], ["seed"]),
    (["evaluate", "lm", "{gpt}", "--data", "{shards}", "--seed", str(10**23)], ["seed"]),
    (["tokenizer", "train", "--kind", "bpe", "--vocab-size", str(10**23), "--out", "{tmp}/t", "{corpus}"],
     ["vocab-size"]),
    (["tokenizer", "train", "--kind", "bpe", "--vocab-size", "300", "--min-frequency", "-1", "--out", "{tmp}/t",
      "{corpus}"], ["min-frequency"]),
    (["finetune", "{gpt}", "--task", "classify", "--train", "{train}", "--test", "{test}", "--out", "{tmp}/r",
      "--seed", str(10**23)], ["--seed"]),
    (["pretrain", "gpt", "--data", "{shards}", "--out", "{tmp}/m", "--set", "n_positions=32", f"seed={10**23}"],
     ["seed"]),
    (["pretrain", "word2vec", "--data", "{shards}", "--out", "{tmp}/m", "--set", f"seed={10**23}"], ["seed"]),
    # model and training values of --set: 64-bit whole numbers, a sane layer count, finite floats
    (["pretrain", "gpt", "--data", "{shards}", "--out", "{tmp}/m", "--set", f"n_positions={10**30}"],
     ["n_positions", "whole number"]),
    (["pretrain", "bert", "--data", "{shards}", "--out", "{tmp}/m", "--set", f"hidden_size={10**30}"],
     ["hidden_size"]),
    (["pretrain", "gpt", "--data", "{shards}", "--out", "{tmp}/m", "--set", "n_positions=32", "n_layer=100000"],
     ["n_layer", "at most 1024"]),
    (["pretrain", "gpt", "--data", "{shards}", "--out", "{tmp}/m", "--set", "n_positions=32", f"max_steps={10**30}"],
     ["max_steps"]),
    (["pretrain", "gpt", "--data", "{shards}", "--out", "{tmp}/m", "--set", "n_positions=32", "grad_clip=inf"],
     ["grad_clip", "finite"]),
    (["generate", "{gpt}", "--prompt", "In the", "--max-new-tokens", str(10**30)], ["at most", "max-new-tokens"]),
])
def test_an_out_of_range_number_is_one_line(args, words, gpt_dir, bpe_shards, tiny_corpus, task_files, tmp_path):
    values = {"gpt": gpt_dir, "shards": bpe_shards, "tmp": tmp_path, "corpus": tiny_corpus, "train": task_files[0],
              "test": task_files[1]}
    rc, out, err = cli(*[a.format(**values) for a in args])
    refused((rc, out, err), *words)
    assert out == "" and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("sampling", [["--temperature", "1e-300"], ["--temperature", "5e-324"],
                                      ["--temperature", "1", "--top-p", "1e-300"]])
def test_a_vanishing_temperature_or_top_p_samples_the_greedy_token(sampling, gpt_dir):
    """Past the range checks, a temperature or nucleus too small for float32 is the limit of sampling: greedy."""
    argv = ["generate", gpt_dir, "--prompt", "In the", "--max-new-tokens", "4", "--seed", "0"]
    greedy = ok(cli(*argv))[1]
    assert ok(cli(*argv, *sampling))[1] == greedy


def test_a_float_beyond_64_bits_is_not_called_a_whole_number(gpt_dir):
    rc, out, err = cli("generate", gpt_dir, "--prompt", "In the", "--max-new-tokens", "2", "--temperature", "1e20",
                       "--seed", "0")
    assert rc == 0 and "whole number" not in err, err


def test_shards_whose_meta_json_disagrees_with_the_tokens_are_one_line(bpe_shards, tmp_path):
    shards = tmp_path / "shards"
    shutil.copytree(bpe_shards, shards)
    meta = json.loads((shards / "meta.json").read_text())
    meta["vocab_size"] = 3
    (shards / "meta.json").write_text(json.dumps(meta))
    refused(cli("pretrain", "gpt", "--data", shards, "--out", tmp_path / "m", "--set", "n_positions=32"),
            "vocab_size 3", "token id", "prepare again")
    assert not (tmp_path / "m").exists()


def test_a_plan_whose_two_step_counts_disagree_is_one_line(plan_file, bpe_shards, tmp_path):
    plan = json.loads(Path(plan_file).read_text())
    plan["max_steps"] = plan["train"]["max_steps"] + 5
    edited = tmp_path / "plan.json"
    edited.write_text(json.dumps(plan))
    refused(cli("pretrain", "gpt", "--data", bpe_shards, "--out", tmp_path / "m", "--plan", edited),
            "max_steps", "train.max_steps", "agree")
    assert not (tmp_path / "m").exists()


# -- the smaller ones ----------------------------------------------------------------------------------------
def test_predict_file_that_is_a_folder_says_so(run_dir, tmp_path):
    refused(cli("predict", run_dir, "--file", tmp_path), "is a folder")


def test_an_unreadable_lock_file_is_named_with_its_remedy(tmp_path, tiny_corpus):
    out = tmp_path / "tok"
    lock = tmp_path / ".tok.lock"  # a folder renamed into place when complete is locked beside it
    lock.write_text("garbage\x00")
    line = refused(cli("tokenizer", "train", "--kind", "bpe", "--vocab-size", "300", "--out", out, tiny_corpus),
                   "unreadable", "delete")
    assert "another process" not in line and str(lock) in line
