"""The speed benches run as docs/bert.md and docs/gpt.md show them (tiny shapes here: nothing is timed against
anything), with both models under the allocator setting asked for and recorded."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from lmforge.nn.cpu_features import onednn_bf16

ROOT = Path(__file__).resolve().parents[1]
TINY = {
    "bench_bert.py": ["--steps", "1", "--infer-steps", "1", "--bf16-steps", "0", "--warmup", "1", "--hidden", "32",
                      "--layers", "1", "--heads", "2", "--intermediate", "64", "--vocab", "128", "--seq", "16",
                      "--batch", "2"],
    "bench_gpt.py": ["--n-embd", "32", "--n-layer", "1", "--n-head", "2", "--vocab", "128", "--seq", "16", "--batch",
                     "2", "--steps", "1", "--warmup", "1", "--gen-tokens", "4", "--gen-runs", "1"],
}


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(TINY))
@pytest.mark.parametrize("malloc", ["system", "keep"])
def test_bench_runs_and_records_its_allocator(script, malloc, tmp_path):
    record = tmp_path / "record.json"
    env_free = {"LMFORGE_MALLOC", "GLIBC_TUNABLES", "LD_PRELOAD"}
    env = {k: v for k, v in os.environ.items() if k not in env_free and not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, str(ROOT / "bench" / script), *TINY[script], "--threads", "1",
                          "--malloc", malloc, "--record", str(record)],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]  # the benches exit 1 when losses disagree
    rec = json.loads(record.read_text())
    assert rec["settings"]["malloc"] == malloc and f"allocator: {rec['malloc']}" in out.stdout
    if malloc == "system":
        assert rec["malloc"] == "glibc's defaults"
    elif sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc":
        assert rec["malloc"].startswith("glibc, keeping freed memory"), rec["malloc"]
    if script == "bench_gpt.py":
        assert rec["loss_check"]["max_abs_diff"] < 1e-4 and rec["gen"]["same_tokens"]
        # bf16 runs on every CPU: on oneDNN's kernel where it has one, else on PyTorch's (an AVX2-only CPU)
        assert rec["bf16"]["matmul_route"] == ("torch" if not onednn_bf16() else "onednn or torch, by measurement")


@pytest.mark.slow
def test_encode_bench_checks_the_vectors_against_transformers(bert_dir, tiny_corpus, tmp_path):
    texts = tmp_path / "texts.txt"
    lines = [line for line in tiny_corpus.read_text(encoding="utf-8").splitlines() if line.strip()]
    texts.write_text("\n".join(lines[:60]) + "\n", encoding="utf-8")
    record = tmp_path / "record.json"
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_encode.py"), "--model", str(bert_dir), "--texts",
                          str(texts), "--n", "60", "--batch", "8", "--rounds", "1", "--threads", "1",
                          "--bf16", "--record", str(record)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]  # exit 1 when the vectors disagree
    rec = json.loads(record.read_text())
    assert rec["max_vector_diff"] < 1e-3 and 0 < rec["texts"] <= 60
    assert set(rec["texts_per_s"]) == {"lmforge", "lmforge, input order", "transformers", "lmforge, bf16"}
    assert rec["bf16_min_cosine"] > 0.99


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_benches_set_one_thread_count_for_both_sides_and_check_it(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import thread_setting
    import torch

    from lmforge import cpu_quota

    assert thread_setting.apply(3) == (3, "3 torch threads for both sides (--threads)")
    assert torch.get_num_threads() == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # the user's: kept
    torch.set_num_threads(2)
    assert thread_setting.apply(None) == (2, "2 torch threads for both sides (OMP_NUM_THREADS)")
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setattr(cpu_quota, "others_between", lambda before, after: 1.0)  # one of the 2 CPUs is taken
    monkeypatch.setattr(cpu_quota, "_allowed_cpus", lambda: {0, 1})
    monkeypatch.setattr(thread_setting, "ceiling_threads", lambda: 2)
    threads, line = thread_setting.apply(None)
    assert threads == 1 and torch.get_num_threads() == 1 and "lmforge's choice: other processes kept 1.0" in line
    thread_setting.check(1)
    torch.set_num_threads(2)  # something changed it mid-bench: the bench must not print its ratios
    with pytest.raises(SystemExit, match="changed from 1 to 2"):
        thread_setting.check(1)


@pytest.mark.slow
def test_the_contention_bench_compares_lmforge_s_default_with_fixed_counts(tmp_path):
    record = tmp_path / "contend.json"
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_threads.py"), "--contend", "--burners", "1",
                          "--burn-seconds", "120", "--steps", "2", "--warmup", "1", "--batch", "2", "--seq", "16",
                          "--texts", "8", "--mid", "4", "--record", str(record)], env=env, capture_output=True,
                         text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    rec = json.loads(record.read_text())
    assert rec["mode"] == "contend" and rec["machine"]
    for case, measure in ((1, "train_tokens_per_s"), (1, "encode_texts_per_s"), ("1 mid-run", "train_tokens_per_s")):
        rows = [r for r in rec["rows"] if r["measure"] == measure and r["burners"] == case]
        assert [r["threads"] for r in rows][-1] == "lmforge's default" and len(rows) >= 2
        fixed = [r for r in rows if r["threads"] != "lmforge's default"]
        assert max(r["vs_best_fixed"] for r in fixed) == 1.0 and all(r["value"] > 0 for r in rows)
    assert len(rec["rows"]) == 3 * len(rows)  # the mid-run case times training only
    assert "lmforge's default, worst case" in out.stdout


@pytest.mark.slow
def test_serve_bench_batches_concurrent_embeddings_and_records_the_load(bert_dir, tmp_path):
    record = tmp_path / "serve.json"
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_serve.py"), "--model", str(bert_dir),
                          "--requests", "16", "--rounds", "1", "--threads", "1", "--record", str(record)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]  # exit 1 when a backend's vectors disagree
    rec = json.loads(record.read_text())
    assert rec["bench"] == "serve_embeddings" and rec["provenance"]["machine"]["cpu"]
    assert set(rec["load_average"]) == {"start", "end"} and "load average at the end" in out.stdout
    assert rec["max_vector_diff"]["torch"] == 0 and rec["max_vector_diff"]["onnx"] <= 1e-4
    rows = {(r["backend"], r["clients"]): r for r in rec["rows"]}
    assert set(rows) == {(b, c) for b in ("torch", "onnx", "onnx int8") for c in (1, 8)}
    assert all(rows[b, 1]["passes_per_request"] == 1 for b in ("torch", "onnx", "onnx int8"))
    assert all(rows[b, 8]["passes_per_request"] < 1 for b in ("torch", "onnx", "onnx int8"))  # requests shared
