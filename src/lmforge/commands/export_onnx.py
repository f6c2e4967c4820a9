"""``lmforge export-onnx MODEL_OR_RUN --out OUT.onnx [--quantize int8]``: a model's body or a fine-tuned run as ONNX."""

from __future__ import annotations

import shutil
from pathlib import Path

from ..errors import LmforgeError
from ..storage.files import atomic_path
from ..storage.folders import check_output_file
from . import command_help
from ._common import add_json_arg, add_overwrite_arg, show


def register(sub) -> None:
    p = sub.add_parser(
        "export-onnx", help=command_help("export-onnx"),
        description="Write an ONNX graph (any batch size and length) that ONNX Runtime and other ONNX runtimes run: "
                    "of a BERT / ELECTRA / GPT model folder, its top layer (inputs input_ids and attention_mask, "
                    "output states (B, T, C)); of a frozen or finetune classify / pair / tokens run, body and head "
                    "(inputs as lmforge collates a batch, output logits). The graph is the one --backend onnx runs "
                    "(docs/vectors.md).")
    p.add_argument("model_dir", metavar="MODEL", help="model folder or run folder (finetune --out)")
    p.add_argument("--out", required=True, metavar="FILE", help="the .onnx file to write (atomically)")
    add_overwrite_arg(p)
    p.add_argument("--quantize", choices=["none", "int8"], default="none",
                   help="int8: ONNX Runtime's dynamic int8 quantization (approximate; default none)")
    add_json_arg(p)
    p.set_defaults(func=run, reads=("model_dir",), writes=("--out",))


def run(args) -> int:
    from ..families import load  # imports torch too
    from ..interop.runs import is_run_folder  # imports torch: only when run
    from ..models import onnx_backend  # imports torch too

    out = Path(args.out)
    if out.suffix != ".onnx":
        raise LmforgeError(f"--out must end in .onnx, not '{out.name}'")
    check_output_file(out, args.overwrite)  # before any work: an existing file is not replaced unasked
    if is_run_folder(args.model_dir):
        graph, what = _run_graph(args.model_dir, args.quantize)
    else:
        model = load(args.model_dir)
        graph, what = onnx_backend.body_graph(model, args.quantize), f"{model.model_type} top layer"
    with atomic_path(out) as tmp:
        shutil.copyfile(graph, tmp)
    record = {"out": str(out), "source": str(args.model_dir), "graph": what, "quantize": args.quantize,
              "bytes": out.stat().st_size}
    show(args, record, [f"wrote {out} ({what}{', int8' if args.quantize == 'int8' else ''}, "
                        f"{out.stat().st_size / 1e6:.1f} MB)"])
    return 0


def _run_graph(run_dir, quantize: str) -> tuple[Path, str]:
    from ..transfer import load_run  # imports torch: only when run
    from ..transfer.onnx_run import run_graph  # imports torch too

    run_ = load_run(run_dir, device="cpu", precision="fp32")
    return run_graph(run_, quantize), f"{run_.cfg.task} run ({run_.family})"
