"""One ELECTRA training step against one MLM-only BERT step of the same discriminator shape; the generator's share.

Three models live in one process and take turns step by step (the order rotates every round), so the
machine's drift hits all alike; each time is the median of its steps:

* ``electra``: ELECTRA's whole step - the generator's forward on the masked input, sampling, the
  discriminator's forward on the corrupted input, both losses, one backward, AdamW;
* ``disc-only``: the same model's discriminator alone on the same corrupted inputs (its RTD loss,
  backward, AdamW): what the step would cost without a generator;
* ``bert``: an MLM-only BERT whose encoder is the discriminator's shape (``next_sentence=false``, as the
  demo's in-domain BERT), on the same ids masked 80/10/10.

The generator's share of ELECTRA's step is ``1 - disc-only / electra``; ``electra / bert`` is what the
replaced-token objective costs per step over masked LM.  Batches are synthetic: Zipf-distributed ids,
15 % of the positions picked.

    python bench/bench_electra.py                      # mini: hidden 256, 4 layers, seq 128, batch 16
    python bench/bench_electra.py --preset small       # the paper's ELECTRA-Small (12 layers, embedding 128)
    python bench/bench_electra.py --precision bf16     # under bf16 autocast
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time

import torch
import torch.nn.functional as F


def make_batches(n: int, B: int, T: int, V: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """Zipf ids with [CLS] / [SEP] (ids 2, 3), 15 % of the inside positions picked; the labels, BERT's 80/10/10
    input, ELECTRA's 85/15 input and the generator's sampling noise of each batch."""
    g = torch.Generator().manual_seed(seed)
    zipf = 1.0 / torch.arange(1, V - 5 + 1, dtype=torch.float)
    out = []
    for _ in range(n):
        ids = torch.multinomial(zipf, B * T, replacement=True, generator=g).view(B, T) + 5  # (B, T)
        ids[:, 0], ids[:, -1] = 2, 3
        pick = torch.rand(B, T, generator=g) < 0.15
        pick[:, 0] = pick[:, -1] = False
        u = torch.rand(B, T, generator=g)
        bert = ids.masked_fill(pick & (u < 0.8), 4)
        rand = pick & (u >= 0.8) & (u < 0.9)
        bert[rand] = torch.randint(5, V, (int(rand.sum()),), generator=g)
        out.append({
            "labels": ids.masked_fill(~pick, -100),
            "bert": bert,
            "electra": ids.masked_fill(pick & (u < 0.85), 4),
            "noise": torch.rand(B, T, generator=g),
            "mask": torch.ones(B, T, dtype=torch.long),
        })
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="mini", help="an ELECTRA preset (tiny, mini, small, base); default mini")
    ap.add_argument("--steps", type=int, default=20, help="timed steps per model")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)

    from lmforge.families.bert.model import BertConfig, BertForPreTraining
    from lmforge.families.electra.model import ElectraConfig, ElectraForPreTraining
    from lmforge.families.electra.presets import PRESETS

    if args.preset not in PRESETS:
        print(f"unknown preset {args.preset!r}; choose one of {', '.join(PRESETS)}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    dev, B, T = args.device, args.batch, args.seq
    ecfg = ElectraConfig(**{**PRESETS[args.preset], "vocab_size": args.vocab})
    shape = {k: getattr(ecfg, k) for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                           "intermediate_size", "hidden_dropout_prob",
                                           "attention_probs_dropout_prob")}
    bcfg = BertConfig(vocab_size=args.vocab, next_sentence=False, **shape)
    torch.manual_seed(0)
    electra, bert = ElectraForPreTraining(ecfg).to(dev).train(), BertForPreTraining(bcfg).to(dev).train()
    opts = {name: torch.optim.AdamW(m.parameters(), lr=5e-4) for name, m in (("electra", electra), ("bert", bert))}
    width, heads, ffn = ecfg.generator_shape
    n_gen = sum(p.numel() for n, p in electra.named_parameters() if n.startswith("generator."))
    where = torch.cuda.get_device_name() if dev.startswith("cuda") else f"{args.threads} threads"
    print(f"torch {torch.__version__}, {where}, {args.precision}; preset {args.preset}: hidden {ecfg.hidden_size}, "
          f"{ecfg.num_hidden_layers} layers, embedding {ecfg.embedding_size}, generator width {width} "
          f"({heads} heads, FFN {ffn}); vocab {args.vocab}, seq {T}, batch {B}")
    print(f"parameters: ELECTRA {electra.num_parameters() / 1e6:.2f}M (generator's own {n_gen / 1e6:.2f}M), "
          f"BERT {bert.num_parameters() / 1e6:.2f}M")
    batches = [{k: v.to(dev) for k, v in b.items()} for b in make_batches(4, B, T, args.vocab)]
    autocast = (torch.autocast(device_type=torch.device(dev).type, dtype=torch.bfloat16)
                if args.precision == "bf16" else contextlib.nullcontext())

    def step_electra(b):
        with autocast:
            loss = electra(b["electra"], b["mask"], labels=b["labels"], sample_noise=b["noise"]).loss
        loss.backward()
        return loss

    corrupted = []  # the discriminator-only step reads what the full step's generator produced
    with torch.no_grad():
        for b in batches:
            out = electra(b["electra"], b["mask"], labels=b["labels"], sample_noise=b["noise"])
            corrupted.append((out.discriminator_input, out.replaced.float()))

    def step_disc(i):
        ids, target = corrupted[i]
        with autocast:
            logits = electra(ids, batches[i]["mask"]).logits.float()  # (B, T): no labels = discriminator only
            loss = 50.0 * F.binary_cross_entropy_with_logits(logits, target)
        loss.backward()
        return loss

    def step_bert(b):
        with autocast:
            loss = bert(b["bert"], b["mask"], labels=b["labels"]).loss
        loss.backward()
        return loss

    steps = {
        "electra": (lambda i: step_electra(batches[i]), "electra"),
        "disc-only": (step_disc, "electra"),
        "bert": (lambda i: step_bert(batches[i]), "bert"),
    }
    times: dict[str, list[float]] = {k: [] for k in steps}
    order = list(steps)
    for r in range(args.warmup + args.steps):
        for name in order[r % 3:] + order[: r % 3]:  # rotate who goes first
            fn, opt = steps[name]
            opts[opt].zero_grad(set_to_none=True)
            if dev.startswith("cuda"):
                torch.cuda.synchronize()
            t = time.perf_counter()
            fn(r % len(batches))
            opts[opt].step()
            if dev.startswith("cuda"):
                torch.cuda.synchronize()
            if r >= args.warmup:
                times[name].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    for name, v in med.items():
        print(f"  {name:<10} {v * 1000:8.1f} ms/step  {B * T / v:9,.0f} tokens/s  (median of {len(times[name])})")
    print(f"ELECTRA step / BERT step: {med['electra'] / med['bert']:.2f}x")
    print(f"generator's share of ELECTRA's step: {1 - med['disc-only'] / med['electra']:.1%} "
          f"(discriminator alone {med['disc-only'] * 1000:.1f} ms of {med['electra'] * 1000:.1f} ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
