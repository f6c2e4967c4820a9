"""Session-scoped fixtures shared by every test file.

- ``tiny_corpus``: path to a small real-text file in BERT layout (one sentence per line, a blank
  line between documents), ~400 lines / ~40 documents drawn deterministically from the built-in
  corpus (Python docs, WordNet glosses and examples incl. both senses of "python", KJV).
- ``wordpiece_tokenizer`` / ``bpe_tokenizer``: :class:`lmforge.tokenization.Tokenizer` trained on
  ``tiny_corpus`` (vocab 500). ``wordpiece_tokenizer_dir`` / ``bpe_tokenizer_dir``: their saved folders.
- ``wordpiece_shards`` / ``bpe_shards``: :class:`pathlib.Path` of shard folders prepared from
  ``tiny_corpus`` (open them with ``lmforge.data.Shards.open(path)``; val split is non-empty).

- ``quick_demo``: ``lmforge demo --quick`` built once (its folder, result and the modules it imported).

Everything is built once per session in a temporary folder and is deterministic.
"""

from __future__ import annotations

import contextlib
import gzip
import os
from pathlib import Path

import pytest
import torch

TINY_VOCAB = 500

# The test models are tiny: one intra-op thread is faster than two fighting over two cores, and
# it keeps float reductions in the same order on every machine (bitwise comparisons with a subprocess
# need the same thread count on both sides).
torch.set_num_threads(1)
# the commands the tests run, in this process or a child, keep to it too (lmforge/cpu_quota.py would otherwise
# choose one thread per free CPU)
THREADS_PINNED_HERE = "OMP_NUM_THREADS" not in os.environ  # the docs walkthroughs run as a user's shell does
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(autouse=True, scope="session")
def choices_cache(tmp_path_factory):
    """Kernel and precision choices measured during the tests go to a session cache (subprocesses share it), not
    the user's ~/.cache/lmforge (lmforge.nn.autotune)."""
    os.environ.setdefault("LMFORGE_CACHE", str(tmp_path_factory.mktemp("lmforge-cache")))


@pytest.fixture(autouse=True)
def cpu_without_native_bf16(tmp_path_factory, monkeypatch):
    """``--precision auto`` resolves to fp32 in every test, whatever CPU runs the suite: the tests compare
    figures with fp32 references (a test of the auto rule points CPUINFO_PATH at its own file)."""
    from lmforge.train import precision

    path = tmp_path_factory.getbasetemp() / "cpuinfo-without-bf16"
    if not path.is_file():
        path.write_text("processor\t: 0\nflags\t\t: fpu sse sse2 avx avx2 fma\n")
    monkeypatch.setattr(precision, "CPUINFO_PATH", str(path))


@pytest.fixture(params=["native", "avx2"])
def cpu_features_level(request, monkeypatch):
    """The test runs twice: with this CPU's own features, then as on a CPU with AVX2 only
    (``LMFORGE_CPU_FEATURES=avx2``: no oneDNN bf16, no AMX, no native bf16); yields the level."""
    from lmforge.nn import cpu_features, cpu_ops

    monkeypatch.setenv(cpu_features.FEATURES_ENV, request.param)
    cpu_features.forget()
    mode = cpu_ops._ONEDNN_MODE
    cpu_ops.set_onednn(mode)  # no route chosen under the other level
    yield request.param
    cpu_features.forget()
    cpu_ops.set_onednn(mode)


@pytest.fixture(autouse=True)
def one_thread():
    """Every test runs on one intra-op thread, whatever an earlier test set."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _read_documents(path: Path) -> list[list[str]]:
    docs: list[list[str]] = []
    cur: list[str] = []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line:
                cur.append(line)
            elif cur:
                docs.append(cur)
                cur = []
    if cur:
        docs.append(cur)
    return docs


def build_tiny_corpus(path: Path, n_docs: int = 40, max_sentences: int = 12) -> Path:
    """Write a small BERT-layout corpus drawn from the built-in corpus (every k-th document).

    The documents mentioning "python" are always included so both senses appear.
    """
    from lmforge.data import builtin_corpus_path

    docs = _read_documents(builtin_corpus_path())
    step = max(1, len(docs) // n_docs)
    chosen = list(range(0, len(docs), step))[:n_docs]
    python_docs = [i for i, d in enumerate(docs) if any("python" in s.lower() for s in d)]
    # one document with the snake sense (WordNet) and one with the language sense (docs)
    snake = next(i for i in python_docs if any("boas" in s for s in docs[i]))
    lang = next(i for i in python_docs if i not in (snake,) and not any("boas" in s for s in docs[i]))
    for i in (snake, lang):
        if i not in chosen:
            chosen.append(i)
    lines: list[str] = []
    for i in sorted(chosen):
        doc = docs[i]
        if i == snake:  # keep the python sentences of the WordNet document
            doc = [s for s in doc if "python" in s.lower()] + [s for s in doc if "python" not in s.lower()]
        lines.extend(doc[:max_sentences])
        lines.append("")
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory) -> Path:
    """Path to a small real-text corpus file (BERT layout, ~40 documents)."""
    return build_tiny_corpus(tmp_path_factory.mktemp("corpus") / "tiny_corpus.txt")


@pytest.fixture(scope="session")
def wordpiece_tokenizer_dir(tmp_path_factory, tiny_corpus) -> Path:
    from lmforge.tokenization import Tokenizer

    out = tmp_path_factory.mktemp("wordpiece")
    Tokenizer.train([tiny_corpus], kind="wordpiece", vocab_size=TINY_VOCAB).save(out)
    return out


@pytest.fixture(scope="session")
def bpe_tokenizer_dir(tmp_path_factory, tiny_corpus) -> Path:
    from lmforge.tokenization import Tokenizer

    out = tmp_path_factory.mktemp("bpe")
    Tokenizer.train([tiny_corpus], kind="bpe", vocab_size=TINY_VOCAB).save(out)
    return out


@pytest.fixture(scope="session")
def wordpiece_tokenizer(wordpiece_tokenizer_dir):
    """A WordPiece Tokenizer (vocab ~500, lower-cased) trained on ``tiny_corpus``."""
    from lmforge.tokenization import Tokenizer

    return Tokenizer.load(wordpiece_tokenizer_dir)


@pytest.fixture(scope="session")
def bpe_tokenizer(bpe_tokenizer_dir):
    """A byte-level BPE Tokenizer (vocab ~500, ``<|endoftext|>``) trained on ``tiny_corpus``."""
    from lmforge.tokenization import Tokenizer

    return Tokenizer.load(bpe_tokenizer_dir)


@pytest.fixture(scope="session")
def wordpiece_shards(tmp_path_factory, tiny_corpus, wordpiece_tokenizer_dir) -> Path:
    """Folder of WordPiece shards of ``tiny_corpus`` (val_fraction 0.1, non-empty val)."""
    from lmforge.data.shards import prepare

    out = tmp_path_factory.mktemp("shards") / "wordpiece"
    prepare([tiny_corpus], wordpiece_tokenizer_dir, out, val_fraction=0.1)
    return out


@pytest.fixture(scope="session")
def bpe_shards(tmp_path_factory, tiny_corpus, bpe_tokenizer_dir) -> Path:
    """Folder of BPE shards of ``tiny_corpus`` (val_fraction 0.1, ``eot_id`` after each document)."""
    from lmforge.data.shards import prepare

    out = tmp_path_factory.mktemp("shards") / "bpe"
    prepare([tiny_corpus], bpe_tokenizer_dir, out, val_fraction=0.1)
    return out


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory, wordpiece_tokenizer) -> Path:
    """A folder of the tiny random BERT of ``test_transfer_families.tiny_bert`` (seed 0) with its tokenizer."""
    from test_transfer_families import tiny_bert

    d = tmp_path_factory.mktemp("bert")
    tiny_bert(wordpiece_tokenizer).save_pretrained(d, wordpiece_tokenizer)
    return d


@pytest.fixture(scope="module")
def gpt_dir(tmp_path_factory, bpe_tokenizer) -> Path:
    """A folder of the tiny random GPT of ``test_transfer_families.tiny_gpt`` (seed 0) with its tokenizer."""
    from test_transfer_families import tiny_gpt

    d = tmp_path_factory.mktemp("gpt")
    tiny_gpt(bpe_tokenizer).save_pretrained(d, bpe_tokenizer)
    return d


@pytest.fixture(scope="module")
def model_folders(tmp_path_factory, wordpiece_tokenizer, bpe_tokenizer) -> dict[str, Path]:
    """What the commands that run a trained model read, in folders named ``bert`` and ``gpt`` (as a server names
    them; the models of :func:`bert_dir` and :func:`gpt_dir`), ``run`` (a frozen classify run on ``bert``, one
    epoch, fp32), its labelled ``data`` and a ``texts`` file."""
    import json

    from test_transfer_families import rows, tiny_bert, tiny_gpt

    from lmforge.transfer import run_transfer

    root = tmp_path_factory.mktemp("runs")
    bert_dir, gpt_dir = root / "bert", root / "gpt"
    tiny_bert(wordpiece_tokenizer).save_pretrained(bert_dir, wordpiece_tokenizer)
    tiny_gpt(bpe_tokenizer).save_pretrained(gpt_dir, bpe_tokenizer)
    data = root / "cls.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows(16, 1)))
    run = root / "run"
    run_transfer(bert_dir, "classify", data, data, mode="frozen", out_dir=run, epochs=1, max_len=32, seed=0,
                 device="cpu", precision="fp32")
    texts = root / "texts.txt"
    texts.write_text("the python is a snake\npython is a language\nand god said\n")
    return {"bert": bert_dir, "gpt": gpt_dir, "run": run, "data": data, "texts": texts}


@pytest.fixture
def native_bf16(tmp_path, monkeypatch) -> Path:
    """A CPU with AMX (its /proc/cpuinfo flags) and a fresh choices cache; yields the cache file."""
    from lmforge.nn import autotune
    from lmforge.train import precision

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: Test CPU\nflags\t\t: avx2 avx512f amx_tile amx_bf16\n")
    monkeypatch.setattr(precision, "CPUINFO_PATH", str(info))
    monkeypatch.delenv("LMFORGE_CPU_FEATURES", raising=False)  # this CPU's features, not the AVX2 ones
    monkeypatch.setenv(autotune.CACHE_ENV, str(tmp_path / "cache"))
    autotune.forget()
    yield tmp_path / "cache" / autotune.CACHE_FILE
    autotune.forget()


@contextlib.contextmanager
def record_imports(mp: pytest.MonkeyPatch):
    """The third-party top-level modules that lmforge's own code imports or locates (``find_spec``) inside the
    block: ``import`` statements, ``importlib.import_module`` and ``importlib.util.find_spec`` called from a module
    of lmforge (the standard library left out)."""
    import builtins
    import importlib
    import importlib.util
    import sys

    seen: set[str] = set()

    def note(name: str, caller: dict | None) -> None:
        top = name.split(".")[0]
        if (caller or {}).get("__name__", "").startswith("lmforge") and top and top != "lmforge" \
                and top not in sys.stdlib_module_names:
            seen.add(top)

    real_import, real_import_module = builtins.__import__, importlib.import_module
    real_find_spec = importlib.util.find_spec

    def imp(name, globals=None, locals=None, fromlist=(), level=0):
        if level == 0:
            note(name, globals)
        return real_import(name, globals, locals, fromlist, level)

    def import_module(name, package=None):
        note(name, sys._getframe(1).f_globals)
        return real_import_module(name, package)

    def find_spec(name, *a):
        note(name, sys._getframe(1).f_globals)
        return real_find_spec(name, *a)

    mp.setattr(builtins, "__import__", imp)
    mp.setattr(importlib, "import_module", import_module)
    mp.setattr(importlib.util, "find_spec", find_spec)
    yield seen


@pytest.fixture(scope="session")
def quick_demo(tmp_path_factory):
    """``lmforge demo --quick`` built once per session from an empty folder (seed 0, one thread, fp32, as every
    test runs): a namespace of ``out`` (the folder), ``result`` (its :class:`lmforge.demo.DemoResult`),
    ``imported`` (what :func:`record_imports` saw while it built) and ``warnings`` (the lmforge warnings it
    logged).  tests/test_demo.py checks the build; the docs walk-throughs that build the quick demo start from a
    copy, so their own run reuses every step.  Copy the folder before writing to it."""
    import logging
    import types

    from lmforge import demo
    from lmforge.storage.writing import output_folder
    from lmforge.train import precision

    out = tmp_path_factory.mktemp("quick-demo") / "demo"
    cpuinfo = tmp_path_factory.mktemp("cpuinfo") / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse sse2 avx avx2 fma\n")  # as cpu_without_native_bf16
    warned: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: warned.append(record.getMessage())
    threads = torch.get_num_threads()
    logger = logging.getLogger("lmforge")
    logger.addHandler(handler)
    try:
        with pytest.MonkeyPatch.context() as mp, record_imports(mp) as imported:
            mp.setattr(precision, "CPUINFO_PATH", str(cpuinfo))
            torch.set_num_threads(1)
            torch.manual_seed(0)
            with output_folder(out, "demo", hint=None):  # as `lmforge demo` claims its folder
                result = demo.run_demo(out, quick=True)
    finally:
        logger.removeHandler(handler)
        torch.set_num_threads(threads)
    return types.SimpleNamespace(out=out, result=result, imported=set(imported), warnings=warned)
