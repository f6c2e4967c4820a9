"""The CUDA paths against the CPU ones through the CLI a user runs, and the GPU comparisons (one CUDA device).

On a few thousand lines of the built-in corpus, with dropout off and TF32 off (``NVIDIA_TF32_OVERRIDE=0``),
the sections (``--only``, comma-separated; default all but ``nanogpt`` without ``--nanogpt``):

- ``pretrain``: ``lmforge pretrain bert|gpt|elmo --config tiny`` for ``--steps`` steps with ``--device cpu``
  and ``--device cuda``: the largest gap between the per-step training losses, the final validation
  losses; the same runs with ``--precision bf16`` on the GPU; and ``--precision auto`` says bf16;
- ``resume``: ``--resume`` on the GPU (half the steps, then the rest) against the uninterrupted run;
- ``torchrun``: ``torchrun --nproc_per_node 1`` (the NCCL process group) against the plain GPU run;
- ``transfer``: ``lmforge finetune`` (finetune and features modes), greedy ``lmforge generate`` and
  ``lmforge encode`` with ``--device cuda`` against ``--device cpu``, and in bf16 and fp16 against fp32;
- ``step``: the Trainer's step on the GPU: fused AdamW, and the host syncs per step (``torch.cuda``'s
  sync debug mode; the Trainer itself adds none, a model's data-dependent shapes may);
- ``throughput``: BERT 'base' and GPT 'gpt2-small' pretraining tokens/s in bf16 through the CLI;
- ``bert``: ``bench/bench_bert.py`` at BERT-base's shape on the GPU against HF's ``BertForPreTraining``;
- ``nanogpt``: ``bench/bench_nanogpt.py`` (GPT-2 small, bf16, ``torch.compile`` on both) against nanoGPT,
  with ``--nanogpt`` naming a checkout of karpathy/nanoGPT (no network on a GPU machine: bring it);
- ``compile``: ``bench/bench_compile.py`` on the GPU (start-up and steady speed of ``torch.compile``).

Usage: ``python bench/gpu_check.py --out DIR [--steps 40] [--only pretrain,step,nanogpt] [--nanogpt PATH]``.
It prints one line per check, writes ``DIR/gpu_check.json`` and each bench's JSON record into ``DIR``
(copy the ones you keep into docs/gpu/); the exit status is 1 when a check fails.  The whole script fits in
about ten minutes on one H100; ``--only`` picks parts when device time is short.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

CORPUS = Path(__file__).resolve().parents[1] / "src" / "lmforge" / "resources" / "corpus_en.txt.gz"
NO_DROPOUT = {
    "bert": ["hidden_dropout_prob=0", "attention_probs_dropout_prob=0"],
    "gpt": ["resid_pdrop=0", "embd_pdrop=0", "attn_pdrop=0"],
    "elmo": ["dropout=0"],
}
SHARDS = {"bert": "wp", "gpt": "bpe", "elmo": "wp"}
LOSS_TOL = 2e-3  # largest allowed |cpu - cuda| training-loss gap, fp32, per step
BF16_TOL = 0.05  # largest allowed relative gap of bf16's final validation loss to fp32's


def sh(cmd: list[str], log: Path, env: dict | None = None) -> float:
    """Run ``cmd``, appending its output to ``log``; the wall time; raise on a non-zero exit."""
    t0 = time.perf_counter()
    with log.open("a") as f:
        f.write("$ " + shlex.join(cmd) + "\n")
        f.flush()
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    if r.returncode != 0:
        raise SystemExit(f"failed ({r.returncode}): {shlex.join(cmd)}; see {log}")
    return time.perf_counter() - t0


def events(model_dir: Path, split: str) -> list[dict]:
    rows = [json.loads(line) for line in (model_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in rows if r.get("split") == split]


SECTIONS = ("pretrain", "resume", "torchrun", "transfer", "step", "throughput", "bert", "nanogpt", "compile")
BENCH = Path(__file__).resolve().parent


def step_check(device: str) -> dict:
    """The Trainer's optimizer and the host syncs of its steps, on a GPT of the tiny preset (in this process)."""
    import numpy as np
    import torch

    from lmforge.families.gpt.model import GPTConfig, GPTLMHeadModel
    from lmforge.families.gpt.presets import PRESETS
    from lmforge.train import TrainConfig, Trainer

    class Windows:  # random windows of a fixed token stream: the sampler contract, no shards needed
        def __init__(self):
            self.tokens = np.random.default_rng(0).integers(0, 4096, 200_000)

        def batch(self, rngs, split):
            rows = [self.tokens[(s := int(r.integers(0, len(self.tokens) - 65))):s + 64] for r in rngs]
            ids = torch.as_tensor(np.stack(rows), dtype=torch.long)
            return {"input_ids": ids, "labels": ids.clone()}

    model = GPTLMHeadModel(GPTConfig(**{**PRESETS["tiny"], "vocab_size": 4096, "n_positions": 64}))
    cfg = TrainConfig(max_steps=6, batch_size=8, log_every=6, eval_every=0, save_every=0, eval_batches=1,
                      device=device, precision="bf16")
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        trainer = Trainer(model, Windows(), cfg, d, plot=False)
        trainer._interval_loss = torch.zeros((), dtype=torch.float64, device=trainer.device)
        trainer._interval_steps = 0
        trainer._train_step()  # warm-up
        trainer.step += 1
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("warn")
        import warnings

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(3):
                trainer._train_step()
                trainer.step += 1
            torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode(0)
    syncs = [str(w.message).splitlines()[0] for w in caught if "synchroniz" in str(w.message)]
    return {"fused_adamw": bool(trainer.optimizer.defaults.get("fused")), "syncs_per_step": len(syncs) / 3,
            "sync_sources": sorted(set(syncs))[:5]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--lines", type=int, default=4000, help="lines of the built-in corpus to train on")
    ap.add_argument("--gpu", default="cuda", help="the device under test (cpu: the plumbing, on a machine without one)")
    ap.add_argument("--only", default=None, help=f"comma-separated sections of {', '.join(SECTIONS)}")
    ap.add_argument("--nanogpt", type=Path, default=None, help="a checkout of karpathy/nanoGPT (section nanogpt)")
    ap.add_argument("--lmforge", default=f"{sys.executable} -m lmforge.cli", help="how to call the CLI")
    args = ap.parse_args()
    only = set(args.only.split(",")) if args.only else {s for s in SECTIONS if s != "nanogpt" or args.nanogpt}
    unknown = only - set(SECTIONS)
    if unknown:
        raise SystemExit(f"gpu_check: unknown section(s) {', '.join(sorted(unknown))}; "
                         f"choose from {', '.join(SECTIONS)}")
    if args.gpu.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("gpu_check: no CUDA device here; run it on a machine with a GPU (or --gpu cpu)")
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    log = out / "commands.log"
    lm = shlex.split(args.lmforge)
    env = {"NVIDIA_TF32_OVERRIDE": "0", "PYTHONUNBUFFERED": "1"}
    results: dict = {"sections": sorted(only)}
    failed: list[str] = []

    def check(name: str, ok: bool, text: str) -> None:
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {text}", flush=True)
        if not ok:
            failed.append(name)

    # data: a slice of the built-in corpus, a WordPiece and a BPE tokenizer, shards of each
    corpus = out / "corpus.txt"
    with gzip.open(CORPUS, "rt", encoding="utf-8") as f:
        lines = [line for _, line in zip(range(args.lines), f)]
    corpus.write_text("".join(lines), encoding="utf-8")
    if only & {"pretrain", "resume", "torchrun", "transfer", "throughput"}:
        for kind, short in (("wordpiece", "wp"), ("bpe", "bpe")):
            if not (out / f"shards-{short}").exists():
                sh([*lm, "tokenizer", "train", "--kind", kind, "--vocab-size", "4096", "--out",
                    str(out / f"tok-{short}"), "--overwrite", str(corpus)], log, env)
                sh([*lm, "prepare", "--tokenizer", str(out / f"tok-{short}"), "--out", str(out / f"shards-{short}"),
                    str(corpus)], log, env)

    def pretrain(family: str, name: str, device: str, extra: list[str] = (), steps: int | None = None,
                 prefix: list[str] | None = None, precision: str = "fp32", config: str = "tiny") -> tuple[Path, float]:
        model = out / name
        sets = ["seed=0", "log_every=1", "batch_size=8", "eval_batches=4", f"max_steps={steps or args.steps}",
                f"eval_every={steps or args.steps}", f"save_every={steps or args.steps}", *NO_DROPOUT[family], *extra]
        cmd = [*(prefix or lm), "pretrain", family, "--data", str(out / f"shards-{SHARDS[family]}"), "--out",
               str(model), "--overwrite", "--config", config, "--device", device, "--precision", precision,
               "--set", *sets]
        return model, sh(cmd, log, env)

    if "pretrain" in only:  # CPU vs CUDA (fp32), CUDA bf16, auto's choice
        for family in ("bert", "gpt", "elmo"):
            cpu, t_cpu = pretrain(family, f"{family}-cpu", "cpu")
            gpu, t_gpu = pretrain(family, f"{family}-cuda", args.gpu)
            bf, _ = pretrain(family, f"{family}-bf16", args.gpu, precision="bf16")
            a = [e["loss"] for e in events(cpu, "train")]
            b = [e["loss"] for e in events(gpu, "train")]
            gap = max(abs(x - y) for x, y in zip(a, b))
            va, vb, vbf = (events(m, "val")[-1]["loss"] for m in (cpu, gpu, bf))
            results[family] = dict(steps=len(a), max_train_loss_gap=gap, val_cpu=va, val_cuda=vb, val_bf16=vbf,
                                   first_loss=a[0], last_loss=a[-1], seconds_cpu=t_cpu, seconds_cuda=t_gpu)
            check(f"{family} fp32 cpu vs cuda", len(a) == len(b) == args.steps and gap < LOSS_TOL,
                  f"{len(a)} steps, loss {a[0]:.4f} -> {a[-1]:.4f}, largest per-step gap {gap:.2e}; "
                  f"val {va:.4f} / {vb:.4f}")
            check(f"{family} bf16 on cuda", abs(vbf - vb) / vb < BF16_TOL, f"val {vbf:.4f} vs fp32 {vb:.4f}")
        auto, _ = pretrain("gpt", "gpt-auto", args.gpu, precision="auto", steps=2)
        chosen = json.loads((auto / "train_config.json").read_text()).get("precision")
        results["auto_precision"] = chosen
        check("--precision auto on cuda", chosen == "bf16" or not args.gpu.startswith("cuda"), f"chose {chosen}")

    if "resume" in only:  # resume on the GPU equals the uninterrupted run (a fixed linear schedule)
        half = args.steps // 2
        sched = ["schedule=linear", f"decay_steps={args.steps}", "warmup_steps=2"]
        full, _ = pretrain("gpt", "gpt-cuda-full", args.gpu, sched)
        split, _ = pretrain("gpt", "gpt-cuda-split", args.gpu, sched, steps=half)
        sh([*lm, "pretrain", "gpt", "--data", str(out / "shards-bpe"), "--out", str(split), "--resume",
            "--set", f"max_steps={args.steps}"], log, env)
        a = [e["loss"] for e in events(full, "train")]
        b = [e["loss"] for e in events(split, "train")]
        gap = max(abs(x - y) for x, y in zip(a, b))
        results["resume"] = dict(steps=len(b), max_train_loss_gap=gap)
        check("gpt resume on cuda", len(a) == len(b) == args.steps and gap < 1e-4,
              f"{half} + {args.steps - half} steps vs {args.steps}: largest per-step gap {gap:.2e}")

    if "torchrun" in only:  # one process under torchrun (NCCL) against the plain GPU run
        try:
            plain = out / "gpt-cuda"
            if not plain.exists():
                plain, _ = pretrain("gpt", "gpt-cuda", args.gpu)
            tr, _ = pretrain("gpt", "gpt-torchrun", args.gpu, prefix=[sys.executable, "-m", "torch.distributed.run",
                                                                     "--nproc_per_node", "1", "-m", "lmforge.cli"])
            a = [e["loss"] for e in events(plain, "train")]
            b = [e["loss"] for e in events(tr, "train")]
            gap = max(abs(x - y) for x, y in zip(a, b))
            results["torchrun"] = dict(max_train_loss_gap=gap)
            check("gpt torchrun (nccl, 1 process) vs plain", gap < LOSS_TOL, f"largest per-step gap {gap:.2e}")
        except SystemExit as e:
            check("gpt torchrun (nccl, 1 process)", False, str(e))

    if "transfer" in only:
        transfer_checks(args, out, lm, log, env, lines, results, check, pretrain)

    if "step" in only and args.gpu.startswith("cuda"):
        r = results["step"] = step_check(args.gpu)
        check("trainer step on cuda", r["fused_adamw"],
              f"fused AdamW {r['fused_adamw']}; {r['syncs_per_step']:.1f} host syncs per step "
              f"({'; '.join(r['sync_sources']) or 'none'})")

    if "throughput" in only:  # the larger shapes in bf16 (tokens/s over the last logs)
        for family, preset, extra in (("bert", "base", ["batch_size=64"]), ("gpt", "gpt2-small", ["batch_size=32"])):
            model = out / f"{family}-{preset}-bf16"
            sh([*lm, "pretrain", family, "--data", str(out / f"shards-{SHARDS[family]}"), "--out", str(model),
                "--overwrite", "--config", preset, "--device", args.gpu, "--precision", "bf16", "--set",
                "max_steps=60", "log_every=5", "eval_every=60", "save_every=60", "eval_batches=2", *extra], log, env)
            tps = [e["tokens_per_s"] for e in events(model, "train")][-6:]
            results[f"throughput_{family}_{preset}"] = sum(tps) / len(tps)
            print(f"info {family} '{preset}' bf16 on cuda: {sum(tps) / len(tps):,.0f} tokens/s "
                  f"({extra[0]}, last {len(tps)} logs)", flush=True)

    benches = {
        "bert": [sys.executable, str(BENCH / "bench_bert.py"), "--device", args.gpu, "--hidden", "768", "--layers",
                 "12", "--heads", "12", "--intermediate", "3072", "--vocab", "30522", "--batch", "32",
                 "--steps", "10", "--infer-steps", "10", "--bf16-steps", "10",
                 "--record", str(out / "bench_bert.json")],
        "nanogpt": [sys.executable, str(BENCH / "bench_nanogpt.py"), "--nanogpt", str(args.nanogpt), "--device",
                    args.gpu, "--steps", "15", "--record", str(out / "bench_nanogpt.json")],
        "compile": [sys.executable, str(BENCH / "bench_compile.py"), "gpt", "--device", args.gpu, "--steps", "10",
                    "--record", str(out / "bench_compile_gpt.json")],
    }
    for name, cmd in benches.items():
        if name in only:
            try:
                sh(cmd, log, env)
                record = json.loads((out / f"{'bench_compile_gpt' if name == 'compile' else 'bench_' + name}.json")
                                    .read_text())
                results[name] = {k: record.get(k) for k in ("train", "inference", "bf16", "rows", "ratio",
                                                             "compiled_speedup", "first_step_s", "breakeven_steps")
                                 if k in record}
                print(f"info {name}: {json.dumps(results[name])[:300]}", flush=True)
            except SystemExit as e:
                check(name, False, str(e))

    (out / "gpu_check.json").write_text(json.dumps(results, indent=1))
    print(f"{'all checks passed' if not failed else 'failed: ' + ', '.join(failed)}; wrote {out / 'gpu_check.json'}")
    return 1 if failed else 0


def transfer_checks(args, out, lm, log, env, lines, results, check, pretrain) -> None:
    """finetune (both modes), greedy generate and encode on the GPU against the CPU."""
    for family in ("bert", "gpt"):
        if not (out / f"{family}-cpu").exists():
            pretrain(family, f"{family}-cpu", "cpu")
    rows = [line.strip() for line in lines if len(line.split()) >= 4][:600]
    labelled = [(t[:300], int(" the " in f" {t.lower()} ")) for t in rows]
    for name, part in (("train.csv", labelled[:400]), ("test.csv", labelled[400:])):
        with (out / name).open("w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(["text", "label"])
            w.writerows(part)
    for mode in ("finetune", "features"):
        scores = {}
        for device in ("cpu", "cuda"):
            run = out / f"ft-{mode}-{device}"
            sh([*lm, "finetune", str(out / "bert-cpu"), "--task", "classify", "--train", str(out / "train.csv"),
                "--test", str(out / "test.csv"), "--mode", mode, "--out", str(run), "--overwrite", "--epochs", "3",
                *(["--lr", "3e-4", "--val-fraction", "0"] if mode == "finetune" else []),
                "--seed", "0", "--max-len", "64", "--precision", "fp32",
                "--device", device if device == "cpu" else args.gpu], log, env)
            scores[device] = json.loads((run / "metrics.json").read_text())
        acc = {d: s["accuracy"] if "accuracy" in s else s.get("test", {}).get("accuracy") for d, s in scores.items()}
        results[f"finetune_{mode}"] = acc
        check(f"finetune --mode {mode} cpu vs cuda", acc["cpu"] is not None and abs(acc["cpu"] - acc["cuda"]) <= 0.01,
              f"test accuracy {acc['cpu']} / {acc['cuda']}")
    texts = {}
    for device in ("cpu", "cuda"):
        dev = device if device == "cpu" else args.gpu
        r = subprocess.run([*lm, "-q", "generate", str(out / "gpt-cpu"), "--prompt", "The history of",
                            "--max-new-tokens", "30", "--device", dev], capture_output=True, text=True,
                           env={**os.environ, **env})
        texts[device] = r.stdout.strip() if r.returncode == 0 else f"(exit {r.returncode}: {r.stderr.strip()[-200:]})"
    results["generate"] = texts
    check("greedy generate cpu vs cuda", texts["cpu"] == texts["cuda"] and not texts["cpu"].startswith("(exit"),
          repr(texts["cuda"][:80]))
    (out / "texts.txt").write_text("\n".join(rows[:400]) + "\n", encoding="utf-8")
    vectors = {}
    for device in ("cpu", "cuda"):
        dev = device if device == "cpu" else args.gpu
        sh([*lm, "encode", str(out / "bert-cpu"), "--file", str(out / "texts.txt"), "--out",
            str(out / f"vectors-{device}.npy"), "--device", dev], log, env)
        vectors[device] = np.load(out / f"vectors-{device}.npy", allow_pickle=False)
    gap = float(np.abs(vectors["cpu"] - vectors["cuda"]).max())
    results["encode"] = dict(texts=len(vectors["cpu"]), max_abs_diff=gap)
    check("encode cpu vs cuda", vectors["cpu"].shape == vectors["cuda"].shape and gap < 1e-3,
          f"{len(vectors['cpu'])} vectors, largest difference {gap:.1e}")
    # the half precisions `encode --precision` (and serve's) run under autocast on the GPU: close to fp32's vectors
    for precision in ("bf16", "fp16") if args.gpu.startswith("cuda") else ("bf16",):
        half = out / f"vectors-cuda-{precision}.npy"
        sh([*lm, "encode", str(out / "bert-cpu"), "--file", str(out / "texts.txt"), "--out", str(half),
            "--device", args.gpu, "--precision", precision], log, env)
        v = np.load(half, allow_pickle=False)
        cos = (v * vectors["cpu"]).sum(1) / np.linalg.norm(v, axis=1) / np.linalg.norm(vectors["cpu"], axis=1)
        results[f"encode_{precision}"] = dict(min_cosine=float(cos.min()))
        check(f"encode --precision {precision} vs fp32", float(cos.min()) > 0.999, f"least cosine {cos.min():.5f}")


if __name__ == "__main__":
    sys.exit(main())
