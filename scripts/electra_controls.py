"""ELECTRA on equal terms: the recipe controls against an MLM BERT, one fixed-step run at a time, into a record.

For one benchmark (en-tweets, zh-sentiment or zh-ner), in the folder ``--work``:

1. the benchmark's text, a WordPiece tokenizer and shards (or ``--shards``: existing ones);
2. the references, each planned by ``--budget 15m --search-shape`` as in the ``*_electra_vs_bert_15m`` records:
   BERT (MLM only, ``next_sentence=false``) and ELECTRA with its defaults (or ``--bert`` / ``--electra``: those runs);
   BERT is replayed with its steps scaled to ELECTRA's CPU seconds where the two plans missed equal time by over
   10 % (``bert-eq``): that BERT is the reference of the table;
3. the controls, each a fixed-step replay of ELECTRA's plan (its ``train_config.json``) with one change:

   * ``bert-optimizer``: BERT's optimizer and schedule (``lr``, ``schedule``, ``min_lr_ratio``, ``warmup_steps``,
     ``weight_decay``, ``beta1``, ``beta2``, ``eps``, read from BERT's ``train_config.json``);
   * ``bert-steps``: BERT's step count (and so more CPU time than BERT: the record says how much);
   * ``lr-<x>`` for each ``--lr-grid`` value (as many trials as BERT's recipe had; three by default, the
     from-scratch baseline's number): the one with the best final validation ``--select`` (ELECTRA's own
     signal: ``rtd_auc`` by default, or ``loss``) is the "lr chosen" control;
   * every ``--variant NAME:key=value,...`` (a recipe search: ``generator_size_divisor``,
     ``discriminator_weight``, ``warmup_steps``, ``discriminator_bias_init``, ...);

4. each model's learning curve, right after its pretraining, with ``lmforge benchmark curve`` on the test
   partition (``--sizes``, seeds 0 1 2) and ``scripts/heldout_curve.py`` on held-out training-side examples
   (seeds 0-4), modes frozen, features and finetune (BERT's also scratch with ``--scratch``);
5. the record ``docs/results/records/<bench>_electra_controls_15m.json`` (``--record``), rewritten after each
   model's curves: the best mode of each model at each size with every seed, each run's steps, CPU seconds, final
   ``token_cos`` / ``rtd_auc``, and every command run, in order.

Runs go one at a time at ``OMP_NUM_THREADS=--threads`` (1 by default, as the 15-minute records).  A step whose
output is complete is skipped, so the same command continues a stopped script; ``--dry-run`` prints the commands.

    python scripts/electra_controls.py en-tweets --work runs/ctl-tweets
    python scripts/electra_controls.py zh-ner --work runs/ctl-ner --shards runs/ner/shards-zh --bert runs/ner/bert15
    python scripts/electra_controls.py zh-sentiment --work runs/ctl-zs --variant gen2:generator_size_divisor=2
    python scripts/electra_controls.py en-tweets --work /tmp/ctl-smoke --smoke   # a few steps each: the plumbing
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import resource
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ROOT / "docs" / "results" / "records"
# the optimizer and schedule keys the bert-optimizer control copies from BERT's run
OPTIMIZER_KEYS = ("lr", "schedule", "min_lr_ratio", "warmup_steps", "weight_decay", "beta1", "beta2", "eps")
# the model keys of ELECTRA's recipe each run states in the record (a variant changes them)
RECIPE_KEYS = ("generator_size_divisor", "discriminator_weight", "discriminator_bias_init")
TASKS = {"en-tweets": "classify", "zh-sentiment": "classify", "zh-ner": "tokens"}
TITLES = {"en-tweets": "English tweet sentiment (accuracy)", "zh-sentiment": "Chinese review sentiment (accuracy)",
          "zh-ner": "Chinese NER, People's Daily (entity F1)"}
MODES = ["frozen", "features", "finetune"]
# --smoke: a few steps of a tiny model and one small curve, to check the plumbing only (never a result)
SMOKE_PRETRAIN = ["--config", "tiny", "--set", "max_steps=4", "batch_size=4", "max_seq_length=32",
                  "eval_batches=1", "eval_every=2", "warmup_steps=1", "save_every=0"]


class Runner:
    """Runs the commands one at a time, logging each (and its CPU seconds) for the record."""

    def __init__(self, work: Path, threads: int, dry_run: bool):
        self.work, self.dry_run = work, dry_run
        self.env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT / "src")}
        self.threads = threads
        self.log_path = work / "commands.jsonl"
        self.done = _read_jsonl(self.log_path)

    def run(self, argv: list[str], output: Path) -> None:
        """Run ``argv`` unless ``output`` exists (a step done earlier); record its CPU seconds."""
        line = f"OMP_NUM_THREADS={self.threads} " + _shown(argv)
        if output.exists():
            return
        print(("would run: " if self.dry_run else "+ ") + line, file=sys.stderr, flush=True)
        if self.dry_run:
            return
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.monotonic()
        subprocess.run(argv, cwd=self.work, env=self.env, check=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        entry = {"command": line, "output": self.rel(output), "wall_s": round(time.monotonic() - t0, 1),
                 "cpu_s": round(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, 1)}
        self.done.append(entry)
        with open(self.log_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")

    def cpu_seconds(self, output: Path) -> float | None:
        hits = [e["cpu_s"] for e in self.done if e["output"] == self.rel(output)]
        return hits[-1] if hits else None

    def rel(self, path: Path) -> str:
        """``path`` as the commands name it: relative inside the work folder (where they run), else absolute."""
        path = path.resolve()
        return str(path.relative_to(self.work)) if path.is_relative_to(self.work) else str(path)


def _shown(argv: list[str]) -> str:
    """The command as a user types it: ``lmforge ...``, ``python scripts/...``, paths in the work folder relative."""
    if argv[:3] == [sys.executable, "-m", "lmforge.cli"]:
        return shlex.join(["lmforge", *argv[3:]])
    return shlex.join(["python", str(Path(argv[1]).relative_to(ROOT)), *argv[2:]])


def _read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]


def _lmforge(*args: str) -> list[str]:
    return [sys.executable, "-m", "lmforge.cli", *args]


def _train_config(model: Path) -> dict:
    return json.loads((model / "train_config.json").read_text(encoding="utf-8"))


def _last_val(model: Path) -> dict:
    """The last validation event's metrics (with ``loss``) of a model folder."""
    events = [e for e in _read_jsonl(model / "metrics.jsonl") if e.get("split") == "val"]
    return {"loss": events[-1]["loss"], **events[-1]["metrics"]} if events else {}


def prepare_data(r: Runner, bench: str, shards: Path | None) -> Path:
    """The shards: given, or made here from the benchmark's text with a WordPiece tokenizer (as the records)."""
    if shards is not None:
        return shards.resolve()
    layout = ["--layout", "lines"] if bench == "en-tweets" else []
    r.run(_lmforge("benchmark", "text", bench, "--out", "text.txt"), r.work / "text.txt")
    r.run(_lmforge("tokenizer", "train", "--kind", "wordpiece", "--vocab-size", "8000", "--out", "tok", "text.txt"),
          r.work / "tok")
    r.run(_lmforge("prepare", "--tokenizer", "tok", "--out", "shards", *layout, "text.txt"), r.work / "shards")
    return r.work / "shards"


def references(r: Runner, shards: Path, args) -> tuple[Path, Path]:
    """BERT (MLM) and ELECTRA as their 15-minute plans make them (or the runs given)."""
    plan = SMOKE_PRETRAIN if args.smoke else ["--budget", args.budget, "--search-shape"]
    bert = args.bert.resolve() if args.bert else r.work / "bert"
    electra = args.electra.resolve() if args.electra else r.work / "electra"
    if not args.bert:
        r.run(_lmforge("pretrain", "bert", "--data", r.rel(shards), "--out", "bert", *plan, "--precision", "fp32",
                       "--set", "next_sentence=false"), bert / "model.safetensors")
    if not args.electra:
        r.run(_lmforge("pretrain", "electra", "--data", r.rel(shards), "--out", "electra", *plan, "--precision",
                       "fp32"), electra / "model.safetensors")
    return bert, electra


def equal_cpu_bert(r: Runner, shards: Path, bert: Path, electra: Path) -> Path:
    """BERT replayed at ELECTRA's CPU seconds when the two planned runs' differ by over 10 %: each planner probes a
    machine the other run may share, so the plans can miss equal time.  The steps scale by the CPU ratio."""
    b, e = r.cpu_seconds(bert / "model.safetensors"), r.cpu_seconds(electra / "model.safetensors")
    if b is None or e is None or abs(b / e - 1) <= 0.1:
        return bert
    steps = round(_train_config(bert)["max_steps"] * e / b)
    return replay(r, "bert", shards, bert, "bert-eq", {"max_steps": steps})


def replay(r: Runner, family: str, shards: Path, source: Path, name: str, changes: dict) -> Path:
    """A fixed-step run of ``source``'s plan (its ``train_config.json``) with ``changes``, into ``work/name``."""
    folder = r.work / name
    r.run(_lmforge("pretrain", family, "--data", r.rel(shards), "--out", folder.name, "--config",
                   r.rel(source / "train_config.json"), "--precision", "fp32", "--set", *_sets(changes)),
          folder / "model.safetensors")
    return folder


def _sets(changes: dict) -> list[str]:
    return [f"{k}={v}" for k, v in changes.items()]


def control_runs(r: Runner, bert: Path, electra: Path, args) -> dict[str, dict]:
    """Each control's changes to ELECTRA's plan: ``{name: changes}``, in the order they run."""
    known = not r.dry_run or (bert / "train_config.json").is_file() and (electra / "train_config.json").is_file()
    bert_cfg = _train_config(bert) if known else {k: "<BERT's>" for k in (*OPTIMIZER_KEYS, "max_steps")}
    every = {
        "bert-optimizer": {k: bert_cfg[k] for k in OPTIMIZER_KEYS},
        "bert-steps": {"max_steps": bert_cfg["max_steps"]},
        **{f"lr-{x:g}": {"lr": x} for x in args.lr_grid},
    }
    wanted = [n for n in every if n in args.controls or (n.startswith("lr-") and "lr-grid" in args.controls)]
    return {**{n: every[n] for n in wanted}, **{name: changes for name, changes in args.variant}}


def train_control(r: Runner, shards: Path, electra: Path, name: str, changes: dict) -> Path:
    """A fixed-step replay of ELECTRA's plan with ``changes``; the grid's trial at ELECTRA's own lr is that run."""
    own_lr = _train_config(electra)["lr"] if (electra / "train_config.json").is_file() else None
    if name.startswith("lr-") and changes["lr"] == own_lr:
        return electra
    return replay(r, "electra", shards, electra, f"electra-{name}", changes)


def choose_lr(trials: dict[str, Path], args) -> str | None:
    """The grid's trial with the best final validation ``args.select`` (lower loss, higher AUC)."""
    done = [n for n, folder in trials.items() if (folder / "metrics.jsonl").is_file()]
    if not done:
        return None
    sign = -1.0 if args.select == "loss" else 1.0
    return max(done, key=lambda n: sign * _last_val(trials[n]).get(args.select, float("-inf") * sign))


def curves(r: Runner, bench: str, model: Path, name: str, args) -> tuple[Path, Path]:
    """The learning curve on the test partition and on held-out training-side examples."""
    modes = (["scratch"] if name == "bert" and args.scratch else []) + MODES
    test, held = r.work / f"curve-{name}", r.work / f"heldout-{name}"
    sizes = [str(n) for n in args.sizes]
    small = ["--n-test", "50", "--pool", "300", "--seeds", "0"] if args.smoke else ["--seeds", "0", "1", "2"]
    r.run(_lmforge("benchmark", "curve", bench, r.rel(model), "--sizes", *sizes, "--max-len", "64", "--modes", *modes,
                   "--precision", "fp32", *small, "--out", test.name), test / "curve.json")
    pool = ["--pool", "300", "--held", "100", "--seeds", "0"] if args.smoke else []  # else seeds 0-4
    r.run([sys.executable, str(ROOT / "scripts" / "heldout_curve.py"), bench, r.rel(model), "--out", held.name,
           "--sizes", *sizes, "--modes", *modes, *pool], held / "curve.json")
    return test / "curve.json", held / "curve.json"


def best_cell(curve: dict, size: int, modes: list[str]) -> tuple[str, float, str]:
    """(mode, mean, "a / b / c = mean (mode)") of the best pretrained mode at ``size``, every seed shown."""
    cells = [(m, curve["summary"][m][str(size)]) for m in modes if str(size) in curve["summary"].get(m, {})]
    mode, s = max(cells, key=lambda c: c[1]["mean"])
    return mode, s["mean"], " / ".join(f"{x:.3f}" for x in s["scores"]) + f" = {s['mean']:.3f} ({mode})"


def _row_cells(curves_by_model: dict[str, dict], size: int) -> list[tuple[str, float, str]]:
    return [best_cell(c, size, MODES) for c in curves_by_model.values()]


def table(models: dict[str, dict], sizes: list[int]) -> dict:
    """Rows: each size on the test partition, then held out; columns: each model's best mode, then each ELECTRA
    model's difference from BERT's best mode."""
    names = list(models)
    cols = ["labels", *names, *(f"{n} − bert" for n in names[1:])]
    rows = []
    for which, label in (("test", "{n}"), ("held", "{n}, held-out")):
        by_model = {n: json.loads(models[n][which].read_text(encoding="utf-8")) for n in names}
        for n in sizes:
            cells = _row_cells(by_model, n)
            diffs = [f"{100 * (c[1] - cells[0][1]):+.1f}" for c in cells[1:]]
            rows.append([label.format(n=n), *(c[2] for c in cells), *diffs])
    return {"columns": cols, "rows": rows}


def _bert_note(folder: Path) -> str:
    if folder.name != "bert-eq":
        return ""
    return ("BERT is its planned run replayed with its steps scaled to ELECTRA's CPU seconds: the two planners, each "
            "probing a machine the other run shared, missed equal time by over 10 %. ")


def _mean(cell: str) -> str:
    """``0.501 (frozen)`` from ``a / b / c = 0.501 (frozen)``."""
    return cell.split(" = ")[1]


def _run_facts(name: str, folder: Path, r: Runner) -> str:
    cfg, val = _train_config(folder), _last_val(folder)
    cpu = r.cpu_seconds(folder / "model.safetensors")
    diag = ", ".join(f"{k} {val[k]:.3f}" for k in ("token_cos", "rtd_auc") if k in val)
    shape = cfg.get("model", {})
    recipe = "".join(f", {k} {shape[k]:g}" for k in RECIPE_KEYS if k in shape)  # ELECTRA's own knobs
    return (f"{name}: {cfg['max_steps']:,} steps of {shape.get('num_hidden_layers')}x{shape.get('hidden_size')}"
            f" at lr {cfg['lr']:g} ({cfg['schedule']}, min_lr_ratio {cfg['min_lr_ratio']:g}, warm-up"
            f" {cfg['warmup_steps']}{recipe})" + (f", {cpu:,.0f} CPU s" if cpu is not None else "")
            + (f"; final validation {diag}" if diag else ""))


def write_record(path: Path, bench: str, models: dict[str, dict], chosen: str | None, r: Runner, args) -> None:
    tab = table(models, args.sizes)
    last = args.sizes[-1]
    row = tab["rows"][len(args.sizes) - 1]
    best = max(range(2, len(models) + 1), key=lambda i: float(row[i].split(" = ")[1].split()[0]))
    facts = "; ".join(_run_facts(n, m["dir"], r) for n, m in models.items())
    record = {
        "id": f"{bench}-electra-controls-15m",
        "title": f"ELECTRA's recipe controls against MLM-only BERT at equal CPU time, 15 minutes of one core: "
                 f"{TITLES[bench]}",
        "headline": {"what": f"ELECTRA's recipe controls vs BERT (MLM), 15 minutes of one core each, {last} labels",
                     "figure": f"best ELECTRA {tab['columns'][best]}: {_mean(row[best])} vs BERT {_mean(row[1])} "
                               f"({row[best - 1 + len(models)]} points)"},
        "readme": False,
        "reproduce": "../electra.md",
        "command": "\n".join(e["command"] for e in r.done),
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                 text=True).stdout.strip() or "unknown",
        "date": _dt.date.today().isoformat(),
        "machine": {"cpu": _cpu_name(), "threads": r.threads},
        "source": "scripts/electra_controls.py: each run's train_config.json, metrics.jsonl and curve.json, and "
                  "commands.jsonl (CPU seconds of each command)",
        "notes": (f"Best mode of frozen / features / finetune per model, seeds 0 / 1 / 2 = mean on the test partition,"
                  f" seeds 0-4 on held-out training-side examples. lr chosen from the grid by the final validation "
                  f"{args.select}: {chosen or 'none'}. {_bert_note(models['bert']['dir'])}Runs: {facts}."),
        "table": tab,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    tmp.replace(path)  # atomic: a record is complete or absent
    print(f"wrote {path}", file=sys.stderr)


def _cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").is_file() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _variant(text: str) -> tuple[str, dict]:
    name, sep, body = text.partition(":")
    if not sep or not name or "=" not in body:
        raise argparse.ArgumentTypeError(f"give NAME:key=value,... (e.g. gen2:generator_size_divisor=2), not {text!r}")
    return name, dict(kv.split("=", 1) for kv in body.split(","))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bench", choices=list(TASKS))
    ap.add_argument("--work", type=Path, required=True, help="folder of every run, curve and commands.jsonl")
    ap.add_argument("--shards", type=Path, help="existing shards (else made from the benchmark's text)")
    ap.add_argument("--bert", type=Path, help="an existing BERT run on these shards (else one --budget run)")
    ap.add_argument("--electra", type=Path, help="an existing ELECTRA run whose plan the controls replay")
    ap.add_argument("--budget", default="15m")
    ap.add_argument("--lr-grid", nargs="+", type=float, default=[5e-4, 1e-3, 2e-3],
                    help="the lr trials (ELECTRA's own lr reuses its reference run)")
    ap.add_argument("--select", choices=["loss", "rtd_auc"], default="rtd_auc",
                    help="how the lr grid's trial is chosen: the detector's AUC (the default), or ELECTRA's loss, "
                         "which is mostly the generator's and favours a higher lr that the detector does not")
    ap.add_argument("--controls", nargs="*", default=["bert-optimizer", "bert-steps", "lr-grid"],
                    choices=["bert-optimizer", "bert-steps", "lr-grid"], help="which controls, in this order")
    ap.add_argument("--scratch", action="store_true", help="BERT's curves also score the from-scratch baseline")
    ap.add_argument("--variant", action="append", type=_variant, default=[], help="NAME:key=value,...")
    ap.add_argument("--sizes", nargs="+", type=int, default=[100, 300])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--record", type=Path, help="the record to write (default docs/results/records/...)")
    ap.add_argument("--smoke", action="store_true", help="a few steps each: checks the plumbing, writes no record")
    ap.add_argument("--dry-run", action="store_true", help="print the commands still to run")
    args = ap.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    r = Runner(args.work.resolve(), args.threads, args.dry_run)
    shards = prepare_data(r, args.bench, args.shards)
    bert, electra = references(r, shards, args)
    if not args.bert and not r.dry_run:
        bert = equal_cpu_bert(r, shards, bert, electra)
    record = args.record or RECORDS / f"{args.bench.replace('-', '_')}_electra_controls_15m.json"
    if args.smoke and args.record is None:
        record = r.work / "record.json"  # a smoke run's figures are no result: never into docs/results
    models: dict[str, dict] = {}
    state = {"chosen": None}

    def add(name: str, folder: Path) -> None:
        """Each model's curves right after its pretraining, and the record rewritten with what is done so far."""
        same = next((m for m in models.values() if m["dir"] == folder), None)
        test, held = (same["test"], same["held"]) if same else curves(r, args.bench, folder, name.split()[0], args)
        models[name] = {"dir": folder, "test": test, "held": held}
        if not r.dry_run and len(models) > 1:
            write_record(record, args.bench, models, state["chosen"], r, args)

    add("bert", bert)
    add("electra", electra)
    trials = {}
    for name, changes in control_runs(r, bert, electra, args).items():
        folder = train_control(r, shards, electra, name, changes)
        if not name.startswith("lr-"):
            add(f"electra-{name}", folder)
            continue
        trials[name] = folder
        if len(trials) == len(args.lr_grid) and not r.dry_run:
            state["chosen"] = choose_lr(trials, args)
            add(f"electra-{state['chosen']} (chosen)", trials[state["chosen"]])
    return 0


if __name__ == "__main__":
    sys.exit(main())
