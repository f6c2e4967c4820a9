"""One way to say each thing, and output a person reads: the shared --device / --precision flags, precision
auto, run files that repeat a run, family-specific --set names, --json beside the human summary, the held-out
test split of finetune, predict --file beside its inputs, no warning about unused heads, no literal %% in help."""

from __future__ import annotations

import argparse
import json
import math
import sys

import pytest
import torch
from test_pretrain_cli import ToyLM, toy_family  # noqa: F401  (toy_family is a fixture)
from test_transfer_families import rows, tiny_gpt

from lmforge.cli import build_parser, main
from lmforge.data.tasks import TaskData, TextExample
from lmforge.errors import ConfigError
from lmforge.storage.files import load_safetensors
from lmforge.train import precision as P
from lmforge.transfer import run_transfer
from lmforge.transfer.holdout import hold_out

TRAINING_COMMANDS = (("pretrain",), ("finetune",), ("benchmark", "curve"), ("demo",))


def _subparser(*path: str) -> argparse.ArgumentParser:
    parser = build_parser()
    for name in path:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[name]
    return parser


def _walk(parser: argparse.ArgumentParser, name: str = "lmforge"):
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from _walk(sub, f"{name} {sub_name}")


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def one_line_error(rc: int, err: str, *says: str) -> None:
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for text in says:
        assert text in err, err


# -- the same flags on every training command ------------------------------------------------------------------
def test_every_training_command_takes_the_same_device_and_precision_flags():
    def describe(action):
        shown = getattr(action, "full_help", action.help)  # finetune --help leaves it to --help-all
        return (tuple(action.option_strings), action.choices, action.default, shown, action.metavar,
                getattr(action.type, "__name__", None))

    seen = {}
    for path in TRAINING_COMMANDS:
        actions = {a.dest: a for a in _subparser(*path)._actions}
        seen[path] = (describe(actions["device"]), describe(actions["precision"]))
        assert actions["precision"].choices == ("auto", "fp32", "bf16", "fp16")
        flags = {s for a in actions.values() for s in a.option_strings}
        assert "--bf16" not in flags and "--max-steps" not in flags  # --precision bf16, --set max_steps=N
    assert len(set(seen.values())) == 1, seen
    assert "--log" not in {s for a in _subparser("pretrain")._actions for s in a.option_strings}  # --set log=...
    # the device flag takes cuda:N and refuses anything else at parse time
    parser = _subparser("demo")
    assert parser.parse_args(["--device", "cuda:1"]).device == "cuda:1"
    with pytest.raises(SystemExit):
        parser.parse_args(["--device", "tpu"])


def test_flag_owned_keys_say_the_one_way_and_old_spellings_are_unknown(tmp_path, capsys):
    base = ["pretrain", "gpt", "--data", tmp_path / "none", "--out", tmp_path / "m"]
    one_line_error(*run_cli(capsys, *base, "--set", "device=cpu")[::2], "use --device cpu")
    one_line_error(*run_cli(capsys, *base, "--set", "max_time=15m")[::2], "use --max-time 15m")
    # spellings of earlier development (bf16=..., --max-steps, --bf16) get the ordinary unknown-key / option error
    one_line_error(*run_cli(capsys, *base, "--set", "bf16=true")[::2], "unknown --set key 'bf16'")
    for flag, line in ((["--max-steps", "3"], "unknown option --max-steps; did you mean --max-time?"),
                       (["--bf16"], "unknown option --bf16;")):
        with pytest.raises(SystemExit) as e:
            main([*map(str, base), *flag])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert line in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert not (tmp_path / "m").exists()


def test_fp16_on_a_cpu_is_refused_in_one_line_before_anything_is_written(bpe_shards, tmp_path, capsys):
    out = tmp_path / "m"
    one_line_error(*run_cli(capsys, "pretrain", "gpt", "--data", bpe_shards, "--out", out, "--device", "cpu",
                            "--precision", "fp16")[::2], "--precision fp16 needs a CUDA GPU")
    assert not out.exists()


# -- precision auto ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("flags", "expected"), [("fpu sse2 avx2 fma", "fp32"), ("avx2 avx512f avx512_bf16", "bf16"),
                                                 ("avx2 amx_tile amx_bf16", "bf16")])
def test_precision_auto_follows_the_cpu_flags(tmp_path, monkeypatch, flags, expected):
    info = tmp_path / "cpuinfo"
    info.write_text(f"processor\t: 0\nmodel name\t: Test CPU\nflags\t\t: {flags}\n")
    monkeypatch.setattr(P, "CPUINFO_PATH", str(info))
    monkeypatch.delenv("LMFORGE_CPU_FEATURES", raising=False)  # these flags, not the AVX2 routes
    cpu = torch.device("cpu")
    assert P.resolve_precision("auto", cpu) == expected
    assert P.resolve_precision("fp32", cpu) == "fp32"  # forced, whatever the CPU
    assert P.resolve_precision("bf16", cpu) == "bf16"
    assert f"precision {expected} (auto" in P.describe("auto", expected, cpu)
    with pytest.raises(ConfigError, match="fp16 needs a CUDA GPU"):
        P.resolve_precision("fp16", cpu)


def test_precision_is_printed_and_saved_with_the_run(toy_family, bpe_shards, tmp_path, monkeypatch, capsys):  # noqa: F811
    info = tmp_path / "cpuinfo"
    info.write_text("flags\t\t: avx2 amx_bf16\n")
    monkeypatch.setattr(P, "CPUINFO_PATH", str(info))
    monkeypatch.delenv("LMFORGE_CPU_FEATURES", raising=False)
    common = ["pretrain", toy_family, "--data", bpe_shards, "--set", "max_steps=2", "eval_batches=1"]
    rc, _, err = run_cli(capsys, *common, "--out", tmp_path / "auto")  # the toy is narrow: fp32 wins there
    assert rc == 0 and "precision fp32 (auto: the model's width 32 is below 64" in err
    assert json.loads((tmp_path / "auto" / "train_config.json").read_text())["precision"] == "fp32"
    rc, _, err = run_cli(capsys, *common, "--out", tmp_path / "bf16", "--precision", "bf16")
    assert rc == 0 and "precision bf16 (asked for)" in err
    assert json.loads((tmp_path / "bf16" / "train_config.json").read_text())["precision"] == "bf16"


# -- one run file: model and training keys; the saved config repeats the run -------------------------------------
@pytest.mark.parametrize("suffix", [".toml", ".yaml"])
def test_a_run_file_holds_model_and_training_keys_and_the_saved_config_repeats_the_run(
        toy_family, bpe_shards, tmp_path, capsys, suffix):  # noqa: F811
    run_file = tmp_path / f"run{suffix}"
    if suffix == ".toml":
        run_file.write_text('preset = "tiny"\n[model]\nnum_layers = 1\n[train]\nmax_steps = 3\nlr = 2e-3\n'
                            "eval_batches = 1\n")
    else:
        run_file.write_text("preset: tiny\nnum_layers: 1\nmax_steps: 3\nlr: 2.0e-3\neval_batches: 1\n")  # flat keys
    a, b = tmp_path / "a", tmp_path / "b"
    rc, _, err = run_cli(capsys, "-q", "pretrain", toy_family, "--data", bpe_shards, "--out", a, "--config", run_file,
                         "--set", "seed=5")
    assert rc == 0, err
    saved = json.loads((a / "train_config.json").read_text())
    assert saved["max_steps"] == 3 and saved["lr"] == 2e-3 and saved["seed"] == 5  # file, then --set
    assert saved["model"]["num_layers"] == 1 and saved["model"]["hidden_size"] == 32  # preset, then the file
    rc, _, err = run_cli(capsys, "-q", "pretrain", toy_family, "--data", bpe_shards, "--out", b, "--config",
                         a / "train_config.json")
    assert rc == 0, err
    wa, wb = load_safetensors(a / "model.safetensors"), load_safetensors(b / "model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)  # the same weights
    assert ToyLM.from_pretrained(b).config.num_layers == 1


def test_set_with_another_familys_name_says_which_field_it_is_here(tmp_path, capsys):
    base = ["pretrain", "--data", tmp_path / "none", "--out", tmp_path / "m"]
    one_line_error(*run_cli(capsys, base[0], "bert", *base[1:], "--set", "n_layer=2")[::2],
                   "unknown --set key 'n_layer'", "calls it num_hidden_layers")
    one_line_error(*run_cli(capsys, base[0], "gpt", *base[1:], "--set", "hidden_size=64")[::2], "calls it n_embd")
    one_line_error(*run_cli(capsys, base[0], "elmo", *base[1:], "--set", "n_layer=2")[::2], "calls it num_layers")
    help_text = _subparser("pretrain").format_help()
    assert "num_hidden_layers=4" in help_text and "n_layer=6" in help_text  # each family's own names
    assert "gpt: n_layer n_embd n_head" in help_text


# -- --json and the human summary --------------------------------------------------------------------------------
def test_pretrain_prints_a_summary_or_the_record_as_json(toy_family, bpe_shards, tmp_path, capsys):  # noqa: F811
    common = ["-q", "pretrain", toy_family, "--data", bpe_shards, "--set", "max_steps=2", "eval_batches=1"]
    rc, out, err = run_cli(capsys, *common, "--out", tmp_path / "a")
    assert rc == 0, err
    assert "after 2 steps" in out and "final validation metrics" in out and "--config" in out
    with pytest.raises(json.JSONDecodeError):
        json.loads(out)
    ppl = next(line.split()[-1] for line in out.splitlines() if line.startswith("ppl "))
    assert len(ppl.replace(".", "").lstrip("0")) <= 4  # 4 significant digits
    rc, out, err = run_cli(capsys, *common, "--out", tmp_path / "b", "--json")
    assert rc == 0, err
    record = json.loads(out)
    assert record["step"] == 2 and math.isfinite(record["val"]["loss"]) and record["train_config"]["max_steps"] == 2


def _classify_file(path, n: int, seed: int):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows(n, seed)))
    return path


def test_hold_out_is_seeded_and_stratified():
    labels = ["a"] * 60 + ["b"] * 30 + ["c"] * 10
    data = TaskData("classify", [TextExample(f"text {i}", label=lab) for i, lab in enumerate(labels)],
                    ["a", "b", "c"], "train.csv")
    split = hold_out(data, 0.2, seed=3)
    assert len(split.test) == 20 and len(split.train) == 80 and split.stratified
    counts = {lab: sum(ex.label == lab for ex in split.test.examples) for lab in "abc"}
    assert counts == {"a": 12, "b": 6, "c": 2}  # every class in proportion
    again = hold_out(data, 0.2, seed=3)
    assert [ex.text for ex in again.test.examples] == [ex.text for ex in split.test.examples]  # seeded
    other = hold_out(data, 0.2, seed=4)
    assert [ex.text for ex in other.test.examples] != [ex.text for ex in split.test.examples]
    assert not {ex.text for ex in split.test.examples} & {ex.text for ex in split.train.examples}
    assert "20% of train.csv held out (20 of 100 examples, seed 3, stratified by label)" in split.describe()


def test_finetune_without_test_holds_out_part_of_train_and_predict_shows_the_inputs(bert_dir, tmp_path, capsys):
    train = _classify_file(tmp_path / "train.jsonl", 60, 1)
    run = tmp_path / "run"
    argv = ["finetune", bert_dir, "--task", "classify", "--train", train, "--mode", "frozen", "--epochs", "2",
            "--out", run]
    rc, out, err = run_cli(capsys, *argv)
    assert rc == 0, err
    assert "the test set is 20% of" in out and "(12 of 60 examples, seed 0, stratified by label)" in out
    assert "accuracy" in out and "on 12 test examples (48 trained on)" in out
    assert "epoch 1/" in err  # piped: tqdm's bar is off (disable=None) and the epochs come as plain lines
    with pytest.raises(json.JSONDecodeError):
        json.loads(out)
    rc, out, err = run_cli(capsys, "-q", *argv[:-1], tmp_path / "run2", "--json", "--seed", "1")
    record = json.loads(out)
    assert rc == 0 and record["n_test"] == 12 and record["test"]["seed"] == 1 and record["test"]["stratified"]
    assert 0 <= record["accuracy"] <= 1

    # predict --file: every prediction beside its input
    some = _classify_file(tmp_path / "some.jsonl", 4, 9)
    texts = [json.loads(line)["text"] for line in some.read_text().splitlines()]
    rc, out, _ = run_cli(capsys, "predict", run, "--file", some)
    assert rc == 0 and len(out.splitlines()) == 4
    for line, text in zip(out.splitlines(), texts):
        assert line.split()[0] in ("pos", "neg") and line.endswith(text)
    rc, out, _ = run_cli(capsys, "predict", run, "--file", some, "--json")
    recs = [json.loads(line) for line in out.splitlines()]
    assert [r["text"] for r in recs] == texts and all(r["pred"] in ("pos", "neg") and "probs" in r for r in recs)
    rc, _, _ = run_cli(capsys, "predict", run, "--file", some, "--out", tmp_path / "p.jsonl")
    written = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert [r["text"] for r in written] == texts


def test_finetune_run_config_repeats_the_run_and_set_takes_only_unflagged_keys(bert_dir, tmp_path, capsys):
    train, test = _classify_file(tmp_path / "train.jsonl", 40, 1), _classify_file(tmp_path / "test.jsonl", 16, 2)
    base = ["-q", "finetune", bert_dir, "--train", train, "--test", test]
    rc, _, err = run_cli(capsys, *base, "--task", "classify", "--mode", "frozen", "--epochs", "2", "--set",
                         "dropout=0.3", "--out", tmp_path / "a", "--precision", "fp32")
    assert rc == 0, err
    saved = json.loads((tmp_path / "a" / "config.json").read_text())["transfer"]
    assert saved["dropout"] == 0.3 and saved["precision"] == "fp32" and saved["epochs"] == 2
    rc, _, err = run_cli(capsys, *base, "--config", tmp_path / "a" / "config.json", "--out", tmp_path / "b")
    assert rc == 0, err
    ha = load_safetensors(tmp_path / "a" / "head.safetensors")
    hb = load_safetensors(tmp_path / "b" / "head.safetensors")
    assert all(torch.equal(ha[k], hb[k]) for k in ha)  # task, mode, epochs and dropout came from the file
    one_line_error(*run_cli(capsys, *base, "--task", "classify", "--set", "lr=1e-3", "--out", tmp_path / "c")[::2],
                   "use --lr")
    one_line_error(*run_cli(capsys, *base, "--out", tmp_path / "c")[::2], "give --task")


def test_gpt_train_loss_is_the_task_loss_and_the_auxiliary_lm_loss_is_apart(bpe_tokenizer, tmp_path):
    train = _classify_file(tmp_path / "train.jsonl", 24, 1)
    test = _classify_file(tmp_path / "test.jsonl", 8, 2)
    common = dict(mode="finetune", epochs=1, lr=1e-12, val_fraction=0.0, max_len=32, precision="fp32")
    plain = run_transfer(tiny_gpt(bpe_tokenizer), "classify", train, test, lm_weight=0.0, **common)
    aux = run_transfer(tiny_gpt(bpe_tokenizer), "classify", train, test, lm_weight=0.5, **common)
    # a vanishing lr leaves the weights as they were: the task's loss is the same with and without the LM loss
    assert aux["train_loss"] == pytest.approx(plain["train_loss"], abs=1e-4)
    assert "aux_lm_loss" not in plain and aux["aux_lm_loss"] > 1.0  # near ln(V) for an untrained LM head
    assert aux["aux_lm_loss"] == pytest.approx(math.log(bpe_tokenizer.vocab_size), rel=0.3)


def test_embed_with_the_minilm_reference_warns_about_no_head(capsys):
    rc, out, err = run_cli(capsys, "embed", "He got bit by Python.", "Python is my favorite programming language.",
                           "--word", "python", "--reference", "minilm")
    assert rc == 0, err
    assert "all-MiniLM-L6-v2" in out
    assert "freshly initialised" not in err and "freshly initialised" not in out


def test_no_help_shows_a_literal_percent_pair():
    shown = 0
    for name, parser in _walk(build_parser()):
        text = parser.format_help()
        assert "%%" not in text, name
        shown += 1
    assert shown > 20
    assert "chance 50%)" in _subparser("evaluate", "wic").format_help()


def test_evaluate_lm_prints_a_summary_or_json(bpe_shards, tmp_path, capsys):
    from lmforge.train.pretrain import pretrain, run_configs

    out = tmp_path / "gpt"
    pretrain("gpt", bpe_shards, out, *run_configs("gpt", "tiny", max_steps=1, batch_size=2, eval_batches=1,
                                                   n_positions=32, device="cpu"), progress=False)
    rc, text, err = run_cli(capsys, "-q", "evaluate", "lm", out, "--data", bpe_shards, "--batches", "1")
    assert rc == 0, err
    assert text.startswith(f"{out} on the val split") and "loss " in text and "ppl " in text
    rc, text, err = run_cli(capsys, "-q", "evaluate", "lm", out, "--data", bpe_shards, "--batches", "1", "--json")
    assert json.loads(text)["split"] == "val"


def test_demo_highlights_name_the_machine():
    from lmforge.demo import highlights
    from lmforge.demo.report import machine_line

    line = machine_line("bf16")
    assert f"torch {torch.__version__}" in line and "thread" in line and "bf16" in line and "lmforge" in line
    assert highlights({"corpus": {"_machine": line}})[-1].startswith(f"figures made on {line}")
    assert "another CPU kind" in highlights({"corpus": {"_machine": line}})[-1]


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
