"""``lmforge finetune MODEL_DIR --task ... --mode frozen|features|finetune``: carry a model to a labelled task."""

from __future__ import annotations

from ..data.tasks import load_task
from ..families import FAMILIES
from ..storage.writing import output_folder, staged_folder
from ..train.tblog import EpochLog
from ..transfer import run_transfer
from ..transfer.holdout import hold_out
from ..transfer.modes import MODES
from ..transfer.specs import SPECS
from . import command_help
from ._columns import add_column_args
from ._common import add_compute_args, add_json_arg, add_overwrite_arg, progress, show
from ._finetune import add_run_file_args, summary, transfer_settings
from ._groups import brief_help


def add_truncation_arg(p) -> None:
    """``--truncation``: how a text longer than --max-len is cut (finetune and benchmark curve)."""
    p.add_argument(
        "--truncation", choices=["head", "head+tail"], default=None,
        help="a text longer than --max-len keeps its start (head), or its first quarter and as much of its "
        "end as fits (head+tail: for long documents whose end carries the label, such as reviews that give "
        "their verdict last); classify and pair tasks",
    )


def _add_data_args(p) -> None:
    """The model, the task, its data files, the mode and the run folder."""
    p.add_argument("model_dir", help=f"pretrained model folder ({', '.join(FAMILIES)})")
    p.add_argument(
        "--task",
        default=None,
        choices=list(SPECS),
        help="classify/pair: CSV or JSONL with text[,text_pair],label; tokens: CoNLL; qa: SQuAD JSON; "
        "choice: JSONL with context, choices (a list), label (the right choice's index); required unless "
        "--config names it",
    )
    p.add_argument("--train", required=True, help="training data file")
    p.add_argument("--test", default=None,
                   help="test data file (labelled, same format); without it --test-fraction of --train is held out")
    p.add_argument("--test-fraction", type=float, default=0.2, metavar="F",
                   help="without --test: hold out this fraction of --train as the test set, drawn with --seed and "
                   "stratified by label (default 0.2)")
    p.add_argument(
        "--mode",
        default=None,
        choices=list(MODES),
        help="frozen: body fixed, head trains; features: cached vectors + small classifier; "
        "finetune: everything trains (default)",
    )
    p.add_argument("--out", required=True, help="run folder to write (checked before training: never the model folder)")
    add_overwrite_arg(p)


def _add_training_args(p) -> None:
    """How long and how fast the head (and the body) train, and on what split."""
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
        "--val-fraction", type=float, default=None, metavar="F",
        help="hold out this fraction of the training data to choose the epoch and the lr (default 0.2; 0 trains "
        "on all of it for --epochs)",
    )
    p.add_argument(
        "--patience", type=int, default=None, metavar="N",
        help="stop after N epochs (past the warm-up) in which neither the validation score nor the validation loss "
        "improved (default by mode: 3-8)",
    )
    p.add_argument(
        "--no-refit", dest="refit", action="store_false", default=None,
        help="keep the best epoch's model of the validation run instead of training again on all the training "
        "data (held-out part included) with the chosen lr and number of epochs",
    )
    p.add_argument("--batch-size", type=int, default=None, help="examples per step (default 32)")
    p.add_argument("--max-len", type=int, default=None,
                   help="most tokens per input, special tokens included (default 128)")
    add_truncation_arg(p)
    p.add_argument("--seed", type=int, default=None,
                   help="seeds the held-out splits, the head's init, dropout and the order of examples (default 0)")


def _add_head_args(p) -> None:
    """What the head is and reads, and the task-specific reading options."""
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
        "last (GPT's extract token), mean, tokens (bilstm) (default: finetune mode on classify and pair reads "
        "what the family's HF class reads, BERT pooler, ELECTRA cls, GPT last, so the run exports; frozen and "
        "features mode: mean for single texts, else BERT cls, GPT last; ELMo/word2vec mean)",
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
        default=None,
        metavar="N",
        help="qa: the longest answer span considered, in tokens (default 30)",
    )
    p.add_argument(
        "--both-orders",
        action="store_true",
        help="pair (BERT/GPT): read each pair as (a, b) and (b, a) and add the two read-outs, as GPT-1 did for "
        "similarity, so the order of the two texts does not matter",
    )


def register(sub) -> None:
    p = sub.add_parser(
        "finetune",
        help=command_help("finetune"),
        usage="lmforge finetune MODEL_DIR --task TASK --train FILE [--test FILE] --out DIR [OPTIONS]",
        description="Train a task on top of a pretrained model folder and write metrics.json, predictions.jsonl, "
        "config.json and the trained weights into --out.",
    )
    _add_data_args(p)
    _add_training_args(p)
    _add_head_args(p)
    p.add_argument("--cache-dir", default=None, help="features mode: vector cache (default ~/.cache/lmforge/features)")
    add_compute_args(p)
    add_run_file_args(p)
    add_json_arg(p)
    p.set_defaults(func=run, reads=("model_dir", "--train", "--test"), writes=("--out",))
    add_column_args(p)
    brief_help(p, SHOWN, "the head (--classifier, --pool, --layer), the schedule, --device and --precision, qa "
               "windows, pairs, the feature cache and the columns of the data files")


# the options `finetune --help` lists (`--help-all`: every one)
SHOWN = ("--task", "--train", "--test", "--mode", "--out", "--epochs", "--lr", "--batch-size", "--max-len",
         "--config", "--set", "--json")


def run(args) -> int:
    task, mode, options, log = transfer_settings(args)
    train, test, split = args.train, args.test, None
    if test is None:  # one labelled file: a seeded, stratified part of it is the test set
        split = hold_out(load_task(args.train, task), args.test_fraction, options.get("seed") or 0)
        train, test = split.train, split.test
    # the run is written into a hidden folder beside --out and renamed into place when complete, so a kill
    # at any moment leaves --out as it was
    with output_folder(args.out, "run", args.overwrite, inputs=[args.model_dir], beside=True):
        with staged_folder(args.out, "run") as tmp:
            tb = EpochLog(tmp) if log == "tensorboard" else None
            quiet = getattr(args, "quiet", False)
            with progress("finetune", quiet=quiet, quiet_loggers=("lmforge.transfer.fit",)) as bar:
                def on_epoch(line: str) -> None:
                    bar(line)
                    if tb is not None:
                        tb(line)

                metrics = run_transfer(args.model_dir, task, train, test, mode=mode, out_dir=tmp, progress=on_epoch,
                                       **options)
            if tb is not None:
                tb.finish(metrics)
    held_out = {"held_out_of": str(args.train), "fraction": split.fraction, "seed": split.seed,
                "stratified": split.stratified} if split is not None else None
    record = {**metrics, "out": str(args.out), "test": held_out or str(args.test)}
    show(args, record, lambda: summary(metrics, args.out, split.describe() if split is not None else None, log))
    return 0
