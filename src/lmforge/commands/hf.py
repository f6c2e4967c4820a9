"""``lmforge export-hf`` and ``lmforge import-hf``."""

from __future__ import annotations

import dataclasses

from ..config import load_json
from ..interop import export_hf, import_hf
from ..interop.hub_cache import resolve_hf_dir
from ..storage.writing import output_folder, staged_folder
from . import command_help
from ._common import add_json_arg, add_overwrite_arg, say, show


def register(sub) -> None:
    p = sub.add_parser("export-hf",
                       help=command_help("export-hf"),
                       description="A model folder becomes BertForPreTraining / GPT2LMHeadModel / "
                       "ElectraForPreTraining (ELECTRA's generator, ElectraForMaskedLM, in OUT_DIR/generator); "
                       "a finetune run folder "
                       "becomes its task's class (BERT: sequence / token classification, question answering; GPT: "
                       "sequence classification) that transformers.pipeline reads. A run head with no exact HF "
                       "form is refused, saying what to retrain with (docs/transfer.md).")
    p.add_argument("model_dir",
                   help="lmforge model folder (BERT, GPT or ELECTRA) or transfer run folder (finetune --out)")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="folder to write (config.json, model.safetensors, tokenizer)")
    add_overwrite_arg(p)
    add_json_arg(p)
    p.set_defaults(func=run_export, reads=("model_dir",), writes=("--out",))
    q = sub.add_parser("import-hf", help=command_help("import-hf"))
    q.add_argument("hf_dir", help="HF folder with config.json and model.safetensors, or a model id (org/name) "
                   "already in the local HF cache (nothing is downloaded)")
    q.add_argument("--out", required=True, metavar="DIR",
                   help="lmforge model folder to write (a new one: it appears complete or not at all)")
    add_overwrite_arg(q)
    add_json_arg(q)
    q.set_defaults(func=run_import, reads=("hf_dir",), writes=("--out",))


def run_export(args) -> int:
    with output_folder(args.out, "export", args.overwrite, inputs=[args.model_dir], beside=True,
                       option="--out") as out:
        with staged_folder(out, "export") as tmp:
            export_hf(args.model_dir, tmp)
    config = load_json(out / "config.json")
    classes = config.get("architectures") or []
    record = {"out": str(out), "source": str(args.model_dir), "model_type": config.get("model_type"),
              "architectures": classes}
    show(args, record, [f"wrote HF folder {out}" + (f" ({', '.join(classes)})" if classes else "")])
    return 0


def run_import(args) -> int:

    hf_dir = resolve_hf_dir(args.hf_dir)  # a folder, or a model id found in the local HF cache
    if str(hf_dir) != args.hf_dir:
        say(args, f"reading {args.hf_dir} from the HF cache: {hf_dir}")
    with output_folder(args.out, "model", args.overwrite, inputs=[hf_dir], beside=True,
                       option="--out") as out:
        with staged_folder(out, "model") as tmp:
            model = import_hf(hf_dir, tmp)
    parameters = model.num_parameters()
    pipeline = model.sentence_pipeline
    record = {"model_dir": str(args.out), "source": str(args.hf_dir), "hf_dir": str(hf_dir),
              "model_type": model.model_type, "parameters": parameters,
              "sentence_pipeline": None if pipeline is None else dataclasses.asdict(pipeline)}
    kept = "" if pipeline is None else (
        "; its sentence-transformers pipeline is kept: "
        + ("the [CLS] vector" if pipeline.pool == "cls" else f"{pipeline.pool} over every token, [CLS] and [SEP] "
           "included") + f"{', normalized' if pipeline.normalize else ''}, at most {pipeline.max_seq_length} tokens")
    show(args, record, [f"imported {model.model_type} ({parameters / 1e6:.1f}M parameters) into {args.out}"
                        + kept])
    return 0
