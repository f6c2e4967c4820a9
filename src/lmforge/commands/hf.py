"""``lmforge export-hf`` and ``lmforge import-hf``."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("export-hf", help="write a BERT/GPT model folder as an HF transformers folder")
    p.add_argument("model_dir", help="lmforge model folder (BERT or GPT)")
    p.add_argument("out_dir", help="folder to write (config.json, model.safetensors, tokenizer)")
    p.set_defaults(func=run_export)
    q = sub.add_parser("import-hf", help="read an HF BERT/GPT-2 folder into an lmforge model folder")
    q.add_argument("hf_dir", help="HF folder with config.json and model.safetensors")
    q.add_argument("model_dir", help="lmforge model folder to write")
    q.set_defaults(func=run_import)


def run_export(args) -> int:
    from ..interop import export_hf

    out = export_hf(args.model_dir, args.out_dir)
    print(f"wrote HF folder {out}")
    return 0


def run_import(args) -> int:
    from ..interop import import_hf

    model = import_hf(args.hf_dir, args.model_dir)
    print(f"imported {model.model_type} ({model.num_parameters() / 1e6:.1f}M parameters) into {args.model_dir}")
    return 0
