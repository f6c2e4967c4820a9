"""``lmforge benchmark text|data|curve NAME ...``: a real benchmark's in-domain text, its labelled splits as
files, or a learning curve of a pretrained model against the same architecture trained from scratch."""

from __future__ import annotations

from pathlib import Path

from ..data.task_files import write_task
from ..errors import LmforgeError
from ..storage.folders import check_output_file
from ..transfer import learning_curve
from ..transfer.benchmarks import BENCHMARKS, load_benchmark, write_domain_text
from ..transfer.curve import curve_table, leads_text
from ..transfer.specs import SPECS
from . import command_help
from ._common import add_compute_args, add_json_arg, add_overwrite_arg, compute_options, progress, show
from ._groups import add_cache_dir_arg, add_curve_draw_args
from .finetune import add_truncation_arg


def register(sub) -> None:
    p = sub.add_parser(
        "benchmark",
        help=command_help("benchmark"),
        description="The real benchmarks (zh-sentiment, zh-ner, zh-pos, en-tweets) have a fixed test partition. "
        "'text' writes the benchmark's unlabelled in-domain text from outside it (for domain-adaptive "
        "pretraining: prepare it with the model's tokenizer, then pretrain --init MODEL); 'data' writes a seeded "
        "training draw and the fixed test set as files for finetune; 'curve' scores a pretrained model in each "
        "transfer mode against the same architecture trained from scratch, at several numbers of labels and seeds.",
    )
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    _register_text(verbs)
    _register_data(verbs)
    _register_curve(verbs)


def _register_text(verbs) -> None:
    """``benchmark text NAME --out FILE``: the benchmark's unlabelled in-domain text."""
    t = verbs.add_parser("text", help="unlabelled in-domain text, none of it from the test partition")
    t.add_argument("name", choices=BENCHMARKS)
    t.add_argument("--out", required=True, metavar="FILE",
                   help="text file to write (one document per line, a blank line between documents)")
    t.add_argument(
        "--with-general",
        action="store_true",
        help="append lmforge's built-in English corpus as the general-domain part",
    )
    t.add_argument(
        "--with-debian",
        action="store_true",
        help="then append the English of Debian's fortunes and GCIDE dictionary, every WordNet example sentence "
        "left out (3.8M words; apt-get install fortunes dict-gcide)",
    )
    add_overwrite_arg(t)
    add_json_arg(t)
    t.set_defaults(func=run_text, writes=("--out",))


def _register_data(verbs) -> None:
    """``benchmark data NAME --out DIR``: a seeded training draw and the fixed test set as files."""
    d = verbs.add_parser("data", help="labelled files: a seeded training draw and the fixed test set")
    d.add_argument("name", choices=BENCHMARKS)
    d.add_argument("--out", required=True, metavar="DIR", help="folder to write train and test files into")
    d.add_argument("--n-train", type=int, default=300)
    d.add_argument("--n-test", type=int, default=1000)
    d.add_argument("--seed", type=int, default=0, help="draws the training set (the test set is the same for all)")
    add_overwrite_arg(d)
    add_json_arg(d)
    d.set_defaults(func=run_data, writes=("--out",))


def _register_curve(verbs) -> None:
    """``benchmark curve NAME MODEL_DIR --out DIR``: a learning curve on the benchmark."""
    c = verbs.add_parser(
        "curve",
        help="learning curve: each transfer mode vs the same architecture from scratch, by number of labels",
        description="Draw training sets of each size (one draw per seed, shared by every mode) from the "
        "benchmark's training side, train each mode on them and score it on the fixed test set. Writes "
        "curve.json (every run, its choices and validation score), curve.md (mean and spread per size and mode) "
        "and curve.png into --out.",
    )
    c.add_argument("name", choices=BENCHMARKS)
    c.add_argument("model_dir", help="pretrained model folder")
    c.add_argument("--out", required=True, help="folder for curve.json, curve.md and curve.png")
    add_curve_draw_args(c, sizes=[100, 300, 1000])
    c.add_argument("--n-test", type=int, default=1000, help="test examples (the start of the fixed test partition)")
    c.add_argument("--pool", type=int, default=10000,
                   help="labelled training-side examples the training sets are drawn from")
    c.add_argument("--max-len", type=int, default=128)
    add_truncation_arg(c)
    c.add_argument("--batch-size", type=int, default=32)
    add_cache_dir_arg(c)
    c.add_argument("--no-refit", dest="refit", action="store_false",
                   help="keep each run's best validation epoch instead of refitting on all its examples")
    add_compute_args(c)
    add_overwrite_arg(c)
    add_json_arg(c)
    c.set_defaults(func=run_curve, reads=("model_dir",), writes=("--out",))


def _check_files(folder, names: list[str], overwrite: bool) -> None:
    """Refuse a folder that is a file, or one already holding a file this command writes (unless ``overwrite``)."""
    if Path(folder).exists() and not Path(folder).is_dir():
        raise LmforgeError(f"{folder} is a file, not a folder; choose a folder name")
    for name in names:
        check_output_file(Path(folder) / name, overwrite, option="the output")


def run_text(args) -> int:
    check_output_file(args.out, args.overwrite, option="--out")
    docs = write_domain_text(args.name, args.out, with_general=args.with_general, with_debian=args.with_debian)
    parts = ["the built-in English corpus"] * args.with_general + ["Debian's fortunes and GCIDE"] * args.with_debian
    general = f" plus {' and '.join(parts)}" if parts else ""
    chars = sum(map(len, docs))
    record = {"benchmark": args.name, "out": str(args.out), "documents": len(docs), "characters": chars,
              "with_general": args.with_general, "with_debian": args.with_debian}
    show(args, record, [f"wrote {len(docs):,} {args.name} documents ({chars:,} characters){general} to {args.out}"])
    return 0


def run_data(args) -> int:
    train, test = load_benchmark(args.name, args.n_train, args.n_test, args.seed)
    ext = SPECS[train.task].file_suffix
    _check_files(args.out, [f"train.{ext}", f"test.{ext}"], args.overwrite)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_task(train, out / f"train.{ext}")
    write_task(test, out / f"test.{ext}")
    record = {"benchmark": args.name, "task": train.task, "seed": args.seed, "n_train": len(train),
              "n_test": len(test), "train": str(out / f"train.{ext}"), "test": str(out / f"test.{ext}")}
    show(args, record, [f"wrote {len(train)} training and {len(test)} test examples ({train.task}) to "
                        f"{out}/train.{ext}, test.{ext}"])
    return 0


def run_curve(args) -> int:
    _check_files(args.out, ["curve.json", "curve.md", "curve.png"], args.overwrite)
    train, test = load_benchmark(args.name, max(args.pool, max(args.sizes)), args.n_test, seed=0)
    compute = compute_options(args)
    with progress("learning curve", unit="run", quiet=getattr(args, "quiet", False),
                  quiet_loggers=("lmforge.transfer.fit", "lmforge.transfer.curve")) as bar:
        res = learning_curve(
            args.model_dir, train.task, train, test, sizes=args.sizes, seeds=args.seeds, modes=args.modes,
            out_dir=args.out, max_len=args.max_len, truncation=args.truncation, batch_size=args.batch_size,
            cache_dir=args.cache_dir, refit=args.refit, progress=bar, **compute,
        )
    leads = leads_text(res)
    lines = [curve_table(res), *([leads] if leads else []), f"wrote {args.out}/curve.png, curve.md, curve.json"]
    show(args, res, lines)
    return 0
