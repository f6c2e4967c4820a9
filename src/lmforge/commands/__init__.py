"""One module per CLI subcommand; each exposes ``register(subparsers)``.

:data:`COMMANDS` names every command in the order of ``lmforge --help``, with the module that registers it and
its one-line help.  The top-level help, ``--version`` and the message for an unknown command are made from it
without importing any command module (most of them import torch); a command's module is imported when that
command is run or asked for its help.
"""

from __future__ import annotations

from ..families import FAMILIES

#: command -> (module under lmforge.commands, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("demo", "the whole lineage on the built-in corpus: tokenizers, five models, polysemy, transfer, report"),
    "tokenizer": ("tokenizer", "train a WordPiece (BERT, ELECTRA) or byte-level BPE (GPT) tokenizer"),
    "prepare": ("prepare", "tokenize text files into memory-mapped shards for pretraining"),
    "pretrain": ("pretrain", f"pretrain a model family ({', '.join(FAMILIES)}) on token shards"),
    "generate": ("generate", "continue a prompt with a GPT model (tokens stream as they come)"),
    "fill-mask": ("fill_mask", "predict the tokens behind [MASK] with a BERT or ELECTRA model"),
    "embed": ("embed", "compare a word's vectors across sentences, for every model and layer"),
    "encode": ("encode", "write one vector per text of a file (.npy or .parquet)"),
    "neighbors": ("neighbors", "list the words nearest to a word (word2vec vectors, or contextual means over a "
                               "corpus)"),
    "evaluate": ("evaluate", "evaluate word representations (wic), a trained run on new labelled data (run), or a "
                             "pretrained model's perplexity on new text (lm)"),
    "finetune": ("finetune", "train a task head on a pretrained model (frozen / features / finetune) and evaluate it"),
    "predict": ("predict", "run a trained task (a folder written by `lmforge finetune`) on new text"),
    "benchmark": ("benchmark", "a real benchmark's unlabelled in-domain text, its labelled train/test files, or a "
                               "learning curve"),
    "export-hf": ("hf", "write a BERT/GPT/ELECTRA model folder or fine-tuned run as an HF transformers folder"),
    "import-hf": ("hf", "read an HF BERT/GPT-2/ELECTRA folder into an lmforge model folder"),
    "export-onnx": ("export_onnx", "write a model's body or a fine-tuned run as an ONNX graph (int8 optional)"),
    "serve": ("serve", "serve model folders and fine-tuned runs over HTTP (lmforge's API, OpenAI-compatible routes, "
                       "a web playground at /)"),
}


def command_help(command: str) -> str:
    """The one-line help of ``command`` (what ``lmforge --help`` lists)."""
    return COMMANDS[command][1]
