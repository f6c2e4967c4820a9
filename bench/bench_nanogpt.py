"""lmforge's GPT against nanoGPT's on one device: pretraining tokens/s and MFU, same shape, batch and length.

    python bench/bench_nanogpt.py --nanogpt ~/src/nanoGPT --device cuda --record docs/gpu/nanogpt_h100.json
    python bench/bench_nanogpt.py --nanogpt ~/src/nanoGPT --device cpu --layers 2 --width 128 --batch 2 --seq 64

nanoGPT is not a dependency: ``--nanogpt`` names a checkout of karpathy/nanoGPT, whose ``model.py``
(``GPT``, ``GPTConfig``, ``configure_optimizers``) is imported from there.  Its ``train.py`` step is
reproduced: bf16 autocast, the model through ``torch.compile``, its own fused AdamW
(``configure_optimizers``), gradient clipping at 1.0.  lmforge's step is the Trainer's: the same autocast,
``torch.compile`` of the forward (``--compile``), fused AdamW, clipping at 1.0.  Both start from GPT-2's
init at the same shape (default GPT-2 small: 12 layers, 12 heads, width 768, vocabulary 50304 as nanoGPT
pads it, 1024 positions, batch 12) and see the same random batches; steps alternate, the first
``--warmup`` (compilation) are not timed, and the figure is the median.

MFU = 6 * parameters (+ attention: 12 * layers * width * seq) per token, times tokens/s, over the bf16 peak
(``--peak-tflops``, default the H100 SXM's dense 989; nanoGPT's own estimate uses the A100's 312).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nanogpt", required=True, type=Path, help="a checkout of karpathy/nanoGPT (its model.py)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=12)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--no-compile", action="store_true", help="eager for both")
    ap.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    ap.add_argument("--record", default=None, metavar="FILE", help="write the figures as a JSON run record")
    args = ap.parse_args(argv)
    model_py = args.nanogpt / "model.py"
    if not model_py.is_file():
        print(f"bench_nanogpt: no model.py in {args.nanogpt}; give a checkout of karpathy/nanoGPT", file=sys.stderr)
        return 2
    sys.path.insert(0, str(args.nanogpt))
    import model as nanogpt  # noqa: E402 - nanoGPT's model.py, from the checkout given

    from lmforge.families.gpt.model import GPTConfig, GPTLMHeadModel
    from lmforge.provenance import describe_machine, provenance
    from lmforge.train.compute import make_optimizer
    from lmforge.train.parameters import param_groups

    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True  # as nanoGPT's train.py
        torch.backends.cudnn.allow_tf32 = True
    compile_ = not args.no_compile
    print(f"{describe_machine()}; {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}; "
          f"settings: { {k: str(v) for k, v in vars(args).items()} }", flush=True)
    torch.manual_seed(0)
    theirs = nanogpt.GPT(nanogpt.GPTConfig(block_size=args.seq, vocab_size=args.vocab, n_layer=args.layers,
                                           n_head=args.heads, n_embd=args.width, dropout=0.0, bias=True)).to(device)
    ours = GPTLMHeadModel(GPTConfig(vocab_size=args.vocab, n_positions=args.seq, n_embd=args.width,
                                    n_layer=args.layers, n_head=args.heads, resid_pdrop=0.0, embd_pdrop=0.0,
                                    attn_pdrop=0.0)).to(device)
    opt_theirs = theirs.configure_optimizers(0.1, 6e-4, (0.9, 0.95), device.type)
    groups, _ = param_groups(ours, 0.1)
    opt_ours = make_optimizer(groups, 6e-4, (0.9, 0.95), 1e-8, device)
    fwd_theirs = torch.compile(theirs) if compile_ else theirs
    fwd_ours = torch.compile(ours) if compile_ else ours
    ctx = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if args.precision == "bf16" else None
    g = torch.Generator().manual_seed(1)
    windows = [torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=g) for _ in range(4)]
    batches = [(w[:, :-1].contiguous(), w[:, 1:].contiguous()) for w in windows]  # nanoGPT's get_batch: x, y

    def step_theirs(i: int) -> None:
        x, y = (t.to(device, non_blocking=True) for t in batches[i % 4])
        with ctx() if ctx else torch.autocast(device.type, enabled=False):
            _, loss = fwd_theirs(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(theirs.parameters(), 1.0)
        opt_theirs.step()
        opt_theirs.zero_grad(set_to_none=True)

    def step_ours(i: int) -> None:
        x = batches[i % 4][0].to(device, non_blocking=True)
        with ctx() if ctx else torch.autocast(device.type, enabled=False):
            loss = fwd_ours(x, labels=x).loss  # lmforge shifts the labels itself (the last position has none)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(ours.parameters(), 1.0)
        opt_ours.step()
        opt_ours.zero_grad(set_to_none=True)

    steps = {"nanogpt": step_theirs, "lmforge": step_ours}
    times: dict[str, list[float]] = {k: [] for k in steps}
    first: dict[str, float] = {}
    for i in range(args.warmup + args.steps):
        for name in steps if i % 2 == 0 else list(steps)[::-1]:
            sync(device)
            t = time.perf_counter()
            steps[name](i)
            sync(device)
            dt = time.perf_counter() - t
            if i == 0:
                first[name] = dt
            if i >= args.warmup:
                times[name].append(dt)
    n_params = sum(p.numel() for p in ours.parameters()) - ours.wpe.weight.numel()
    flops_per_token = 6 * n_params + 12 * args.layers * args.width * args.seq
    tokens = args.batch * args.seq
    rows = {}
    for name, ts in times.items():
        med = statistics.median(ts)
        rows[name] = {"tokens_per_s": tokens / med, "step_ms": med * 1e3, "first_step_s": first[name],
                      "mfu": tokens / med * flops_per_token / (args.peak_tflops * 1e12)}
        print(f"{name:<8} {rows[name]['tokens_per_s']:12,.0f} tokens/s  {med * 1e3:8.1f} ms/step  MFU "
              f"{rows[name]['mfu']:.3f}  (first step {first[name]:.1f} s)", flush=True)
    ratio = rows["lmforge"]["tokens_per_s"] / rows["nanogpt"]["tokens_per_s"]
    print(f"lmforge / nanoGPT: {ratio:.3f} (target >= 1.0)")
    if args.record:
        from lmforge.storage.files import atomic_write_text

        record = {"bench": "nanogpt", **provenance(), "settings": {k: str(v) for k, v in vars(args).items()},
                  "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                  "parameters": n_params, "flops_per_token": flops_per_token, "rows": rows, "ratio": ratio}
        Path(args.record).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(args.record, json.dumps(record, indent=1) + "\n")
        print(f"wrote {args.record}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
