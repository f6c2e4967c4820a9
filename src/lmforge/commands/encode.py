"""``lmforge encode MODEL --file texts.txt --out vectors.npy|.parquet``: one vector per text, from any family."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from ..cpu_quota import auto_threads
from ..errors import LmforgeError
from ..families import load
from ..storage.folders import check_output_file
from ..storage.vector_files import save_vectors
from . import command_help
from ._common import (
    add_device_arg,
    add_inference_precision_arg,
    add_json_arg,
    add_overwrite_arg,
    add_text_file_args,
    show,
)

EPILOG = """\
examples:
  lmforge encode models/bert --file sentences.txt --out vectors.npy --normalize
  lmforge encode models/gpt --file reviews.jsonl --text-field body --out vectors.parquet --layer -2 --pool max
  lmforge encode models/bert --file reviews.csv --text-column review --out vectors.npy

Each line of --file is one text (for JSON lines, CSV, Parquet and the other record formats, the
--text-field of each record); row i of the output is the vector of text i. .npy holds a float32 array
(numpy.load(path)); .parquet a table with a `text` and a `vector` (list<float32>) column. The output is
written atomically and never replaces --file. Python: lmforge.load(MODEL).encode(texts) gives the same
array (docs/vectors.md).
"""


def register(sub) -> None:
    p = sub.add_parser(
        "encode", help=command_help("encode"), epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Encode every text of a file with a model: one layer's token vectors, pooled into one vector "
                    "per text.",
    )
    p.add_argument("model_dir", metavar="MODEL", help="model folder (any family)")
    p.add_argument("--file", required=True, metavar="FILE",
                   help="the texts: one per line (UTF-8, compressed too), or the records of a JSON Lines, JSON, "
                        "CSV/TSV or Parquet file or a `datasets` folder (told from the content)")
    p.add_argument("--out", required=True, metavar="OUT", help="vectors to write: a .npy or .parquet file")
    add_overwrite_arg(p)
    add_text_file_args(p, "--file")
    p.add_argument("--layer", type=int, default=None, metavar="L",
                   help="layer to pool: 0 = the token embedding, -1 = the top (default: the top)")
    p.add_argument("--pool", choices=["mean", "cls", "max", "mean+specials"], default=None,
                   help="mean or max over the text's tokens, the [CLS] vector (BERT only), or sentence-transformers' "
                        "mean over [CLS], the tokens and [SEP] (BERT, ELECTRA); default: the model's sentence "
                        "pipeline when it was imported from sentence-transformers, else mean")
    p.add_argument("--normalize", action=argparse.BooleanOptionalAction, default=None,
                   help="scale every vector to unit length (default: as the model's sentence pipeline says; "
                        "no pipeline: not scaled)")
    p.add_argument("--prompt-name", default=None, metavar="NAME",
                   help="a sentence-transformers model's prompt to put before every text (default: its default "
                        "prompt, if it has one)")
    p.add_argument("--batch-size", type=int, default=32, metavar="N", help="texts per forward pass (default 32)")
    p.add_argument("--backend", choices=["torch", "onnx", "auto"], default="torch",
                   help="what runs a sentence pipeline's model (a sentence-transformers model, or --pool "
                        "mean+specials): torch, ONNX Runtime (the onnx extra), or auto: the faster on this machine, "
                        "measured once per model (default torch)")
    p.add_argument("--quantize", choices=["none", "int8"], default="none",
                   help="int8: ONNX Runtime's dynamic int8 quantization, faster but approximate; the mean and worst "
                        "cosine against fp32 on your first texts are shown (default none: exact fp32)")
    add_device_arg(p)
    add_inference_precision_arg(p)
    add_json_arg(p)
    p.set_defaults(func=run, reads=("model_dir", "--file"), writes=("--out",))


def run(args) -> int:
    from ..models import vectors  # imports torch: only when run
    from ..train.precision import autocast, for_inference, resolve_compute  # imports torch too

    out = Path(args.out)
    if out.suffix not in (".npy", ".parquet"):
        raise LmforgeError(f"--out must end in .npy or .parquet, not '{out.name}'")
    if out.resolve() == Path(args.file).resolve():
        raise LmforgeError(f"--out {out} is the input file; choose another output file")
    check_output_file(out, args.overwrite)
    if args.batch_size < 1:
        raise LmforgeError(f"--batch-size must be >= 1, not {args.batch_size}")
    texts = vectors.read_texts(args.file, args.text_field, args.format, args.split)
    compute = resolve_compute(args.device, args.precision)
    device = compute.device
    auto = auto_threads() if device.type == "cpu" else None
    line = auto.settle() if auto is not None else None  # one thread per free CPU: lmforge/cpu_quota.py
    if line:
        logging.getLogger(__name__).info("%s", line)
    model = load(args.model_dir).to(device)
    precision = for_inference(compute, model).precision
    forward, backend = vectors.choose_forward(model, texts, layer=args.layer, pool=args.pool, backend=args.backend,
                                              quantize=args.quantize, batch_size=args.batch_size)
    start = time.perf_counter()
    with _Progress(len(texts), quiet=args.quiet) as progress, autocast(device, precision):
        array = model.encode(texts, layer=args.layer, pool=args.pool, normalize=args.normalize,
                             batch_size=args.batch_size, progress=progress, prompt_name=args.prompt_name,
                             forward=forward)
    seconds = time.perf_counter() - start
    fidelity = _fidelity(model, texts, array, args) if args.quantize != "none" else None
    save_vectors(out, texts, array)
    n_layers = len(model.layer_names())
    layer = vectors.resolve_layer(args.layer, n_layers)
    pipeline = vectors.sentence_pipeline(model, args.layer, args.pool)
    pool = f"sentence-transformers {pipeline.pool}" if pipeline is not None else args.pool or "mean"
    normalize = bool(pipeline.normalize if args.normalize is None and pipeline is not None else args.normalize)
    record = {"out": str(out), "model": str(args.model_dir), "model_type": model.model_type, "texts": len(texts),
              "dim": int(array.shape[1]), "layer": layer, "layers": n_layers, "pool": pool,
              "normalize": normalize, "device": str(device), "precision": precision, "backend": backend,
              "quantize": args.quantize, "fidelity": fidelity, "seconds": seconds,
              "texts_per_s": len(texts) / max(seconds, 1e-9)}
    show(args, record, [
        f"wrote {len(texts)} vectors of {array.shape[1]} floats to {out} ({model.model_type}, layer {layer} of "
        f"0..{n_layers - 1}, {pool} pooling{', normalized' if normalize else ''}"
        f"{'' if precision == 'fp32' else ', ' + precision}{'' if backend == 'torch' else ', ' + backend}"
        f"{'' if args.quantize == 'none' else ' ' + args.quantize}; "
        f"{len(texts) / max(seconds, 1e-9):.1f} texts/s)"]
        + ([f"int8 against fp32 on the first {fidelity['texts']} texts: mean cosine {fidelity['mean_cosine']:.5f}, "
            f"worst {fidelity['worst_cosine']:.5f}"] if fidelity else []))
    return 0


FIDELITY_TEXTS = 256  # texts re-encoded in fp32 to measure what int8 changes (the first ones of --file)


def _fidelity(model, texts: list[str], array, args) -> dict:
    """Mean and worst cosine of the quantized vectors against fp32 torch on the first texts of the user's file."""
    from ..models.onnx_backend import cosines  # imports torch: only when run

    n = min(len(texts), FIDELITY_TEXTS)
    exact = model.encode(texts[:n], layer=args.layer, pool=args.pool, normalize=args.normalize,
                         batch_size=args.batch_size, prompt_name=args.prompt_name)
    cos = cosines(array[:n], exact)
    return {"texts": n, "mean_cosine": float(cos.mean()), "worst_cosine": float(cos.min())}


class _Progress:
    """Progress on stderr: a tqdm bar on a terminal, a plain line every tenth of the texts when piped."""

    def __init__(self, total: int, quiet: bool = False):
        self.total, self.quiet, self.done, self.next_line, self.bar = total, quiet, 0, total / 10, None

    def __enter__(self):
        if not self.quiet and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=self.total, unit="text", desc="encode", file=sys.stderr, dynamic_ncols=True,
                            leave=False)
        return self

    def __call__(self, n: int) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
        elif not self.quiet and (self.done >= self.next_line or self.done == self.total):
            print(f"encode: {self.done}/{self.total} texts", file=sys.stderr, flush=True)
            while self.next_line <= self.done:
                self.next_line += self.total / 10

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.close()
