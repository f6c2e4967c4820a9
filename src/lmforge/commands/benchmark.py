"""``lmforge benchmark text|data|curve NAME ...``: a real benchmark's in-domain text, its labelled splits as
files, or a learning curve of a pretrained model against the same architecture trained from scratch."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser(
        "benchmark",
        help="a real benchmark's unlabelled in-domain text, its labelled train/test files, or a learning curve",
        description="The real benchmarks (zh-sentiment, zh-ner, zh-pos, en-tweets) have a fixed test partition. "
        "'text' writes the benchmark's unlabelled in-domain text from outside it (for domain-adaptive "
        "pretraining: prepare it with the model's tokenizer, then pretrain --init MODEL); 'data' writes a seeded "
        "training draw and the fixed test set as files for finetune; 'curve' scores a pretrained model in each "
        "transfer mode against the same architecture trained from scratch, at several numbers of labels and seeds.",
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
    t.add_argument(
        "--with-debian",
        action="store_true",
        help="then append the English of Debian's fortunes and GCIDE dictionary, every WordNet example sentence "
        "left out (3.8M words; apt-get install fortunes dict-gcide)",
    )
    t.set_defaults(func=run_text)
    d = verbs.add_parser("data", help="labelled files: a seeded training draw and the fixed test set")
    d.add_argument("name", choices=BENCHMARKS)
    d.add_argument("out", help="folder to write train and test files into")
    d.add_argument("--n-train", type=int, default=300)
    d.add_argument("--n-test", type=int, default=1000)
    d.add_argument("--seed", type=int, default=0, help="draws the training set (the test set is the same for all)")
    d.set_defaults(func=run_data)
    c = verbs.add_parser(
        "curve",
        help="learning curve: each transfer mode vs the same architecture from scratch, by number of labels",
        description="Draw training sets of each size (one draw per seed, shared by every mode) from the "
        "benchmark's training side, train each mode on them and score it on the fixed test set (or, with "
        "--score-on dev, on held-out training-side examples: for choosing a method). Writes "
        "curve.json (every run, its choices and validation score), curve.md (mean and spread per size and mode) "
        "and curve.png into --out.",
    )
    from .finetune import add_prompt_args, add_truncation_arg

    c.add_argument("name", choices=BENCHMARKS)
    c.add_argument("model_dir", help="pretrained model folder")
    c.add_argument("--out", required=True, help="folder for curve.json, curve.md and curve.png")
    c.add_argument("--sizes", type=int, nargs="+", default=[100, 300, 1000], help="training-set sizes")
    c.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    c.add_argument("--modes", nargs="+", default=None,
                   help="subset of scratch frozen features finetune, or scratch:PRESET (default: scratch and every "
                   "mode the family has)")
    c.add_argument("--scratch-presets", nargs="+", default=[], metavar="PRESET",
                   help="also train the from-scratch baseline in these presets' shapes (e.g. tiny), with the "
                   "scratch grid; the lead is reported over the strongest baseline")
    c.add_argument("--n-test", type=int, default=1000, help="test examples (the start of the fixed test partition)")
    c.add_argument("--pool", type=int, default=10000,
                   help="labelled training-side examples the training sets are drawn from (with --score-on dev, "
                   "the held-out dev examples included)")
    c.add_argument("--score-on", choices=["test", "dev"], default="test",
                   help="test: the fixed test partition (report this); dev: the last --dev-size examples of the "
                   "training pool, never drawn, so methods can be compared without looking at the test set")
    c.add_argument("--dev-size", type=int, default=2000, help="held-out dev examples with --score-on dev")
    c.add_argument("--min-steps", type=int, default=100, help="every run trains at least this many steps")
    c.add_argument("--max-len", type=int, default=128)
    add_truncation_arg(c)
    c.add_argument("--batch-size", type=int, default=32)
    c.add_argument("--cache-dir", default=None, help="features mode: vector cache (default ~/.cache/lmforge/features)")
    c.add_argument("--finetune-lr", type=float, default=None, help="lr of finetune and scratch runs")
    c.add_argument("--finetune-epochs", type=int, default=None, help="epochs of finetune and scratch runs")
    c.add_argument("--lr-grid-finetune", type=float, nargs="+", default=None, metavar="LR",
                   help="finetune: try these lrs, keep the best on the validation split")
    c.add_argument("--lr-grid-scratch", type=float, nargs="+", default=None, metavar="LR",
                   help="scratch: as many trials on the same validation split (give both grids or neither)")
    c.add_argument("--no-refit", dest="refit", action="store_false",
                   help="keep each run's best validation epoch instead of refitting on all its examples")
    add_prompt_args(c)
    c.add_argument("--prompt-modes", nargs="+", default=["finetune", "frozen"], metavar="MODE",
                   help="the modes that read the --prompt (default: finetune frozen; add scratch to give the "
                   "baseline the same read-out)")
    c.set_defaults(func=run_curve)


def run_text(args) -> int:
    from ..transfer.benchmarks import write_domain_text

    docs = write_domain_text(args.name, args.out, with_general=args.with_general, with_debian=args.with_debian)
    parts = ["the built-in English corpus"] * args.with_general + ["Debian's fortunes and GCIDE"] * args.with_debian
    general = f" plus {' and '.join(parts)}" if parts else ""
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


def run_curve(args) -> int:
    from ..errors import LmforgeError
    from ..transfer import learning_curve
    from ..transfer.benchmarks import BENCHMARK_PROMPTS, hold_out_dev, load_benchmark
    from ..transfer.curve import curve_table, leads_text
    from .finetune import verbalizer_option

    grids = (args.lr_grid_finetune, args.lr_grid_scratch)
    if (grids[0] is None) != (grids[1] is None) or (grids[0] and len(grids[0]) != len(grids[1])):
        raise LmforgeError(
            "give --lr-grid-finetune and --lr-grid-scratch together, with as many lrs each: the baseline gets "
            "as many trials as the pretrained model"
        )
    # --prompt default: the benchmark's own template and words; a template of one's own keeps its words
    prompt = {"prompt": args.prompt, "verbalizer": verbalizer_option(args.verbalizer)}
    if args.prompt is not None and args.verbalizer is None and args.name in BENCHMARK_PROMPTS:
        prompt["verbalizer"] = BENCHMARK_PROMPTS[args.name][1]
    if args.prompt == "default":
        if args.name not in BENCHMARK_PROMPTS:
            raise LmforgeError(f"{args.name} has no default prompt; give --prompt TEMPLATE --verbalizer LABEL=WORD ...")
        prompt["prompt"] = BENCHMARK_PROMPTS[args.name][0]
    if prompt["prompt"] is not None and prompt["verbalizer"] is None:
        raise LmforgeError("--prompt needs --verbalizer LABEL=WORD ... (a word for each label)")
    bad = [m for m in args.prompt_modes if m not in ("scratch", "finetune", "frozen")]
    if bad:
        raise LmforgeError(f"--prompt-modes takes scratch, finetune and frozen, got {bad}")
    per_mode = {
        "finetune": {"lr": args.finetune_lr, "epochs": args.finetune_epochs, "lr_grid": args.lr_grid_finetune},
        "scratch": {"lr": args.finetune_lr, "epochs": args.finetune_epochs, "lr_grid": args.lr_grid_scratch},
        "frozen": {},
    }
    if prompt["prompt"] is not None:
        for m in args.prompt_modes:
            per_mode[m].update(prompt)
    if args.score_on == "dev":
        train, _ = load_benchmark(args.name, args.pool, args.n_test, seed=0)
        train, test = hold_out_dev(train, args.dev_size)
    else:
        train, test = load_benchmark(args.name, max(args.pool, max(args.sizes)), args.n_test, seed=0)
    res = learning_curve(
        args.model_dir,
        train.task,
        train,
        test,
        sizes=args.sizes,
        seeds=args.seeds,
        modes=args.modes,
        out_dir=args.out,
        min_steps=args.min_steps,
        max_len=args.max_len,
        truncation=args.truncation,
        batch_size=args.batch_size,
        cache_dir=args.cache_dir,
        refit=args.refit,
        mode_options=per_mode,
        scratch_presets=args.scratch_presets,
    )
    print(curve_table(res))
    leads = leads_text(res)
    if leads:
        print(leads)
    if args.score_on == "dev":
        print(f"scored on {len(test)} held-out training-side examples (--score-on dev), not on the test set")
    print(f"wrote {args.out}/curve.png, curve.md, curve.json")
    return 0
