"""lmforge GPT vs transformers' GPT2LMHeadModel (sdpa): training, inference and generation speed.

One process, the same starting weights (HF's random init, imported into lmforge) and the same batches;
the two models' losses are checked equal before anything is timed, and their steps alternate so that a
noisy machine slows both alike.  Reported:

- training and inference tokens/s and their ratios (lmforge / HF), with MFU against a measured fp32
  matmul peak;
- generation tokens/s with the KV cache (greedy, 256 new tokens) against ``transformers`` ``generate``,
  after checking both produce the same tokens; and lmforge with vs without its cache;
- lmforge training under bf16 autocast against lmforge fp32.

Times are medians over steps of wall-clock time and, on CPU, also of the process CPU time (steadier
when other jobs share the cores).  The matmul peak always includes oneDNN's kernel, so MFUs compare
across ``--onednn`` settings.
Run: ``python bench/bench_gpt.py [--steps 10] [--threads N] [--onednn both] [--malloc keep] [--record FILE]``
(``--onednn both`` runs everything once with lmforge's oneDNN linear on and once with it off; ``--malloc keep``
runs both models with freed memory kept for reuse, as the ``lmforge`` command does; ``--record``
writes the figures with their provenance and every setting as JSON).  Both models train with the
Trainer's AdamW (fused where torch has the kernel).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

import malloc_setting  # noqa: E402
import onednn_setting  # noqa: E402
import thread_setting  # noqa: E402


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn, device: str) -> tuple[float, float]:
    """Run ``fn`` once; return (wall seconds, process CPU seconds)."""
    sync(device)
    w, c = time.perf_counter(), time.process_time()
    fn()
    sync(device)
    return time.perf_counter() - w, time.process_time() - c


def alternate(fa, fb, n: int, warmup: int, device: str) -> dict[str, list[float]]:
    """Run fa, fb, fa, fb, ...; return per-call wall and CPU times (after ``warmup`` rounds)."""
    out = {"a_wall": [], "a_cpu": [], "b_wall": [], "b_cpu": []}
    for i in range(warmup + n):
        for key, f in (("a", fa), ("b", fb)):
            w, c = timed(f, device)
            if i >= warmup:
                out[f"{key}_wall"].append(w)
                out[f"{key}_cpu"].append(c)
    return out


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def matmul_peak(device: str, n: int = 2048, reps: int = 6) -> dict[str, float]:
    """Best measured fp32 FLOP/s of an n x n x n matmul: ``torch.mm`` and (CPU) oneDNN's linear."""
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    kernels = {"torch.mm": lambda: a @ b}
    onednn = getattr(getattr(torch.ops, "mkldnn", None), "_linear_pointwise", None)
    if device == "cpu" and onednn is not None:
        kernels["onednn"] = lambda: onednn(a, b, None, "none", [], "")
    out = {}
    for name, f in kernels.items():
        f()
        best = 0.0
        for _ in range(reps):
            w, _ = timed(f, device)
            best = max(best, 2 * n**3 / w)
        out[name] = best
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-embd", type=int, default=256)
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--dropout", type=float, default=0.0, help="same dropout in both (0 makes losses comparable)")
    ap.add_argument("--steps", type=int, default=8, help="timed steps per measurement")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--gen-tokens", type=int, default=256)
    ap.add_argument("--gen-runs", type=int, default=2)
    ap.add_argument("--prompt-len", type=int, default=16)
    thread_setting.add_flag(ap)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--skip", default="", help="comma list of sections to skip: train,infer,gen,bf16")
    ap.add_argument("--record", default=None, metavar="FILE", help="write the figures as a JSON run record")
    onednn_setting.add_flag(ap)
    malloc_setting.add_flag(ap)
    args = ap.parse_args()
    rc = onednn_setting.apply(args.onednn, __file__, sys.argv[1:], json_flag="--record")
    if rc is not None:
        return rc
    malloc = malloc_setting.apply(args.malloc)
    # imported once --onednn has set LMFORGE_ONEDNN, which lmforge reads at import
    from lmforge.families.gpt.hf import import_hf
    from lmforge.nn.cpu_features import onednn_bf16
    from lmforge.nn.cpu_ops import chosen_routes, describe_routes
    from lmforge.provenance import describe_machine, provenance
    from lmforge.train.compute import make_optimizer

    skip = set(filter(None, args.skip.split(",")))

    import transformers

    transformers.logging.set_verbosity_error()
    args.threads, threads_line = thread_setting.apply(args.threads)
    print(f"threads: {threads_line}")
    dev = args.device
    torch.manual_seed(0)
    n_pos = max(512, args.seq, args.prompt_len + args.gen_tokens)
    hf_cfg = transformers.GPT2Config(
        vocab_size=args.vocab,
        n_positions=n_pos,
        n_embd=args.n_embd,
        n_layer=args.n_layer,
        n_head=args.n_head,
        resid_pdrop=args.dropout,
        embd_pdrop=args.dropout,
        attn_pdrop=args.dropout,
        bos_token_id=0,
        eos_token_id=0,
        attn_implementation="sdpa",
    )
    hf = transformers.GPT2LMHeadModel(hf_cfg)
    with tempfile.TemporaryDirectory() as d:
        hf.save_pretrained(d)
        ours = import_hf(d)
    hf.to(dev)
    ours.to(dev)
    B, T, V = args.batch, args.seq, args.vocab
    g = torch.Generator().manual_seed(1)
    batches = [torch.randint(1, V, (B, T), generator=g).to(dev) for _ in range(4)]
    res: dict = {
        "bench": "gpt",
        **provenance(),
        "settings": vars(args) | {"n_positions": n_pos},
        "transformers": transformers.__version__,
        "device": dev if not dev.startswith("cuda") else torch.cuda.get_device_name(),
        "routes_setting": describe_routes(),
        "malloc": malloc,
        "load_average": {"start": os.getloadavg()[0]},
    }
    print(f"{describe_machine()}, {dev}; transformers {transformers.__version__}; load average "
          f"{res['load_average']['start']:.2f} at the start\nsettings: {res['settings']}\n"
          f"lmforge routes: {res['routes_setting']}\nallocator: {malloc}")

    # -- same weights, same losses -------------------------------------------------------------------
    hf.train()
    ours.train()
    def adamw(model):  # the Trainer's optimizer, for both
        return make_optimizer([{"params": list(model.parameters())}], 1e-3, (0.9, 0.999), 1e-8, torch.device(dev))

    opt_h, opt_o = adamw(hf), adamw(ours)
    res["optimizer"] = {"name": "AdamW", "fused": bool(opt_o.defaults.get("fused"))}
    print(f"optimizer: AdamW{' (fused)' if res['optimizer']['fused'] else ''}, the same for both")
    losses = []
    for x in batches[:2]:  # the second loss is after one optimizer step on each side
        lh, lo = hf(input_ids=x, labels=x).loss, ours(x, labels=x).loss
        losses.append((lh.item(), lo.item()))
        for opt, loss in ((opt_h, lh), (opt_o, lo)):
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    diff = max(abs(a - b) for a, b in losses)
    print(f"losses HF vs lmforge: {losses}  (max diff {diff:.2e})")
    if diff > 1e-4:
        print("losses differ: the comparison would not be fair", file=sys.stderr)
        return 1
    res["loss_check"] = {"losses": losses, "max_abs_diff": diff}

    n_matmul = sum(p.numel() for n, p in ours.named_parameters() if n.startswith("h.") and p.dim() == 2)
    n_matmul += V * args.n_embd  # the (tied) output layer
    fwd_flops_tok = 2 * n_matmul + 4 * args.n_layer * T * args.n_embd  # + QK^T and AV
    peaks = matmul_peak(dev)
    peak = max(peaks.values())  # MFU against the best fp32 matmul this machine showed
    res["matmul_peak_gflops"] = {k: v / 1e9 for k, v in peaks.items()}
    print("measured fp32 matmul peak (GFLOP/s): " + ", ".join(f"{k} {v / 1e9:.1f}" for k, v in peaks.items()))
    tokens = B * T

    step_of: dict[int, int] = {}  # per model: steps taken, so both see the same batch sequence

    def train_step(model, opt):
        i = step_of.get(id(model), 0)
        step_of[id(model)] = i + 1
        x = batches[i % len(batches)]
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    if "train" not in skip:
        t = alternate(lambda: train_step(hf, opt_h), lambda: train_step(ours, opt_o), args.steps, args.warmup, dev)
        r = {
            "hf_tok_s": tokens / med(t["a_wall"]),
            "lmforge_tok_s": tokens / med(t["b_wall"]),
            "ratio_wall": med(t["a_wall"]) / med(t["b_wall"]),
            "ratio_cpu": med(t["a_cpu"]) / med(t["b_cpu"]),
        }
        r["hf_mfu"] = r["hf_tok_s"] * 3 * fwd_flops_tok / peak
        r["lmforge_mfu"] = r["lmforge_tok_s"] * 3 * fwd_flops_tok / peak
        res["train"] = r
        print(
            f"train  : HF {r['hf_tok_s']:.0f} tok/s (MFU {r['hf_mfu']:.2f}), lmforge {r['lmforge_tok_s']:.0f} tok/s "
            f"(MFU {r['lmforge_mfu']:.2f}); ratio {r['ratio_wall']:.3f} wall, {r['ratio_cpu']:.3f} CPU time"
        )

    if "infer" not in skip:
        hf.eval()
        ours.eval()
        x = batches[0]

        def infer(model):
            with torch.inference_mode():  # for both, as bench_bert
                model(input_ids=x)

        t = alternate(lambda: infer(hf), lambda: infer(ours), args.steps, args.warmup, dev)
        r = {
            "hf_tok_s": tokens / med(t["a_wall"]),
            "lmforge_tok_s": tokens / med(t["b_wall"]),
            "ratio_wall": med(t["a_wall"]) / med(t["b_wall"]),
            "ratio_cpu": med(t["a_cpu"]) / med(t["b_cpu"]),
        }
        r["hf_mfu"] = r["hf_tok_s"] * fwd_flops_tok / peak
        r["lmforge_mfu"] = r["lmforge_tok_s"] * fwd_flops_tok / peak
        res["infer"] = r
        print(
            f"infer  : HF {r['hf_tok_s']:.0f} tok/s (MFU {r['hf_mfu']:.2f}), lmforge {r['lmforge_tok_s']:.0f} tok/s "
            f"(MFU {r['lmforge_mfu']:.2f}); ratio {r['ratio_wall']:.3f} wall, {r['ratio_cpu']:.3f} CPU time"
        )

    if "gen" not in skip:
        hf.eval()
        ours.eval()
        prompt = torch.randint(1, V, (1, args.prompt_len), generator=g).to(dev)
        n_new = args.gen_tokens
        got = {}

        def gen_hf():
            got["hf"] = hf.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                max_new_tokens=n_new,
                min_new_tokens=n_new,
                do_sample=False,
                pad_token_id=0,
            )

        def gen_ours():
            got["ours"] = ours.generate(prompt, n_new, eos_token_id=None)

        t = alternate(gen_hf, gen_ours, args.gen_runs, 1, dev)
        same = torch.equal(got["hf"], got["ours"])
        w_nc, c_nc = timed(lambda: ours.generate(prompt, n_new, eos_token_id=None, use_cache=False), dev)
        r = {
            "same_tokens": same,
            "hf_tok_s": n_new / med(t["a_wall"]),
            "lmforge_tok_s": n_new / med(t["b_wall"]),
            "ratio_wall": med(t["a_wall"]) / med(t["b_wall"]),
            "ratio_cpu": med(t["a_cpu"]) / med(t["b_cpu"]),
            "lmforge_nocache_tok_s": n_new / w_nc,
            "cache_speedup_wall": w_nc / med(t["b_wall"]),
            "cache_speedup_cpu": c_nc / med(t["b_cpu"]),
        }
        res["gen"] = r
        print(
            f"generate ({n_new} new, greedy, same tokens: {same}): HF {r['hf_tok_s']:.0f} tok/s, lmforge "
            f"{r['lmforge_tok_s']:.0f} tok/s; ratio {r['ratio_wall']:.2f} wall, {r['ratio_cpu']:.2f} CPU; "
            f"lmforge without cache {r['lmforge_nocache_tok_s']:.0f} tok/s -> cache speed-up "
            f"{r['cache_speedup_wall']:.1f}x"
        )

    if "bf16" not in skip:
        ours.train()
        twin = import_hf_copy(ours)
        opt_t = adamw(twin)

        def bf16_step():
            i = step_of.get(id(twin), 0)
            step_of[id(twin)] = i + 1
            x = batches[i % len(batches)]
            with torch.autocast(torch.device(dev).type, dtype=torch.bfloat16):
                loss = twin(x, labels=x).loss
            opt_t.zero_grad(set_to_none=True)
            loss.backward()
            opt_t.step()

        t = alternate(lambda: train_step(ours, opt_o), bf16_step, args.steps, args.warmup, dev)
        r = {
            "fp32_tok_s": tokens / med(t["a_wall"]),
            "bf16_tok_s": tokens / med(t["b_wall"]),
            "speedup_wall": med(t["a_wall"]) / med(t["b_wall"]),
            "speedup_cpu": med(t["a_cpu"]) / med(t["b_cpu"]),
        }
        # without oneDNN bf16 (an AVX2-only CPU, or LMFORGE_CPU_FEATURES=avx2) the LM head's bf16 matmuls run on
        # PyTorch's own kernels: the figure is then that route's, which is what a user's bf16 run gets there
        r["matmul_route"] = "onednn or torch, by measurement" if onednn_bf16() or dev != "cpu" else "torch"
        res["bf16"] = r
        print(
            f"bf16   : lmforge fp32 {r['fp32_tok_s']:.0f} tok/s, bf16 autocast {r['bf16_tok_s']:.0f} tok/s; "
            f"speed-up {r['speedup_wall']:.2f}x wall, {r['speedup_cpu']:.2f}x CPU time"
            + ("" if r["matmul_route"] != "torch" else "; this CPU has no oneDNN bf16: PyTorch's own bf16 kernels")
        )

    thread_setting.check(args.threads)  # both models ran on the same count throughout
    res["routes"] = chosen_routes()
    res["threads"] = threads_line
    res["load_average"]["end"] = os.getloadavg()[0]
    print(f"lmforge routes taken: {res['routes'] or 'none measured (plain PyTorch calls)'}; load average "
          f"{res['load_average']['end']:.2f} at the end")
    if args.record:
        from lmforge.storage.files import atomic_write_text

        atomic_write_text(args.record, json.dumps(res, indent=2) + "\n")
        print(f"wrote {args.record}")
    return 0


def import_hf_copy(model):
    """A second lmforge GPT with the same weights (for the bf16 comparison)."""
    import copy

    twin = copy.deepcopy(model)
    twin.lm_head.weight = twin.wte.weight
    return twin


if __name__ == "__main__":
    sys.exit(main())
