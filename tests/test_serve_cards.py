"""Model cards (README.md in the HF format) for model folders, runs and HF exports, and ``--set log=tensorboard``."""

from __future__ import annotations

import json
import random

import pytest

from lmforge.cli import main
from lmforge.storage.cards import read_card_meta, shard_facts
from lmforge.train.tblog import read_scalars

TINY_GPT = [
    "--config",
    "tiny",
    "--set",
    "n_layer=1",
    "n_embd=32",
    "n_head=2",
    "n_positions=32",
    "batch_size=2",
    "eval_batches=1",
    "log_every=1",
    "eval_every=2",
    "save_every=0",
    "warmup_steps=1",
    "--device",
    "cpu",
]


def _front(path):
    text = (path / "README.md").read_text()
    assert text.startswith("---\n") and text.count("\n---\n") >= 1
    return text, read_card_meta(path)


@pytest.fixture(scope="module")
def gpt_dir(tmp_path_factory, bpe_shards):
    out = tmp_path_factory.mktemp("cards") / "gpt"
    assert (
        main(
            [
                "-q",
                "pretrain",
                "gpt",
                "--data",
                str(bpe_shards),
                "--out",
                str(out),
                *TINY_GPT,
                "--set",
                "max_steps=4",
                "log=tensorboard",
            ]
        )
        == 0
    )
    return out


def test_pretrain_writes_tensorboard_events_beside_metrics_jsonl(gpt_dir):
    events = [json.loads(x) for x in (gpt_dir / "metrics.jsonl").read_text().splitlines()]
    assert list(gpt_dir.glob("events.out.tfevents.*")) and (gpt_dir / "training_curves.png").is_file()
    scalars = read_scalars(gpt_dir)
    train = [(e["step"], e["loss"]) for e in events if e["split"] == "train"]
    val = [(e["step"], e["loss"]) for e in events if e["split"] == "val"]
    assert [s for s, _ in scalars["train/loss"]] == [s for s, _ in train] == [1, 2, 3, 4]
    assert [v for _, v in scalars["train/loss"]] == pytest.approx([v for _, v in train], rel=1e-6)
    assert [v for _, v in scalars["val/loss"]] == pytest.approx([v for _, v in val], rel=1e-6)
    assert "val/ppl" in scalars and "train/lr" in scalars
    assert json.loads((gpt_dir / "train_config.json").read_text())["log"] == "tensorboard"


def test_default_log_writes_no_event_files(bpe_shards, tmp_path, capsys):
    out = tmp_path / "plain"
    assert (
        main(["-q", "pretrain", "gpt", "--data", str(bpe_shards), "--out", str(out), *TINY_GPT, "--set", "max_steps=2"])
        == 0
    )
    assert not list(out.glob("events.out.tfevents.*")) and (out / "metrics.jsonl").is_file()
    assert (
        main(
            [
                "-q",
                "pretrain",
                "word2vec",
                "--data",
                str(bpe_shards),
                "--out",
                str(tmp_path / "w"),
                "--set",
                "log=tensorboard",
            ]
        )
        == 2
    )
    assert "training key of the Trainer's families (bert, gpt, elmo, electra)" in capsys.readouterr().err


def test_model_card_of_a_pretrained_folder(gpt_dir, bpe_shards, bpe_tokenizer):
    text, meta = _front(gpt_dir)
    assert meta["library_name"] == "lmforge" and meta["language"] == ["en"] and meta["license"] == "other"
    assert "gpt" in meta["tags"] and meta["pipeline_tag"] == "text-generation"
    facts = shard_facts(bpe_shards)
    assert meta["lmforge"]["corpus"]["sha256"] == facts["sha256"]
    assert meta["lmforge"]["parameters"] == sum(p.numel() for p in __import__("lmforge").load(gpt_dir).parameters())
    events = [json.loads(x) for x in (gpt_dir / "metrics.jsonl").read_text().splitlines()]
    last_val = [e for e in events if e["split"] == "val"][-1]
    for needle in (
        facts["sha256"],
        bpe_tokenizer.hash,
        "## Corpus",
        "## Tokenizer",
        "## Config",
        "## Training",
        "## Evaluation",
        "## Intended use",
        "## Limitations",
        "| n_embd | 32 |",
        "| max_steps | 4 |",
        "| optimizer steps | 4 |",
        f"| ppl | {last_val['metrics']['ppl']:.4g} |",
        "## Pretraining diagnostics",
        f"| `token_cos` | {last_val['metrics']['token_cos']:.3f} |",
        "![training curves](training_curves.png)",
        "tiny_corpus.txt",
    ):
        assert needle in text, needle
    # the same corpus and tokenizer give the same hash; another tokenizer's shards another one
    assert shard_facts(bpe_shards)["sha256"] == facts["sha256"]


def test_word2vec_run_and_export_cards(gpt_dir, wordpiece_shards, bpe_shards, tmp_path):
    w2v = tmp_path / "w2v"
    assert (
        main(
            [
                "-q",
                "pretrain",
                "word2vec",
                "--data",
                str(wordpiece_shards),
                "--out",
                str(w2v),
                "--set",
                "vector_size=16",
                "epochs=1",
            ]
        )
        == 0
    )
    text, meta = _front(w2v)
    assert meta["pipeline_tag"] == "feature-extraction" and "word2vec" in meta["tags"]
    assert (
        meta["lmforge"]["corpus"]["sha256"]
        == shard_facts(wordpiece_shards)["sha256"]
        != shard_facts(bpe_shards)["sha256"]
    )
    assert "Static vectors cannot tell the senses" in text
    # a fine-tuned run: its task, metrics and the corpus of its base model
    rng = random.Random(0)
    rows = [{"text": f"{rng.choice(['good', 'bad'])} python", "label": "x"} for _ in range(8)]
    for r in rows:
        r["label"] = r["text"].split()[0]
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = tmp_path / "run"
    assert (
        main(
            [
                "-q",
                "finetune",
                str(gpt_dir),
                "--task",
                "classify",
                "--train",
                str(data),
                "--test",
                str(data),
                "--mode",
                "frozen",
                "--epochs",
                "2",
                "--max-len",
                "16",
                "--out",
                str(run),
                "--set",
                "log=tensorboard",
            ]
        )
        == 0
    )
    text, meta = _front(run)
    metrics = json.loads((run / "metrics.json").read_text())
    assert meta["pipeline_tag"] == "text-classification" and meta["lmforge"]["task"] == "classify"
    assert "\n# run: classify with a " in text  # titled by the folder's name, not its staging name
    assert meta["lmforge"]["corpus"]["sha256"] == shard_facts(bpe_shards)["sha256"]
    assert f"| accuracy | {metrics['accuracy']:.4g} |" in text and "| n_train | 8 |" in text
    scalars = read_scalars(run)  # finetune --set log=tensorboard: a loss per epoch (per lr tried) and the test metrics
    losses = [tag for tag in scalars if tag.startswith("train/loss")]
    assert losses and all([s for s, _ in scalars[tag]] == [1, 2] for tag in losses)
    assert scalars["test/accuracy"][0][1] == pytest.approx(metrics["accuracy"])
    # an HF export: transformers loads it, the card says so and keeps the corpus
    hf = tmp_path / "hf"
    assert main(["-q", "export-hf", str(gpt_dir), "--out", str(hf)]) == 0
    text, meta = _front(hf)
    assert meta["library_name"] == "transformers" and "lmforge" in meta["tags"]
    assert meta["lmforge"]["corpus"]["sha256"] == shard_facts(bpe_shards)["sha256"]
    assert "GPT2LMHeadModel" in text and str(gpt_dir) in text
