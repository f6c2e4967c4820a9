"""``torch.compile`` against eager for a training step of lmforge's BERT or GPT: start-up and steady speed.

    python bench/bench_compile.py bert            # the bench_bert shape: hidden 256, 4 layers, seq 128, batch 16
    python bench/bench_compile.py gpt --steps 10 --record compile_gpt.json

Two copies of the model from the same weights: one eager, one through ``torch.compile`` (inductor), each
trained with the Trainer's optimizer on the same batches.  Reported: the seconds until the compiled
copy's first step is done (the compilation; inductor keeps a cache in /tmp/torchinductor_$USER, so a
second run of the same shapes compiles faster: ``--fresh`` compiles with an empty one), then the median
of alternating steps of the two, and the number of steps after which compiling has paid for itself.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def build(family: str, dropout: float):
    if family == "bert":
        from bench_bert import make_batches

        from lmforge.families.bert.model import BertConfig, BertForPreTraining

        cfg = BertConfig(vocab_size=8192, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                         intermediate_size=1024, max_position_embeddings=512,
                         hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
        return (lambda: BertForPreTraining(cfg)), make_batches(4, 16, 128, 8192)
    from lmforge.families.gpt.model import GPTConfig, GPTLMHeadModel

    cfg = GPTConfig(vocab_size=8192, n_positions=512, n_embd=256, n_layer=4, n_head=4, resid_pdrop=dropout,
                    embd_pdrop=dropout, attn_pdrop=dropout)
    g = torch.Generator().manual_seed(1)
    ids = [torch.randint(1, 8192, (16, 128), generator=g) for _ in range(4)]
    return (lambda: GPTLMHeadModel(cfg)), [{"input_ids": x, "labels": x} for x in ids]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("family", choices=("bert", "gpt"))
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--steps", type=int, default=8, help="timed alternating steps after the first")
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--fresh", action="store_true", help="compile with an empty inductor cache (a first run's cost)")
    ap.add_argument("--record", default=None, metavar="FILE", help="write the figures as a JSON run record")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.fresh:  # read when inductor is first used, below
        import tempfile

        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-")
    from lmforge.nn import cpu_ops
    from lmforge.provenance import describe_machine, provenance
    from lmforge.train.compute import make_optimizer

    print(f"{describe_machine()}; load average {os.getloadavg()[0]:.2f}; settings: {vars(args)}")
    print(cpu_ops.describe_routes())
    device = torch.device(args.device)
    make, batches = build(args.family, args.dropout)
    batches = [{k: v.to(device) for k, v in b.items()} for b in batches]
    torch.manual_seed(0)
    eager = make().to(device)
    compiled_model = make().to(device)
    compiled_model.load_state_dict(eager.state_dict())
    runs = {}
    for name, model in (("eager", eager), ("compiled", compiled_model)):
        model.train()
        opt = make_optimizer([{"params": list(model.parameters())}], 1e-4, (0.9, 0.999), 1e-8, device)
        fwd = torch.compile(model) if name == "compiled" else model
        runs[name] = (fwd, opt)
    times: dict[str, list[float]] = {k: [] for k in runs}

    def step(name: str, i: int) -> float:
        fwd, opt = runs[name]
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t = time.perf_counter()
        fwd(**batches[i % len(batches)]).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - t

    first = {name: step(name, 0) for name in runs}
    print(f"first step: eager {first['eager']:.2f} s, compiled {first['compiled']:.2f} s (the compilation)")
    for i in range(1, args.steps + 2):
        for name in runs if i % 2 else list(runs)[::-1]:
            dt = step(name, i)
            if i > 1:  # the second compiled step may still recompile for a dynamic shape
                times[name].append(dt)
    med = {k: statistics.median(v) for k, v in times.items()}
    gain = med["eager"] - med["compiled"]
    cost = first["compiled"] - first["eager"]
    breakeven = cost / gain if gain > 0 else float("inf")
    pays = f"pays for itself after {breakeven:.0f} steps" if breakeven != float("inf") else "never pays for itself"
    print(f"median step: eager {med['eager'] * 1e3:.1f} ms, compiled {med['compiled'] * 1e3:.1f} ms "
          f"(compiled speed {med['eager'] / med['compiled']:.2f}x); compiling {pays}")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    if args.record:
        import json

        from lmforge.storage.files import atomic_write_text

        record = {"bench": "compile", **provenance(), "settings": vars(args), "first_step_s": first,
                  "median_step_s": med, "compiled_speedup": med["eager"] / med["compiled"],
                  "breakeven_steps": breakeven if breakeven != float("inf") else None,
                  "load_average": os.getloadavg()[0]}
        atomic_write_text(args.record, json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
