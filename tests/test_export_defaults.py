"""Every default run exports (issue 47): a default ``finetune`` run of each family and task that has an HF class
exports exactly, and a run that cannot map is refused in one line that names what to run instead and that
``predict`` still serves. One table: family x task x mode, trained for one epoch on tiny random bodies."""

from __future__ import annotations

import json
import random
import shlex

import pytest
from test_export_electra_runs import tiny_electra
from test_transfer_families import tiny_bert, tiny_elmo, tiny_gpt, tiny_word2vec

from lmforge.data.tasks import ChoiceExample, QAExample, TaskData, TextExample, TokensExample
from lmforge.errors import LmforgeError
from lmforge.interop.runs import check_exportable, export_run
from lmforge.transfer import load_run, run_transfer

WORDS = ["the", "name", "of", "a", "python", "and", "it", "is", "in", "language"]
NAMES = ["moses", "aaron", "david"]

# what a default run of (family, task, mode) does under export-hf:
#   exports  - exports exactly
#   refused  - refused, naming the flags that retrain it in a form that exports
#   no class - refused: no HF class takes the family or the task (predict and serve use it)
#   by layer - features + logreg choose the layer by cross-validation: exports when that is the top layer
TABLE = {
    **{(f, t, "finetune"): "exports" for f in ("bert", "electra") for t in ("classify", "pair", "tokens", "qa")},
    **{("gpt", t, "finetune"): "exports" for t in ("classify", "pair")},
    **{("gpt", t, m): "no class" for t in ("tokens", "qa") for m in ("frozen", "features", "finetune")},
    **{(f, "choice", m): "no class" for f in ("bert", "gpt", "electra") for m in ("frozen", "features", "finetune")},
    **{(f, t, "frozen"): "refused" for f in ("bert", "electra") for t in ("classify", "pair", "tokens", "qa")},
    **{("gpt", t, "frozen"): "refused" for t in ("classify", "pair")},
    **{(f, t, "features"): "refused" for f in ("bert", "electra") for t in ("classify", "qa")},
    ("bert", "pair", "features"): "refused",
    ("electra", "pair", "features"): "by layer",
    ("gpt", "classify", "features"): "refused",
    ("gpt", "pair", "features"): "by layer",
    ("bert", "tokens", "features"): "by layer",
    ("electra", "tokens", "features"): "by layer",
    **{("elmo", "classify", m): "no class" for m in ("frozen", "features")},
    **{("word2vec", "classify", m): "no class" for m in ("frozen", "features", "finetune")},
}
BUILD = {"bert": tiny_bert, "gpt": tiny_gpt, "electra": tiny_electra, "elmo": tiny_elmo, "word2vec": tiny_word2vec}


def task_data(task: str, n: int = 16, seed: int = 0) -> TaskData:
    rng = random.Random(seed)
    examples = []
    for i in range(n):
        name = NAMES[i % 3]
        filler = [rng.choice(WORDS) for _ in range(rng.randint(1, 3))]
        if task in ("classify", "pair"):
            label = "pos" if i % 2 else "neg"
            text = " ".join([*filler, "good" if label == "pos" else "bad"])
            examples.append(TextExample(text, " ".join(filler) if task == "pair" else None, label))
        elif task == "tokens":
            words = [*filler, name]
            examples.append(TokensExample(words, ["O"] * len(filler) + ["B-PER"]))
        elif task == "qa":
            context = f"{' '.join(filler)} was written by {name}"
            examples.append(QAExample(f"q{i}", "who wrote it", context, [(name, context.index(name))]))
        else:
            examples.append(ChoiceExample(" ".join(filler), [name, "nobody"], 0 if i % 2 else 1))
    labels = sorted({lab for ex in examples for lab in ([ex.label] if task in ("classify", "pair") else
                                                       (ex.tags if task == "tokens" else []))})
    return TaskData(task, examples, labels)


@pytest.fixture(scope="module")
def models(tmp_path_factory, wordpiece_tokenizer, bpe_tokenizer):
    root = tmp_path_factory.mktemp("bodies")
    out = {}
    for family, build in BUILD.items():
        tok = bpe_tokenizer if family == "gpt" else wordpiece_tokenizer
        build(tok).save_pretrained(root / family, tok)
        out[family] = root / family
    return out


def _train(model_dir, task, mode, out, **flags):
    data = task_data(task)
    run_transfer(str(model_dir), task, data, data, mode=mode, out_dir=out, epochs=1, max_len=24, seed=0,
                 cache_dir=str(out.parent / "cache"), device="cpu", precision="fp32", **flags)
    return json.loads((out / "config.json").read_text())


def _flags(retrain: str) -> dict:
    """The transfer options of the flags a refusal's retrain command adds to the run's own config."""
    argv = shlex.split(retrain.split(" --train ", 1)[0])
    start = argv.index("--config") + 2
    opts, i = {}, start
    while i < len(argv):
        key = argv[i].removeprefix("--").replace("-", "_")
        opts["classifier" if key == "classifier" else key] = argv[i + 1]
        i += 2
    return {k: int(v) if v.lstrip("-").isdigit() else v for k, v in opts.items()}


@pytest.mark.parametrize("family, task, mode", sorted(TABLE), ids=lambda v: str(v))
def test_every_default_run_exports_or_says_what_to_run(models, tmp_path, family, task, mode):
    expect = TABLE[(family, task, mode)]
    run_dir = tmp_path / "run"
    data = _train(models[family], task, mode, run_dir)
    if expect == "by layer":
        expect = "exports" if data["layer_ids"] == [data["num_states"] - 1] else "refused"
    if expect == "exports":
        arch, _ = check_exportable(data, run_dir)
        export_run(run_dir, tmp_path / "hf")
        hf = json.loads((tmp_path / "hf" / "config.json").read_text())
        assert hf["architectures"] == [arch]
        return
    with pytest.raises(LmforgeError) as e:
        check_exportable(data, run_dir)
    line = str(e.value)
    assert "\n" not in line and "predict and serve use" in line, line
    assert load_run(run_dir).predict(task_data(task, 2, seed=1))  # predict still serves the run
    if expect == "no class":
        assert "retrain" not in line
        return
    # the command it names retrains the run in a form that exports, every change at once
    retrain = line.split("retrain it in a form that exports: ", 1)[1]
    assert retrain.startswith(f"lmforge finetune {models[family].resolve()} --config {run_dir}/config.json")
    again = _train(models[family], task, mode, tmp_path / "again", **_flags(retrain))
    assert check_exportable(again)[0].startswith({"bert": "Bert", "gpt": "GPT2", "electra": "Electra"}[family])
