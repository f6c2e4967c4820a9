"""Where a training step's time goes: torch.profiler over a few steps of lmforge's model and HF's twin.

    python bench/profile_step.py bert                 # the bench_bert shape, lmforge then transformers
    python bench/profile_step.py gpt --threads 1 --rows 25
    python bench/profile_step.py bert --infer         # forward passes under inference_mode instead
    python bench/profile_step.py elmo --encoder char  # ELMo (word or char-CNN) against the plain nn.LSTM biLM

Prints the settings, then per model the operators by self CPU time (the profiler's table) and the
step time without the profiler.  Same shapes and batches as ``bench_bert.py`` / ``bench_gpt.py`` /
``bench_elmo.py``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def build(args):
    """``{name: (model, step_fn)}`` for the family asked for."""
    import transformers

    transformers.logging.set_verbosity_error()
    models = {}
    if args.family == "bert":
        from bench_bert import make_batches

        from lmforge.families.bert.hf import hf_config_dict, to_hf_state_dict
        from lmforge.families.bert.model import BertConfig, BertForPreTraining

        cfg = BertConfig(vocab_size=8192, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                         intermediate_size=1024, max_position_embeddings=512)
        torch.manual_seed(0)
        ours = BertForPreTraining(cfg)
        hf_cfg = transformers.BertConfig(**{k: v for k, v in hf_config_dict(cfg).items() if k != "architectures"})
        hf = transformers.BertForPreTraining._from_config(hf_cfg, attn_implementation="sdpa")
        hf.load_state_dict(to_hf_state_dict(ours), strict=False)
        hf.tie_weights()
        batch = make_batches(1, 16, 128, 8192)[0]
        infer_batch = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
        models = {"lmforge": (ours, batch, infer_batch), "transformers": (hf, batch, infer_batch)}
    elif args.family == "gpt":
        import tempfile

        from lmforge.families.gpt.hf import import_hf

        hf_cfg = transformers.GPT2Config(vocab_size=8192, n_positions=512, n_embd=256, n_layer=4, n_head=4,
                                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                         attn_implementation="sdpa")
        hf = transformers.GPT2LMHeadModel(hf_cfg)
        with tempfile.TemporaryDirectory() as d:
            hf.save_pretrained(d)
            ours = import_hf(d)
        x = torch.randint(1, 8192, (16, 128), generator=torch.Generator().manual_seed(1))
        models = {"lmforge": (ours, {"input_ids": x, "labels": x}, {"input_ids": x}),
                  "transformers": (hf, {"input_ids": x, "labels": x}, {"input_ids": x})}
    else:
        from bench_elmo import PlainBiLM
        from bench_elmo import make_batches as elmo_batches

        from lmforge.families.elmo.model import ElmoBiLM, ElmoConfig

        ids = elmo_batches(1, 32, 64, 8192)[0]
        ours = ElmoBiLM(ElmoConfig(vocab_size=8192, token_encoder=args.encoder, projection_dim=256, cell_size=256,
                                   dropout=0.0))
        if args.encoder == "char":
            from lmforge.data import builtin_corpus_path
            from lmforge.tokenization import Tokenizer

            ours.set_tokenizer(Tokenizer.train([builtin_corpus_path()], kind="wordpiece", vocab_size=8192))
        models = {"lmforge": (ours, {"input_ids": ids, "labels": ids}, {"input_ids": ids}),
                  "plain nn.LSTM": (PlainBiLM(8192, 256, 2), {"ids": ids}, {"ids": ids})}
    return models


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("family", choices=("bert", "gpt", "elmo"))
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--rows", type=int, default=20, help="operators shown per model")
    ap.add_argument("--infer", action="store_true", help="profile forward passes under inference_mode")
    ap.add_argument("--encoder", choices=("word", "char"), default="word", help="ELMo's token encoder")
    ap.add_argument("--only", default=None, help="profile only this model (lmforge, transformers, ...)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from lmforge.nn import cpu_ops
    from lmforge.provenance import describe_machine

    print(f"{describe_machine()}; load average {os.getloadavg()[0]:.2f}; settings: {vars(args)}; "
          f"{cpu_ops.describe_routes()}")
    for name, (model, batch, infer_batch) in build(args).items():
        if args.only and name != args.only:
            continue
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step(model=model, batch=batch, infer_batch=infer_batch, opt=opt):
            if args.infer:
                with torch.inference_mode():
                    model(**infer_batch)
                return
            out = model(**batch)
            loss = out if isinstance(out, torch.Tensor) else out.loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        model.eval() if args.infer else model.train()
        for _ in range(2):
            step()
        t = time.perf_counter()
        for _ in range(args.steps):
            step()
        plain = (time.perf_counter() - t) / args.steps
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(args.steps):
                step()
        print(f"\n== {name}: {plain * 1e3:.1f} ms/step without the profiler ==")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
