"""lmforge BERT vs ``transformers.BertForPreTraining`` (sdpa): training and inference speed, MFU, bf16.

Both models live in ONE process and take turns step by step (the order flips every step), start
from the same weights (copied through ``lmforge.families.bert.hf``) and see the same batches, so the
machine's drift (+-15-20 % between runs here) hits both alike.  Before timing, the script checks
that the two compute the same loss.

    python bench/bench_bert.py                 # default: hidden 256, 4 layers, seq 128, batch 16
    python bench/bench_bert.py --steps 10      # shorter
    python bench/bench_bert.py --bf16-steps 0  # training and inference only
    python bench/bench_bert.py --onednn both   # once with lmforge's oneDNN linear on, once off
    python bench/bench_bert.py --malloc keep   # both models keeping freed memory, as the lmforge command does
    python bench/bench_bert.py --threads 2 --record bert.json   # also a JSON run record (provenance, settings)
    python bench/bench_bert.py --device cuda --hidden 768 --layers 12 --heads 12 --intermediate 3072 \
        --vocab 30522 --batch 32               # BERT-base on a GPU (TF32 off: fp32 against fp32)

What is measured:
* training tokens/s: forward + backward + AdamW step, with dropout 0.1 as in pretraining; both models
  get the Trainer's AdamW (fused where torch has the kernel, as HF's Trainer defaults to with torch >= 2.8);
  the figure is the median of the alternating steps;
* inference tokens/s: forward under ``inference_mode`` producing the MLM scores of every
  position and the NSP scores (what HF's ``BertForPreTraining`` returns);
* MFU = model FLOPs/s / the fp32 matmul peak measured here (best of several large GEMMs).
  The model FLOPs count the matmuls each model actually runs (lmforge scores only the masked
  positions when labels are given, HF every position), times 3 for training;
* bf16: lmforge under ``torch.autocast("cpu", bfloat16)`` vs lmforge fp32, alternating, from the
  same weights, batches and dropout masks, with both loss curves printed.

Batches are synthetic: Zipf-distributed token ids (so the MLM loss has something to learn: the
unigram distribution), 15 % of the positions masked 80/10/10, segments A/B, random NSP labels.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import malloc_setting  # noqa: E402
import onednn_setting  # noqa: E402
import thread_setting  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def measure_peak_gflops(n: int = 1024, reps: int = 30, device: str = "cpu") -> float:
    """Best fp32 GEMM throughput of this machine at the current thread count, in GFLOP/s.

    Both of PyTorch's CPU GEMM back ends are tried (MKL via ``torch.mm``, oneDNN via the fused linear
    kernel): on AMD CPUs MKL runs well below oneDNN, and the machine's peak is what the best reaches.
    On a GPU: ``torch.mm`` on 8192 x 8192 matrices (TF32 off).
    """
    if device.startswith("cuda"):
        size = 8192
        a, b = torch.randn(size, size, device=device), torch.randn(size, size, device=device)
        best = 0.0
        for _ in range(reps // 3 + 1):
            best = max(best, 2 * size**3 / timed(lambda: torch.mm(a, b), device) / 1e9)
        return best
    # the machine's peak, whatever --onednn says for lmforge: MFUs stay comparable across the two settings
    onednn = getattr(getattr(torch.ops, "mkldnn", None), "_linear_pointwise", None)
    best = 0.0
    # many short repetitions: on a shared machine the best one is the one nobody preempted
    for size in (n // 2 + n // 4, n):
        a, b = torch.randn(size, size), torch.randn(size, size)
        kernels = [lambda a=a, b=b: torch.mm(a, b)]
        if onednn is not None:
            kernels.append(lambda a=a, b=b: onednn(a, b, None, "none", [], ""))
        for kernel in kernels:
            kernel()  # warm up
            for _ in range(reps):
                t = time.perf_counter()
                kernel()
                best = max(best, 2 * size**3 / (time.perf_counter() - t) / 1e9)
    return best


def make_batches(n: int, B: int, T: int, V: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    ranks = torch.arange(1, V - 5 + 1, dtype=torch.float)
    zipf = 1.0 / ranks  # ids 5.. follow a Zipf law
    batches = []
    for _ in range(n):
        ids = torch.multinomial(zipf, B * T, replacement=True, generator=g).view(B, T) + 5  # (B, T)
        ids[:, 0] = 2  # [CLS]
        ids[:, T // 2] = 3  # [SEP]
        ids[:, -1] = 3
        seg = torch.zeros(B, T, dtype=torch.long)
        seg[:, T // 2 + 1 :] = 1
        special = (ids == 2) | (ids == 3)
        pick = (torch.rand(B, T, generator=g) < 0.15) & ~special
        labels = torch.where(pick, ids, torch.full_like(ids, -100))
        u = torch.rand(B, T, generator=g)
        inputs = ids.clone()
        inputs[pick & (u < 0.8)] = 4  # [MASK]
        rand = pick & (u >= 0.8) & (u < 0.9)
        inputs[rand] = torch.randint(5, V, (int(rand.sum()),), generator=g)
        batches.append(
            {
                "input_ids": inputs,
                "attention_mask": torch.ones(B, T, dtype=torch.long),
                "token_type_ids": seg,
                "labels": labels,
                "next_sentence_label": torch.randint(0, 2, (B,), generator=g),
            }
        )
    return batches


def forward_flops(cfg, B: int, T: int, n_scored: int) -> float:
    """Matmul FLOPs of one forward pass; ``n_scored`` = positions that go through the MLM head."""
    C, I, L, V = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.vocab_size
    per_token = L * (2 * C * 3 * C + 2 * C * C + 2 * 2 * C * I + 2 * 2 * T * C)  # qkv, proj, FFN, QK^T and AV
    heads = n_scored * (2 * C * C + 2 * C * V) + B * (2 * C * C + 2 * C * 2)  # MLM transform+decoder, pooler+NSP
    return B * T * per_token + heads


def timed(fn, device: str = "cpu") -> float:
    sync(device)
    t = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t


def bf16_vs_fp32(args, cfg, batches, adamw, dev: str, tok_step: int) -> dict:
    """lmforge under bf16 autocast against lmforge fp32: alternating training steps from the same weights,
    batches and dropout masks; prints both loss curves and returns the figures."""
    from lmforge.families.bert.model import BertForPreTraining

    torch.manual_seed(0)
    fp32 = BertForPreTraining(cfg).to(dev)
    bf16 = BertForPreTraining(cfg).to(dev)
    bf16.load_state_dict(fp32.state_dict())
    fp32.train()
    bf16.train()
    runs = {
        "fp32": (fp32, adamw(fp32), contextlib.nullcontext),
        "bf16": (bf16, adamw(bf16), lambda: torch.autocast(torch.device(dev).type, dtype=torch.bfloat16)),
    }
    btimes: dict[str, list[float]] = {k: [] for k in runs}
    blosses: dict[str, list[float]] = {k: [] for k in runs}
    for step in range(args.warmup + args.bf16_steps):
        batch = batches[step % len(batches)]
        order = list(runs) if step % 2 == 0 else list(runs)[::-1]
        for name in order:
            model, opt, ctx = runs[name]

            def train_step(model=model, opt=opt, ctx=ctx, name=name, step=step, batch=batch):
                torch.manual_seed(1000 + step)  # the same dropout masks for both
                with ctx():
                    loss = model(**batch).loss
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                blosses[name].append(loss.item())

            dt = timed(train_step, dev)
            if step >= args.warmup:
                btimes[name].append(dt)
    btps = {k: tok_step / statistics.median(v) for k, v in btimes.items()}
    print(f"\nbf16 autocast vs fp32 (lmforge, {args.bf16_steps} alternating training steps):")
    for k in runs:
        print(f"  {k:<5} {btps[k]:9.0f} tokens/s")
    bf16_ratio = btps["bf16"] / btps["fp32"]
    print(f"  bf16 speed-up: {bf16_ratio:.2f}x  (target >= 1.5)")
    rel = [abs(a - b) / a for a, b in zip(blosses["fp32"], blosses["bf16"])]
    print("  loss curve (step: fp32 / bf16):  " + "  ".join(
        f"{i}: {a:.3f}/{b:.3f}" for i, (a, b) in enumerate(zip(blosses["fp32"], blosses["bf16"]))
        if i % max(1, len(rel) // 6) == 0 or i == len(rel) - 1))
    print(f"  max relative loss difference over {len(rel)} steps: {max(rel):.4f}; "
          f"loss fell {blosses['fp32'][0] - blosses['fp32'][-1]:.3f} (fp32) vs "
          f"{blosses['bf16'][0] - blosses['bf16'][-1]:.3f} (bf16)")
    return {"tokens_per_s": btps, "speedup": bf16_ratio, "max_rel_loss_diff": max(rel)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=20, help="timed training steps per model")
    ap.add_argument("--infer-steps", type=int, default=20, help="timed inference passes per model")
    ap.add_argument("--bf16-steps", type=int, default=20, help="timed bf16-vs-fp32 training steps")
    ap.add_argument("--warmup", type=int, default=3)
    thread_setting.add_flag(ap)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--intermediate", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--device", default="cpu", help="cpu or cuda (a GPU: fp32 matmuls without TF32)")
    ap.add_argument("--record", default=None, metavar="FILE", help="write the figures as a JSON run record")
    onednn_setting.add_flag(ap)
    malloc_setting.add_flag(ap)
    args = ap.parse_args(argv)
    rc = onednn_setting.apply(args.onednn, __file__, sys.argv[1:] if argv is None else argv, json_flag="--record")
    if rc is not None:
        return rc
    malloc = malloc_setting.apply(args.malloc)

    import transformers

    # imported once --onednn has set LMFORGE_ONEDNN, which lmforge reads at import
    from lmforge.families.bert.hf import hf_config_dict, to_hf_state_dict
    from lmforge.families.bert.model import BertConfig, BertForPreTraining
    from lmforge.nn.cpu_ops import chosen_routes, describe_routes
    from lmforge.provenance import describe_machine, provenance
    from lmforge.train.compute import make_optimizer

    args.threads, threads_line = thread_setting.apply(args.threads)
    transformers.logging.set_verbosity_error()
    dev = args.device
    if dev.startswith("cuda"):
        if not torch.cuda.is_available():
            print("--device cuda: no CUDA device here", file=sys.stderr)
            return 1
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    B, T = args.batch, args.seq
    where = torch.cuda.get_device_name() if dev.startswith("cuda") else describe_machine()
    load_start = os.getloadavg()[0]
    print(f"{where}; transformers {transformers.__version__}; load average {load_start:.2f} at the start")
    print(f"settings: {vars(args)}\nthreads: {threads_line}\nlmforge routes: {describe_routes()}\nallocator: {malloc}")
    peak = measure_peak_gflops(device=dev)
    print(f"measured fp32 matmul peak: {peak:.1f} GFLOP/s (re-measured at the end; the higher one is used)")

    cfg = BertConfig(vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
                     num_attention_heads=args.heads, intermediate_size=args.intermediate,
                     max_position_embeddings=512)
    torch.manual_seed(0)
    ours = BertForPreTraining(cfg)
    hf_cfg = transformers.BertConfig(**{k: v for k, v in hf_config_dict(cfg).items() if k != "architectures"})
    hf = transformers.BertForPreTraining._from_config(hf_cfg, attn_implementation="sdpa")
    missing, unexpected = hf.load_state_dict(to_hf_state_dict(ours), strict=False)
    assert not unexpected and set(missing) <= {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"}, (
        missing, unexpected)
    hf.tie_weights()
    ours.to(dev)
    hf.to(dev)
    assert hf.cls.predictions.decoder.weight.data_ptr() == hf.bert.embeddings.word_embeddings.weight.data_ptr()
    print(f"config: hidden {args.hidden}, {args.layers} layers, {args.heads} heads, intermediate {args.intermediate}, "
          f"vocab {args.vocab}, seq {T}, batch {B}; {ours.num_parameters() / 1e6:.2f}M parameters")

    batches = [{k: v.to(dev) for k, v in b.items()} for b in make_batches(4, B, T, args.vocab)]
    n_masked = statistics.mean(int((b["labels"] != -100).sum()) for b in batches)

    # 1. same loss from the same weights (eval mode: no dropout)
    ours.eval()
    hf.eval()
    with torch.no_grad():
        lo, lh = ours(**batches[0]).loss.item(), hf(**batches[0]).loss.item()
    print(f"loss check (eval, same weights, same batch): lmforge {lo:.6f}  transformers {lh:.6f}  "
          f"diff {abs(lo - lh):.2e}")
    if abs(lo - lh) > 1e-4:
        print("losses disagree; the comparison would be meaningless", file=sys.stderr)
        return 1

    # 2. inference, alternating (same weights, so the logits must agree)
    models = {"lmforge": ours, "transformers": hf}
    tok_step = B * T
    itimes: dict[str, list[float]] = {k: [] for k in models}
    infer_in = {k: v for k, v in batches[0].items() if k in ("input_ids", "attention_mask", "token_type_ids")}
    with torch.inference_mode():
        a = ours(**infer_in)
        h = hf(**infer_in)
        diff = (a.logits - h.prediction_logits).abs().max().item()
        for step in range(args.warmup + args.infer_steps):
            order = list(models) if step % 2 == 0 else list(models)[::-1]
            for name in order:
                model = models[name]
                dt = timed(lambda model=model: model(**infer_in), dev)
                if step >= args.warmup:
                    itimes[name].append(dt)
    infer_tps = {k: tok_step / statistics.median(v) for k, v in itimes.items()}
    f_inf = forward_flops(cfg, B, T, B * T)
    print(f"\ninference ({args.infer_steps} alternating passes, MLM scores of all {B * T} positions + NSP; "
          f"max logit diff {diff:.1e}):")
    for k in models:
        step_s = statistics.median(itimes[k])
        mfu = f_inf / step_s / 1e9 / peak
        print(f"  {k:<12} {infer_tps[k]:9.0f} tokens/s  {step_s * 1e3:7.1f} ms/pass  MFU {mfu:.2f}")
    infer_ratio = infer_tps["lmforge"] / infer_tps["transformers"]
    print(f"  inference speed ratio lmforge / transformers: {infer_ratio:.2f}  (target >= 1.5)")

    # 3. training, alternating
    ours.train()
    hf.train()
    def adamw(model):  # the Trainer's optimizer, for both
        return make_optimizer([{"params": list(model.parameters()), "weight_decay": 0.01}], args.lr, (0.9, 0.999),
                              1e-8, torch.device(dev))

    opt_o, opt_h = adamw(ours), adamw(hf)
    print(f"optimizer: AdamW{' (fused)' if opt_o.defaults.get('fused') else ''}, the same for both")
    trainers = {"lmforge": (ours, opt_o), "transformers": (hf, opt_h)}
    times: dict[str, list[float]] = {k: [] for k in trainers}
    losses: dict[str, list[float]] = {k: [] for k in trainers}
    for step in range(args.warmup + args.steps):
        batch = batches[step % len(batches)]
        order = list(trainers) if step % 2 == 0 else list(trainers)[::-1]
        for name in order:
            model, opt = trainers[name]

            def train_step(model=model, opt=opt, name=name, batch=batch):
                loss = model(**batch).loss
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                losses[name].append(loss.item())

            dt = timed(train_step, dev)
            if step >= args.warmup:
                times[name].append(dt)
    train_tps = {k: tok_step / statistics.median(v) for k, v in times.items()}
    flops_train = {
        "lmforge": 3 * forward_flops(cfg, B, T, n_masked),
        "transformers": 3 * forward_flops(cfg, B, T, B * T),
    }
    print(f"\ntraining ({args.steps} alternating steps after {args.warmup} warm-up, fwd+bwd+AdamW, dropout 0.1):")
    for k in trainers:
        step_s = statistics.median(times[k])
        mfu = flops_train[k] / step_s / 1e9 / peak
        print(f"  {k:<12} {train_tps[k]:9.0f} tokens/s  {step_s * 1e3:7.1f} ms/step  "
              f"{flops_train[k] / step_s / 1e9:6.1f} GFLOP/s  MFU {mfu:.2f}  last loss {losses[k][-1]:.4f}")
    # lmforge's useful work per step is smaller: also state its speed in HF-equivalent FLOPs
    hf_equiv = flops_train["transformers"] / statistics.median(times["lmforge"]) / 1e9
    print(f"  lmforge in HF-equivalent FLOPs: {hf_equiv:.1f} GFLOP/s (MFU-equivalent {hf_equiv / peak:.2f})")
    train_ratio = train_tps["lmforge"] / train_tps["transformers"]
    print(f"  training speed ratio lmforge / transformers: {train_ratio:.2f}  (target >= 2.0)")

    # 4. bf16 autocast vs fp32, both lmforge, alternating, same weights / batches / dropout masks
    bf16 = bf16_vs_fp32(args, cfg, batches, adamw, dev, tok_step) if args.bf16_steps > 0 else None
    bf16_ratio = bf16["speedup"] if bf16 else float("nan")

    thread_setting.check(args.threads)  # both models ran on the same count throughout
    peak_end = measure_peak_gflops(device=dev)
    if peak_end > peak * 1.05:
        print(f"note: the peak measured at the end was higher ({peak_end:.1f} GFLOP/s): the MFUs above are "
              f"{peak / peak_end:.2f}x too high; the machine's load changed during the run")

    def verdict(x: float, target: float) -> str:
        return f"{x:.2f} (target {target}: {'ok' if x >= target else 'MISSED'})" if x == x else "not run"

    print(f"\nsummary: train ratio {verdict(train_ratio, 2.0)}, inference ratio {verdict(infer_ratio, 1.5)}, "
          f"bf16 speed-up {verdict(bf16_ratio, 1.5)}")
    routes = chosen_routes()
    print(f"lmforge routes taken: {routes or 'none measured (plain PyTorch calls)'}")
    load_end = os.getloadavg()[0]
    print(f"load average {load_end:.2f} at the end")
    if args.record:
        import json

        from lmforge.storage.files import atomic_write_text

        record = {
            "bench": "bert", **provenance(), "settings": vars(args), "threads": threads_line, "malloc": malloc,
            "routes": routes,
            "optimizer": {"name": "AdamW", "fused": bool(opt_o.defaults.get("fused"))},
            "matmul_peak_gflops": max(peak, peak_end),
            "inference": {"tokens_per_s": infer_tps, "ratio": infer_ratio},
            "train": {"tokens_per_s": train_tps, "ratio": train_ratio,
                      "mfu": {k: flops_train[k] / statistics.median(times[k]) / 1e9 / max(peak, peak_end)
                              for k in trainers}},
            "bf16": bf16,
            "load_average": {"start": load_start, "end": load_end},
        }
        atomic_write_text(args.record, json.dumps(record, indent=1) + "\n")
        print(f"wrote {args.record}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
