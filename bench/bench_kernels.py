"""Each CPU fast path of ``lmforge.nn`` against the plain PyTorch call it replaces, at a model's shapes.

The measurements behind the rules and probes of ``nn/cpu_ops.py`` and ``nn/losses.py``: every route
is timed against its fallback, alternating call by call, on the same inputs, and the median and the
best of each are printed with the ratio fallback / route (above 1: the route wins).

    python bench/bench_kernels.py                       # BERT/GPT bench shapes: hidden 256, FFN 1024, 16 x 128
    python bench/bench_kernels.py --threads 1 --hidden 768 --ffn 3072 --vocab 30522
    python bench/bench_kernels.py --record kernels.json # also a JSON run record (with provenance)

Routes: oneDNN linear (training: forward + both gradients; inference: GELU fused), ``matmul_t`` (the
LM-head chunk), fast dropout, attention with dropout (spelled out vs SDPA's math path), and the
chunked linear cross-entropy (fp32 and bf16) against ``F.cross_entropy(x @ W.T)``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def alternate(fns: dict, reps: int, warmup: int = 2) -> dict[str, list[float]]:
    """Call each function in turn (the order flips every round); per-call wall times after ``warmup``."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    names = list(fns)
    for i in range(warmup + reps):
        for name in names if i % 2 == 0 else names[::-1]:
            t = time.perf_counter()
            fns[name]()
            if i >= warmup:
                times[name].append(time.perf_counter() - t)
    return times


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--ffn", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--record", default=None, metavar="FILE", help="write the figures as a JSON run record")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    from lmforge.nn import cpu_ops
    from lmforge.nn.losses import _LinearCrossEntropy
    from lmforge.provenance import describe_machine, provenance

    onednn = cpu_ops._ONEDNN_OP
    B, T, C, I, V, nh = args.batch, args.seq, args.hidden, args.ffn, args.vocab, args.heads
    N = B * T
    g = torch.Generator().manual_seed(0)
    print(f"{describe_machine()}; load average {os.getloadavg()[0]:.2f} at the start")
    print(f"settings: batch {B}, seq {T}, hidden {C}, heads {nh}, FFN {I}, vocab {V}, {args.reps} alternating reps, "
          f"threads {torch.get_num_threads()}, oneDNN kernel {'present' if onednn is not None else 'absent'}")
    rows: list[dict] = []

    def report(what: str, fns: dict) -> None:
        t = alternate(fns, args.reps)
        (route, tr), (fallback, tf) = list(t.items())
        row = {"what": what, "route": route, "fallback": fallback,
               "route_ms": statistics.median(tr) * 1e3, "fallback_ms": statistics.median(tf) * 1e3,
               "route_best_ms": min(tr) * 1e3, "fallback_best_ms": min(tf) * 1e3}
        row["ratio"] = row["fallback_ms"] / row["route_ms"]
        row["ratio_best"] = row["fallback_best_ms"] / row["route_best_ms"]
        rows.append(row)
        print(f"{what:<46} {route:>10} {row['route_ms']:8.2f} ms  {fallback:>10} {row['fallback_ms']:8.2f} ms  "
              f"fallback/route {row['ratio']:.2f} (best {row['ratio_best']:.2f})", flush=True)

    def rand(*shape, dtype=torch.float32, grad=False):
        return torch.randn(*shape, generator=g).to(dtype).requires_grad_(grad)

    # 1. linear, training: forward and both gradients
    if onednn is not None:
        for cin, cout in ((C, 3 * C), (C, C), (C, I), (I, C)):
            x, w, b = rand(N, cin, grad=True), rand(cout, cin, grad=True) * 0.05, rand(cout, grad=True)
            w = w.detach().requires_grad_()
            gy = rand(N, cout)

            def fast(x=x, w=w, b=b, gy=gy):
                cpu_ops._OneDNNLinear.apply(x, w, b).backward(gy)

            def plain(x=x, w=w, b=b, gy=gy):
                F.linear(x, w, b).backward(gy)

            report(f"linear train {N}x{cin}->{cout}", {"onednn": fast, "F.linear": plain})
        # 2. linear, inference with GELU fused
        x, w, b = rand(N, C), rand(I, C) * 0.05, rand(I)
        with torch.no_grad():
            report(f"linear+gelu infer {N}x{C}->{I}", {
                "onednn": lambda: onednn(x, w, b, "gelu", [], "none"),
                "F.linear": lambda: F.gelu(F.linear(x, w, b))})
            x2, w2 = rand(N, C), rand(C, C) * 0.05
            report(f"linear infer {N}x{C}->{C}", {
                "onednn": lambda: onednn(x2, w2, None, "none", [], ""),
                "F.linear": lambda: F.linear(x2, w2)})
        # 3. matmul_t, the LM-head chunk
        rows_chunk = max(8, (1 << 21) // V)
        for dt in (torch.float32, torch.bfloat16):
            a, wv = rand(rows_chunk, C, dtype=dt), rand(V, C, dtype=dt)
            report(f"matmul_t {str(dt)[6:]} {rows_chunk}x{C} @ {V}x{C}.T", {
                "onednn": lambda a=a, wv=wv: onednn(a, wv, None, "none", [], ""),
                "a @ b.t()": lambda a=a, wv=wv: a @ wv.t()})

    # 4. dropout
    xd = rand(B, T, I, grad=True)
    gd = rand(B, T, I)
    report(f"dropout 0.1 fwd+bwd {B}x{T}x{I}", {
        "fast": lambda: cpu_ops.dropout(xd, 0.1, True).backward(gd),
        "F.dropout": lambda: F.dropout(xd, 0.1, True).backward(gd)})

    # 5. attention with dropout (training)
    hs = C // nh
    q, k, v = (rand(B, nh, T, hs, grad=True) for _ in range(3))
    ga = rand(B, nh, T, hs)

    def spelled(causal: bool):
        att = (q * (1.0 / hs**0.5)) @ k.transpose(-2, -1)
        if causal:
            att = att.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        return cpu_ops.dropout(att.softmax(-1), 0.1, True) @ v

    for causal in (False, True):
        report(f"attention dropout 0.1 {'causal ' if causal else ''}fwd+bwd {B}x{nh}x{T}x{hs}", {
            "spelled": lambda c=causal: spelled(c).backward(ga),
            "SDPA": lambda c=causal: F.scaled_dot_product_attention(q, k, v, dropout_p=0.1, is_causal=c).backward(ga)})
    report(f"attention no dropout causal fwd+bwd {B}x{nh}x{T}x{hs}", {
        "spelled": lambda: (lambda a: (a.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
                                       .softmax(-1) @ v))((q / hs**0.5) @ k.transpose(-2, -1)).backward(ga),
        "SDPA": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(ga)})

    # 6. chunked linear cross-entropy
    targets = torch.randint(0, V, (N,), generator=g)
    chunk, block = max(8, (1 << 21) // V), max(1, (1 << 26) // V)
    for dt in (torch.float32, torch.bfloat16):
        xh, wh = rand(N, C, grad=True), (rand(V, C) * 0.05).requires_grad_()

        def chunked(xh=xh, wh=wh, dt=dt):
            _LinearCrossEntropy.apply(xh.to(dt), wh, targets, block, chunk, True).backward()

        def plain(xh=xh, wh=wh, dt=dt):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dt == torch.bfloat16):
                logits = xh @ wh.t()
            F.cross_entropy(logits.float(), targets).backward()

        report(f"LM loss {str(dt)[6:]} fwd+bwd {N}x{C} @ {V}", {"chunked": chunked, "plain": plain})

    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    if args.record:
        import json

        from lmforge.storage.files import atomic_write_text

        record = {"bench": "kernels", **provenance(), "settings": vars(args), "rows": rows,
                  "load_average": os.getloadavg()[0]}
        atomic_write_text(args.record, json.dumps(record, indent=1) + "\n")
        print(f"wrote {args.record}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
