"""lmforge ELMo biLM vs a plain ``torch.nn.LSTM`` biLM of the same sizes; char-CNN cost; word2vec words/s.

Both LSTM models live in ONE process and take turns step by step (the order flips every step) on
the same batches, so the machine's drift hits both alike.

    python bench/bench_elmo.py                    # default: 2x2 layers of 256, vocab 8192, seq 64, batch 32
    python bench/bench_elmo.py --steps 10 --no-w2v --threads 2 --record elmo.json

What is measured:
* training tokens/s (forward + backward + the Trainer's AdamW step, the same for every model; dropout 0) of
  - lmforge ``ElmoBiLM`` with the word-embedding encoder, cell = projection = 256 (so each layer
    is a plain oneDNN LSTM), residual between the layers, both directions' NLL;
  - the plain biLM: ``nn.Embedding`` -> forward ``nn.LSTM(256, 256, num_layers=2)`` and a second one
    over the flipped sequence -> one ``nn.Linear`` softmax, the same two NLLs;
  - ``ElmoBiLM`` with the char-CNN encoder (widths 1..7, 1024 filters, 2 highway layers) spelling
    the pieces of a real WordPiece vocabulary (trained on the built-in corpus), the same LSTMs:
    the encoder's extra cost;
  - (``--proj``) ``ElmoBiLM`` with projected LSTMs (cell 1024 -> 256): PyTorch runs LSTMs with
    ``proj_size`` on its generic kernel, not oneDNN;
* MFU = model FLOPs/s / the best fp32 GEMM rate measured here; the FLOPs count the LSTM gate and
  projection matmuls and the softmax, and for the char-CNN model its convolutions, highway layers and
  projection over the batch's distinct tokens, times 3 for training;
* word2vec: effective words/s as gensim reports it, skip-gram and CBOW, on the built-in corpus
  tokenised by that WordPiece tokenizer (vocab 8192), one worker thread.

Batches are synthetic Zipf-distributed token ids.
"""

from __future__ import annotations

import argparse
import functools
import logging
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

print = functools.partial(print, flush=True)  # noqa: A001 - progress shows when piped to a file


def measure_peak_gflops(n: int = 1024, reps: int = 8) -> float:
    """Best fp32 GEMM throughput of this machine at the current thread count, in GFLOP/s."""
    best = 0.0
    for size in (n, 2 * n):
        a, b = torch.randn(size, size), torch.randn(size, size)
        torch.mm(a, b)
        for _ in range(reps if size == n else max(2, reps // 4)):
            t = time.perf_counter()
            torch.mm(a, b)
            best = max(best, 2 * size**3 / (time.perf_counter() - t) / 1e9)
    return best


def lstm_flops_per_token(input_size: int, cell: int, proj: int, layers: int) -> float:
    """Forward matmul FLOPs of one direction's LSTM stack per token."""
    out = proj if proj < cell else cell
    total = 0.0
    for i in range(layers):
        inp = input_size if i == 0 else out
        total += 2 * 4 * cell * (inp + out) + (2 * cell * out if proj < cell else 0)
    return total


class PlainBiLM(nn.Module):
    """The reference: two ``nn.LSTM(num_layers=2)`` stacks and a shared softmax, nothing else."""

    def __init__(self, V: int, H: int, layers: int):
        super().__init__()
        self.emb = nn.Embedding(V, H)
        self.fwd = nn.LSTM(H, H, num_layers=layers, batch_first=True)
        self.bwd = nn.LSTM(H, H, num_layers=layers, batch_first=True)
        self.out = nn.Linear(H, V)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)  # (B, T, H)
        f, _ = self.fwd(x)
        b, _ = self.bwd(x.flip(1))
        b = b.flip(1)
        V = self.out.out_features
        lf = F.cross_entropy(self.out(f[:, :-1]).reshape(-1, V), ids[:, 1:].reshape(-1))
        lb = F.cross_entropy(self.out(b[:, 1:]).reshape(-1, V), ids[:, :-1].reshape(-1))
        return lf + lb


def make_batches(n: int, B: int, T: int, V: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    zipf = 1.0 / torch.arange(1, V - 5 + 1, dtype=torch.float)
    return [torch.multinomial(zipf, B * T, replacement=True, generator=g).view(B, T) + 5 for _ in range(n)]


def char_cnn_flops(encoder, ids: torch.Tensor) -> float:
    """Forward matmul FLOPs of the char-CNN encoder on one batch: its convolutions over the batch's distinct
    tokens (spellings cut as ``encode_chars`` cuts them), the highway layers and the projection."""
    chars = encoder.token_chars[torch.unique(ids)].long()
    widest = max(conv.kernel_size[0] for conv in encoder.convs)
    longest = int((chars != 0).sum(dim=1).max())
    width = min(chars.shape[1], max(longest + widest - 1, widest))
    U, E = chars.shape[0], encoder.char_embedding.embedding_dim
    conv = sum(2 * E * c.kernel_size[0] * c.out_channels * (width - c.kernel_size[0] + 1) for c in encoder.convs)
    F_ = sum(c.out_channels for c in encoder.convs)
    dense = len(encoder.highway.layers) * 2 * F_ * 2 * F_ + 2 * F_ * encoder.projection.out_features
    return float(U * (conv + dense))


def bench_lstms(args, tokenizer) -> list[dict]:
    from lmforge.families.elmo.model import ElmoBiLM, ElmoConfig
    from lmforge.train.compute import make_optimizer

    V, H, T, B = args.vocab, args.hidden, args.seq, args.batch
    torch.manual_seed(0)
    models: dict[str, nn.Module] = {
        "plain nn.LSTM biLM": PlainBiLM(V, H, 2),
        "lmforge ELMo (word)": ElmoBiLM(
            ElmoConfig(vocab_size=V, token_encoder="word", projection_dim=H, cell_size=H, dropout=0.0)
        ),
    }
    if not args.no_char:
        char = ElmoBiLM(ElmoConfig(vocab_size=V, token_encoder="char", projection_dim=H, cell_size=H, dropout=0.0))
        char.set_tokenizer(tokenizer)  # real WordPiece pieces, so spellings have realistic lengths
        models["lmforge ELMo (char-CNN)"] = char
    if args.proj:
        models["lmforge ELMo (word, LSTMP 1024->256)"] = ElmoBiLM(
            ElmoConfig(vocab_size=V, token_encoder="word", projection_dim=H, cell_size=4 * H, dropout=0.0)
        )
    # the same optimizer for every model: the Trainer's AdamW (fused where torch has the kernel)
    opts = {k: make_optimizer([{"params": list(m.parameters())}], 1e-3, (0.9, 0.999), 1e-8, torch.device("cpu"))
            for k, m in models.items()}
    print(f"optimizer: AdamW{' (fused)' if opts[next(iter(opts))].defaults.get('fused') else ''} for every model")

    def step(name: str, ids: torch.Tensor) -> float:
        m = models[name]
        loss = m(ids) if isinstance(m, PlainBiLM) else m(ids, labels=ids).loss
        opts[name].zero_grad(set_to_none=True)
        loss.backward()
        opts[name].step()
        return loss.item()

    batches = make_batches(args.steps + args.warmup, B, T, V)
    for name in models:  # same loss at init: ~2 ln V
        print(f"{name:<38} loss at init {step(name, batches[0]):.3f} (2 ln V = {2 * math.log(V):.3f})")
    times: dict[str, list[float]] = {k: [] for k in models}
    names = list(models)
    for i, ids in enumerate(batches):
        order = names if i % 2 == 0 else names[::-1]
        for name in order:
            t = time.perf_counter()
            step(name, ids)
            if i >= args.warmup:
                times[name].append(time.perf_counter() - t)

    peak = measure_peak_gflops()
    lstm = lstm_flops_per_token(H, H, H, 2)
    per_token = 3 * (2 * lstm + 2 * 2 * H * V)
    flops = {name: per_token * B * T for name in names}
    if "lmforge ELMo (word, LSTMP 1024->256)" in flops:
        flops["lmforge ELMo (word, LSTMP 1024->256)"] = 3 * (2 * lstm_flops_per_token(H, 4 * H, H, 2)
                                                             + 2 * 2 * H * V) * B * T
    if "lmforge ELMo (char-CNN)" in flops:  # the encoder's work counts too: it is work the model does
        cnn = statistics.mean(char_cnn_flops(models["lmforge ELMo (char-CNN)"].token_encoder, ids)
                              for ids in batches[args.warmup:])
        flops["lmforge ELMo (char-CNN)"] += 3 * cnn
        print(f"char-CNN encoder: {3 * cnn / 1e9:.2f} GFLOP per training step (forward and backward) on top of "
              f"the biLM's {per_token * B * T / 1e9:.2f}")
    print(f"\nthreads {torch.get_num_threads()}, fp32 GEMM peak here {peak:.0f} GFLOP/s; "
          f"{args.steps} timed steps each (median), batch {B} x seq {T}, vocab {V}, 2x2 layers of {H}")
    print(f"{'model':<38} {'median step':>11} {'tokens/s':>9} {'MFU':>6} {'vs plain':>8}")
    base = statistics.median(times["plain nn.LSTM biLM"])
    rows = []
    for name in names:
        med = statistics.median(times[name])
        row = {"model": name, "median_step_ms": med * 1e3, "tokens_per_s": B * T / med,
               "mfu": flops[name] / med / 1e9 / peak, "speed_vs_plain": base / med}
        rows.append(row)
        print(f"{name:<38} {med * 1e3:9.1f}ms {row['tokens_per_s']:9.0f} {row['mfu']:6.2f} {base / med:8.3f}")
    return rows


def bench_word2vec(args, tmp: Path) -> None:
    from lmforge.data import builtin_corpus_path
    from lmforge.data.shards import Shards, prepare
    from lmforge.families.word2vec.model import Word2VecConfig
    from lmforge.families.word2vec.train import run_pretraining

    prepare([builtin_corpus_path()], tmp / "tok", tmp / "shards", val_fraction=0.02, workers=1)
    shards = Shards.open(tmp / "shards")
    for arch in ("skipgram", "cbow"):
        cfg = Word2VecConfig(vector_size=100, architecture=arch, epochs=args.w2v_epochs, workers=1, seed=0)
        r = run_pretraining(shards, shards.tokenizer(), cfg, tmp / f"w2v_{arch}")
        print(
            f"word2vec {arch:<8}: {r.val['words_per_sec']:9.0f} effective words/s (gensim, 1 worker), "
            f"{r.val['raw_words']:.0f} raw words over {args.w2v_epochs} epochs in {r.elapsed:.1f}s"
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--proj", action="store_true", help="also time projected LSTMs (cell 4x hidden)")
    p.add_argument("--no-char", action="store_true", help="skip the char-CNN encoder")
    p.add_argument("--no-w2v", action="store_true", help="skip the word2vec measurement")
    p.add_argument("--w2v-epochs", type=int, default=1)
    p.add_argument("--record", default=None, metavar="FILE", help="write the figures as a JSON run record")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    from lmforge.data import builtin_corpus_path
    from lmforge.nn.cpu_ops import describe_routes
    from lmforge.provenance import describe_machine, provenance
    from lmforge.tokenization import Tokenizer

    logging.getLogger("lmforge").setLevel(logging.WARNING)
    load_start = os.getloadavg()[0]
    print(f"{describe_machine()}; load average {load_start:.2f} at the start; settings: {vars(args)}")
    print(describe_routes())
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        tokenizer = Tokenizer.train([builtin_corpus_path()], kind="wordpiece", vocab_size=args.vocab)
        tokenizer.save(tmp / "tok")
        rows = bench_lstms(args, tokenizer)
        if not args.no_w2v:
            bench_word2vec(args, tmp)
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    if args.record:
        import json

        from lmforge.storage.files import atomic_write_text

        record = {"bench": "elmo", **provenance(), "settings": vars(args), "rows": rows,
                  "load_average": {"start": load_start, "end": os.getloadavg()[0]}}
        atomic_write_text(args.record, json.dumps(record, indent=1) + "\n")
        print(f"wrote {args.record}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
