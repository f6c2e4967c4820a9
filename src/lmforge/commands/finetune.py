"""``lmforge finetune MODEL_DIR --task ... --mode frozen|features|finetune``: carry a model to a labelled task."""

from __future__ import annotations

import json


def add_truncation_arg(p) -> None:
    """``--truncation``: how a text longer than --max-len is cut (finetune and benchmark curve)."""
    p.add_argument(
        "--truncation", choices=["head", "head+tail"], default="head",
        help="a text longer than --max-len keeps its start (head), or its first quarter and as much of its "
        "end as fits (head+tail: for long documents whose end carries the label, such as reviews that give "
        "their verdict last); classify and pair tasks",
    )


def register(sub) -> None:
    p = sub.add_parser(
        "finetune",
        help="train a task head on a pretrained model (frozen / features / finetune) and evaluate it",
        description="Train a task on top of a pretrained model folder and write metrics.json, predictions.jsonl, "
        "config.json and the trained weights into --out.",
    )
    p.add_argument("model_dir", help="pretrained model folder (bert, gpt, elmo or word2vec)")
    p.add_argument(
        "--task",
        required=True,
        choices=["classify", "pair", "tokens", "qa", "choice"],
        help="classify/pair: CSV or JSONL with text[,text_pair],label; tokens: CoNLL; qa: SQuAD JSON; "
        "choice: JSONL with context, choices (a list), label (the right choice's index)",
    )
    p.add_argument("--train", required=True, help="training data file")
    p.add_argument("--test", required=True, help="test data file (labelled, same format)")
    p.add_argument(
        "--mode",
        default="finetune",
        choices=["frozen", "features", "finetune"],
        help="frozen: body fixed, head trains; features: cached vectors + small classifier; "
        "finetune: everything trains (default)",
    )
    p.add_argument("--out", required=True, help="run folder to write (checked before training: never the model folder)")
    p.add_argument("--overwrite", action="store_true",
                   help="write into a folder of another kind or holding other files anyway (never into MODEL_DIR)")
    p.add_argument(
        "--freeze-layers",
        type=int,
        default=None,
        metavar="K",
        help="finetune: keep the embeddings and the lowest K layers fixed",
    )
    p.add_argument(
        "--layer-lr-decay",
        type=float,
        default=None,
        metavar="D",
        help="finetune: each layer down trains at D times the rate of the one above (default 0.9 for a "
        "pretrained body, off from scratch; 1 turns it off)",
    )
    p.add_argument(
        "--epochs", type=int, default=None,
        help="the most passes over the training data; early stopping on the validation split may end sooner "
        "(default by mode: finetune 20, from scratch 40, frozen 60, features 100)",
    )
    p.add_argument(
        "--lr", type=float, default=None,
        help="peak learning rate (default: finetune 1e-4 x 384 / the body's width, from scratch 1e-3, frozen 3e-3, "
        "features torch heads 1e-2)",
    )
    p.add_argument(
        "--lr-grid", type=float, nargs="+", default=None, metavar="LR",
        help="try each peak learning rate and keep the one that scores best on the validation split",
    )
    p.add_argument(
        "--val-fraction", type=float, default=0.2, metavar="F",
        help="hold out this fraction of the training data to choose the epoch and the lr (default 0.2; 0 trains "
        "on all of it for --epochs)",
    )
    p.add_argument(
        "--patience", type=int, default=None, metavar="N",
        help="stop after N epochs (past the warm-up) in which neither the validation score nor the validation loss "
        "improved (default by mode: 3-8)",
    )
    p.add_argument(
        "--no-refit", dest="refit", action="store_false",
        help="keep the best epoch's model of the validation run instead of training again on all the training "
        "data (held-out part included) with the chosen lr and number of epochs",
    )
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-len", type=int, default=128, help="most tokens per input, special tokens included")
    add_truncation_arg(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--classifier",
        choices=["linear", "logreg", "mlp", "bilstm"],
        default=None,
        help="the head (default: logreg in features mode - scikit-learn on standardised vectors, its strength "
        "and layer chosen by cross-validation - else dropout + linear)",
    )
    p.add_argument(
        "--pool",
        choices=["cls", "pooler", "last", "mean", "tokens"],
        default=None,
        help="how a sentence is read: cls (BERT's top [CLS]), pooler (BERT's NSP-trained tanh pooler on [CLS]), "
        "last (GPT's extract token), mean, tokens (bilstm) (default: mean for single texts in features and "
        "frozen mode and for a BERT pretrained without next-sentence prediction; else BERT cls, GPT last, "
        "ELMo/word2vec mean)",
    )
    p.add_argument(
        "--layer", default=None, metavar="K|mix|auto",
        help="the layer the head reads: an index of the hidden states (0 = embeddings, -1 = top), mix (a learned "
        "ScalarMix of all) or auto (features + logreg: chosen by cross-validation) (default: auto in features "
        "mode, mix for ELMo, else the top layer)",
    )
    p.add_argument(
        "--from-scratch",
        action="store_true",
        help="finetune a randomly initialised copy of the architecture (the no-pretraining baseline)",
    )
    p.add_argument(
        "--lm-weight",
        type=float,
        default=None,
        metavar="W",
        help="GPT, finetune: add W x GPT-1's auxiliary next-token loss on the task's own texts (default 0.5, as "
        "in the paper; 0 turns it off)",
    )
    p.add_argument(
        "--doc-stride",
        type=int,
        default=None,
        metavar="N",
        help="qa: read a context longer than --max-len in windows starting N tokens apart "
        "(default: half the room after the question; 0 cuts the context instead)",
    )
    p.add_argument(
        "--max-answer-tokens",
        type=int,
        default=30,
        metavar="N",
        help="qa: the longest answer span considered, in tokens (default 30)",
    )
    p.add_argument(
        "--both-orders",
        action="store_true",
        help="pair (BERT/GPT): read each pair as (a, b) and (b, a) and add the two read-outs, as GPT-1 did for "
        "similarity, so the order of the two texts does not matter",
    )
    p.add_argument("--cache-dir", default=None, help="features mode: vector cache (default ~/.cache/lmforge/features)")
    p.add_argument(
        "--device", choices=["auto", "cpu", "cuda"], default="auto", help="where to train (auto: CUDA if any)"
    )
    p.add_argument("--bf16", action="store_true", help="run the body under bfloat16 autocast")
    p.add_argument(
        "--log",
        choices=["jsonl", "tensorboard"],
        default="jsonl",
        help="tensorboard: also write TensorBoard event files into --out (train/loss per epoch, test metrics)",
    )
    p.set_defaults(func=run)


def run(args) -> int:
    from ..folders import check_model_folder, output_folder, staged_folder
    from ..transfer import run_transfer

    options = {
        "freeze_layers": args.freeze_layers,
        "layer_lr_decay": args.layer_lr_decay,
        "epochs": args.epochs,
        "lr": args.lr,
        "lr_grid": args.lr_grid,
        "val_fraction": args.val_fraction,
        "patience": args.patience,
        "refit": args.refit,
        "layer": args.layer,
        "device": args.device,
        "bf16": args.bf16,
        "batch_size": args.batch_size,
        "max_len": args.max_len,
        "truncation": args.truncation,
        "seed": args.seed,
        "classifier": args.classifier,
        "pool": args.pool,
        "from_scratch": args.from_scratch,
        "cache_dir": args.cache_dir,
        "lm_weight": args.lm_weight,
        "doc_stride": args.doc_stride,
        "max_answer_tokens": args.max_answer_tokens,
        "both_orders": args.both_orders,
    }
    # the run is written into a hidden folder beside --out and renamed into place when complete, so a kill
    # at any moment leaves --out as it was
    with output_folder(args.out, "run", args.overwrite, inputs=[args.model_dir], beside=True):
        check_model_folder(args.model_dir)
        with staged_folder(args.out, "run") as tmp:
            progress = None
            if args.log == "tensorboard":
                from ..train.tblog import EpochLog

                progress = EpochLog(tmp)
            metrics = run_transfer(
                args.model_dir, args.task, args.train, args.test, mode=args.mode, out_dir=tmp, progress=progress,
                **options,
            )
            if progress is not None:
                progress.finish(metrics)
    shown = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    print(json.dumps({"task": metrics["task"], "mode": metrics["mode"], "family": metrics["family"], **shown}))
    if metrics.get("choices"):
        print("chosen on validation data: " + json.dumps(metrics["choices"]))
    print(f"wrote {args.out}/metrics.json, predictions.jsonl, config.json and the weights")
    return 0
