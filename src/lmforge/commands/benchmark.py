"""``lmforge benchmark text|data NAME ...``: a real benchmark's in-domain text, or its labelled splits as files."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser(
        "benchmark",
        help="write a real benchmark's unlabelled in-domain text or its labelled train/test files",
        description="The real benchmarks (zh-sentiment, zh-ner, zh-pos, en-tweets) have a fixed test partition. "
        "'text' writes the benchmark's unlabelled in-domain text from outside it (for domain-adaptive "
        "pretraining: prepare it with the model's tokenizer, then pretrain --init MODEL); 'data' writes a seeded "
        "training draw and the fixed test set as files for finetune.",
    )
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    from ..transfer.benchmarks import BENCHMARKS

    t = verbs.add_parser("text", help="unlabelled in-domain text, none of it from the test partition")
    t.add_argument("name", choices=BENCHMARKS)
    t.add_argument("out", help="text file to write (one document per line, a blank line between documents)")
    t.add_argument(
        "--with-general",
        action="store_true",
        help="append lmforge's built-in English corpus as the general-domain part",
    )
    t.set_defaults(func=run_text)
    d = verbs.add_parser("data", help="labelled files: a seeded training draw and the fixed test set")
    d.add_argument("name", choices=BENCHMARKS)
    d.add_argument("out", help="folder to write train and test files into")
    d.add_argument("--n-train", type=int, default=300)
    d.add_argument("--n-test", type=int, default=1000)
    d.add_argument("--seed", type=int, default=0, help="draws the training set (the test set is the same for all)")
    d.set_defaults(func=run_data)


def run_text(args) -> int:
    from ..transfer.benchmarks import write_domain_text

    docs = write_domain_text(args.name, args.out, with_general=args.with_general)
    general = " plus the built-in English corpus" if args.with_general else ""
    print(f"wrote {len(docs)} {args.name} documents ({sum(map(len, docs))} characters){general} to {args.out}")
    return 0


def run_data(args) -> int:
    from pathlib import Path

    from ..data.labelled import write_task
    from ..transfer.benchmarks import load_benchmark

    train, test = load_benchmark(args.name, args.n_train, args.n_test, args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ext = "conll" if train.task == "tokens" else "jsonl"
    write_task(train, out / f"train.{ext}")
    write_task(test, out / f"test.{ext}")
    print(f"wrote {len(train)} training and {len(test)} test examples ({train.task}) to {out}/train.{ext}, test.{ext}")
    return 0
