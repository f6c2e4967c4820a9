"""Build docs/results/ and the README's results table from the run records in docs/results/records/.

    python scripts/make_results.py            # rewrite docs/results/README.md and the README's table
    python scripts/make_results.py --check    # exit 1 if either is stale (tests/test_docs.py runs this)
    python scripts/make_results.py --add-curve runs/x/curve.json --id ID --title TITLE --headline-what WHAT
                                              # turn a learning curve's curve.json into a record
    python scripts/make_results.py --add-demo-time lmforge-demo-quick --id demo-time-quick-xeon
                                              # turn a demo run's demo_state.json into a record of its time
    python scripts/make_results.py --add-bench a.json b.json --id ID [--notes TEXT]
                                              # turn bench JSON (bench_encode_peers.py, bench_serve.py) into a record

A record is one JSON file: what was measured (``title``, ``table``), the line it gives the results page
(``headline``: ``what`` and ``figure``) and, for a README row, one figure (``headline.readme``), the page that
shows how to reproduce it (``reproduce``), and where it came from (``command``, ``commit``, ``date``,
``machine``). A README row needs its machine named. A record of the demo's time (``demo_time``: the plan, its
fingerprint, the seconds) gives the sentence on how long the demo takes in the README and docs/demo.md, one
figure per CPU kind; ``--check`` finds it stale when the plan has changed since. Every figure in the results
pages comes from a record; a page is never edited by hand.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # this checkout's demo plans, whatever lmforge is installed

from lmforge.demo.plan import make_plan  # noqa: E402

RECORDS = ROOT / "docs" / "results" / "records"
PAGE = ROOT / "docs" / "results" / "README.md"
README = ROOT / "README.md"
DEMO_PAGE = ROOT / "docs" / "demo.md"
START, END = "<!-- results:start -->", "<!-- results:end -->"
TIME_START, TIME_END = "<!-- demo-time:start -->", "<!-- demo-time:end -->"
# where the sentence on the demo's time goes, and how each page links the results page
TIME_PAGES = {README: "docs/results/README.md", DEMO_PAGE: "results/README.md"}
PLAN_COMMANDS = {"quick": "lmforge demo --quick", "full": "lmforge demo"}
REQUIRED = ("id", "title", "headline", "reproduce", "command", "commit", "date", "machine", "table")


def load_records(folder: Path = RECORDS) -> list[dict]:
    records = []
    for path in sorted(folder.glob("*.json")):
        record = json.loads(path.read_text(encoding="utf-8"))
        where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        missing = [k for k in REQUIRED if k not in record]
        if missing:
            raise SystemExit(f"{where}: missing {', '.join(missing)}")
        if not record["machine"].get("cpu"):
            raise SystemExit(f"{where}: machine.cpu is empty (name the CPU beside every figure)")
        if record.get("readme", True) and (record["machine"]["cpu"].startswith("not recorded")
                                           or not record["headline"].get("readme")):
            raise SystemExit(f"{where}: a README row needs its machine named and one figure in "
                             'headline.readme; else set "readme": false (the results page keeps it)')
        records.append(record)
    order = {"demo-time": 5, "en-": 0, "zh-": 1, "wic": 2, "demo": 3, "speed": 4}
    return sorted(records, key=lambda r: (next((v for k, v in order.items() if r["id"].startswith(k)), 9), r["id"]))


def _machine(m: dict) -> str:
    threads = m.get("threads")
    return f"{m['cpu']}, {threads} thread{'s' if str(threads) != '1' else ''}" if threads else m["cpu"]


def _table(table: dict) -> list[str]:
    cols = table["columns"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in table["rows"]]
    return lines


def render_page(records: list[dict]) -> str:
    lines = [
        "# Results",
        "",
        "Every figure here comes from a run record in [records/](records/), rendered by",
        "`python scripts/make_results.py`. Each names the command, the commit, the date and the machine",
        "that produced it: figures move between CPU kinds and thread counts, so compare rows only where",
        "the machine is the same. How to reproduce each one is on the page it links.",
        "",
        "| result | figure | machine | commit, date |",
        "|---|---|---|---|",
    ]
    lines += [f"| [{r['headline']['what']}](#{r['id']}) | {r['headline']['figure']} | {_machine(r['machine'])} "
              f"| `{r['commit']}`, {r['date']} |" for r in records]
    for r in records:
        lines += ["", f'<a id="{r["id"]}"></a>', "", f"## {r['title']}", ""]
        lines += _table(r["table"])
        lines += [""]
        if r.get("notes"):
            lines += [r["notes"], ""]
        lines += ["```bash", r["command"], "```", ""]
        source = f" ({r['source']})" if r.get("source") else ""
        lines += [f"Commit `{r['commit']}`, {r['date']}, {_machine(r['machine'])}{source}. "
                  f"How to reproduce: [{Path(r['reproduce']).name}]({r['reproduce']})."]
    return "\n".join(lines).rstrip() + "\n"


def render_readme_block(records: list[dict]) -> str:
    rows = ["| result | figure | machine |", "|---|---|---|"]
    for r in (r for r in records if r.get("readme", True)):  # "readme": false keeps a record to the results page
        page = r["reproduce"].replace("../", "docs/", 1)
        head = r["headline"]
        rows.append(f"| {head['what']} ([how]({page})) | {head['readme']} | {_machine(r['machine'])} |")
    return "\n".join([START, *rows, END])


def readme_with_block(text: str, block: str, start: str = START, end: str = END, page: str = "README.md") -> str:
    if start not in text or end not in text:
        raise SystemExit(f"{page} needs the markers {start} and {end} where the generated text goes")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return head + block + tail


def demo_time_block(records: list[dict], results_page: str) -> str:
    """How long the demo takes, one figure per CPU kind and plan, each linked to its record."""
    timed = [r for r in records if r.get("demo_time")]
    parts = []
    for plan, command in PLAN_COMMANDS.items():
        runs = [r for r in timed if r["demo_time"]["plan"] == plan]
        if runs:
            parts.append(f"`{command}` takes " + "; ".join(
                f"{r['demo_time']['seconds']:g} s on {_machine(r['machine'])} ([record]({results_page}#{r['id']}))"
                for r in runs))
        else:
            parts.append(f"`{command}` has no timed run of its current plan on record; its report.md gives each "
                         "step's time")
    return "\n".join([TIME_START, "How long the demo takes from an empty folder: " + ". ".join(parts) + ".",
                       TIME_END])


def stale_demo_times(records: list[dict]) -> list[str]:
    """The records of the demo's time whose plan has changed since they were measured."""
    return [f"{r['id']} timed the {r['demo_time']['plan']} plan {r['demo_time']['plan_fingerprint']}, which is now "
            f"{make_plan(quick=r['demo_time']['plan'] == 'quick').fingerprint}: rerun "
            f"`{PLAN_COMMANDS[r['demo_time']['plan']]}` into an empty folder and record it with "
            "scripts/make_results.py --add-demo-time DIR --id ID"
            for r in records if r.get("demo_time")
            and make_plan(quick=r["demo_time"]["plan"] == "quick").fingerprint != r["demo_time"]["plan_fingerprint"]]


_MACHINE_LINE = re.compile(r"^(?P<cpu>.*?), (?P<threads>\d+) threads?, .*?lmforge (?:commit )?(?P<commit>\S+)$")


def demo_time_record(folder: Path, rid: str) -> dict:
    """A record of the time a demo run took, from its folder's demo_state.json (each step's time when built)."""
    path = folder / "demo_state.json"
    state = json.loads(path.read_text(encoding="utf-8"))
    date = _dt.datetime.fromtimestamp(path.stat().st_mtime, _dt.timezone.utc).strftime("%Y-%m-%d")
    infos = [v["info"] for v in state.values()]
    report = state.get("report", {}).get("info", {})
    if "plan_fingerprint" not in report:
        raise SystemExit(f"{folder}: no finished demo run of this version (its report step names no plan)")
    machines = {i.get("_machine") for i in infos}
    if len(machines) != 1:
        raise SystemExit(f"{folder}: its steps were built on {len(machines)} machines or runs; time one run "
                         "into an empty folder")
    match = _MACHINE_LINE.match(machines.pop() or "")
    if not match:
        raise SystemExit(f"{folder}: the steps' machine line does not name a CPU and threads")
    plan, seconds = report["plan"], round(sum(i.get("_seconds", 0.0) for i in infos), 1)
    return {
        "id": rid, "title": f"How long `{PLAN_COMMANDS[plan]}` takes from an empty folder",
        "headline": {"what": f"`{PLAN_COMMANDS[plan]}` from an empty folder", "figure": f"{seconds:g} s"},
        "reproduce": "../demo.md", "command": PLAN_COMMANDS[plan], "commit": match["commit"], "date": date,
        "machine": {"cpu": match["cpu"], "threads": int(match["threads"])},
        "source": "run record: demo_state.json (each step's time when built, summed)",
        "demo_time": {"plan": plan, "plan_fingerprint": report["plan_fingerprint"], "seconds": seconds},
        "table": {"columns": ["step", "seconds"],
                  "rows": [[k, f"{v['info'].get('_seconds', 0.0):.1f}"] for k, v in state.items()]},
        "readme": False,
    }


def curve_record(curve: dict, rid: str, title: str, what: str, reproduce: str) -> dict:
    """A record from a learning curve's curve.json (which carries its own provenance)."""
    prov = curve.get("provenance") or {}
    modes, sizes = curve["modes"], curve["sizes"]
    rows = []
    for n in sizes:
        row = [str(n)]
        for mode in modes:
            s = curve["summary"].get(mode, {}).get(str(n)) or curve["summary"].get(mode, {}).get(n)
            row.append(" / ".join(f"{x:.3f}" for x in s["scores"]) + f" = {s['mean']:.3f}" if s else "–")
        rows.append(row)
    best = max(modes[1:], key=lambda m: curve["summary"][m][str(sizes[-1])]["mean"]) if len(modes) > 1 else modes[0]
    lead = curve["summary"][best][str(sizes[-1])]["mean"] - curve["summary"][modes[0]][str(sizes[-1])]["mean"]
    return {
        "id": rid, "title": title,
        "headline": {"what": what, "figure": f"{best} {lead * 100:+.1f} points over {modes[0]} at {sizes[-1]} labels"},
        "reproduce": reproduce,
        "command": prov.get("command", ""), "commit": prov.get("commit", "unknown"), "date": prov.get("date", ""),
        "machine": {"cpu": prov.get("machine", {}).get("cpu", ""), "threads": prov.get("machine", {}).get("threads")},
        "source": "run record (curve.json)",
        "notes": f"{curve['metric']} per seed (seeds {', '.join(str(s) for s in curve.get('seeds', []))}) = mean.",
        "table": {"columns": ["labels", *modes], "rows": rows},
    }


_FLAGS = {"avx512f": "AVX-512", "avx512_bf16": "AVX512-BF16", "amx_bf16": "AMX"}


def _cpu(m: dict) -> str:
    """The CPU as the records name it, e.g. ``Intel(R) Xeon(R) Processor (2 cores, AVX-512, AVX512-BF16, AMX)``."""
    parts = [f"{m['cores']} cores"] if m.get("cores") else []
    parts += [name for flag, name in _FLAGS.items() if flag in m.get("cpu_flags", [])]
    return f"{m['cpu']} ({', '.join(parts)})" if parts else m["cpu"]


def _load(bench: dict) -> str:
    load = bench.get("load_average")
    if not load:
        return "load average not recorded"
    return f"load average {load['start'][0]:.1f} at the start, {load['end'][0]:.1f} at the end"


def _model_name(bench: dict) -> str:
    model = bench["settings"].get("model")
    return "all-MiniLM-L6-v2" if model in (None, "minilm") else str(model)


def encode_peers_rows(bench: dict) -> list[list[str]]:
    """One row per thread count of a bench/bench_encode_peers.py record."""
    rows = []
    for threads, r in bench["threads"].items():
        tps, fid = r["texts_per_s"], r["fidelity"]
        exact_st = max(v for k, v in tps.items() if k.startswith("st") and "int8" not in k)
        int8 = tps.get("lmforge onnx int8")
        rows.append([_model_name(bench), str(threads), f"{tps['st torch']:.1f}",
                     *(f"{tps[k]:.1f}" for k in ("lmforge torch", "lmforge onnx", "lmforge auto")),
                     f"{int8:.1f}" if int8 else "–", f"{r['exact_ratio']:.2f}x",
                     f"{int8 / exact_st:.2f}x" if int8 else "–",
                     f"{fid['lmforge onnx int8'][1]:.4f}" if int8 else "–"])
    return rows


def serve_embeddings_rows(bench: dict) -> list[list[str]]:
    """One row per backend and concurrency of a ``bench/bench_serve.py --route embeddings`` record."""
    return [[_model_name(bench), r["backend"], str(r["clients"]), f"{r['texts_per_s']:.1f}", f"{r['p50_ms']:.1f}",
             f"{r['p99_ms']:.1f}", f"{r['p99_over_p50']:.2f}", f"{r['passes_per_request']:.2f}"]
            for r in bench["rows"]]


BENCH_KINDS = {
    "encode_peers": {
        "title": "lmforge encode against sentence-transformers on the same model and texts",
        "what": "Sentence vectors per second, lmforge encode vs sentence-transformers (CPU; exact and int8)",
        "reproduce": "../vectors.md",
        "columns": ["model", "threads", "st torch texts/s", "lmforge torch", "lmforge onnx", "lmforge auto",
                    "lmforge int8", "fastest exact / st (target 1.3x)", "int8 / st fastest exact",
                    "int8 worst cosine"],
        "rows": encode_peers_rows,
    },
    "serve_embeddings": {
        "title": "/v1/embeddings of lmforge serve per backend at 1 and 8 concurrent clients",
        "what": "/v1/embeddings texts/s and p50/p99 latency per backend at 1 and 8 clients (in-process)",
        "reproduce": "../serve.md",
        "columns": ["model", "backend", "clients", "texts/s", "p50 ms", "p99 ms", "p99 / p50 (target < 2 at 8)",
                    "forward passes / request"],
        "rows": serve_embeddings_rows,
    },
}


def _headline(kind: str, benches: list[dict]) -> str:
    if kind == "encode_peers":  # one range per model: a model's figures are not another's
        ranges = []
        for b in benches:
            ratios = [r["exact_ratio"] for r in b["threads"].values()]
            ranges.append(f"{_model_name(b)} {min(ratios):.2f}-{max(ratios):.2f}x")
        return f"fastest exact mode / sentence-transformers: {', '.join(ranges)} (target 1.3x)"
    tails = {r["backend"]: r["p99_over_p50"] for b in benches for r in b["rows"] if r["clients"] == 8}
    return "p99 / p50 at 8 clients: " + ", ".join(f"{k} {v:.2f}" for k, v in tails.items()) + " (target under 2)"


def bench_record(paths: list[Path], rid: str, notes: str = "") -> dict:
    """A record from the JSON of bench/bench_encode_peers.py or ``bench/bench_serve.py --route embeddings`` runs
    (one or more of the same bench, e.g. two models): their rows side by side, the machine, the load."""
    benches = [json.loads(Path(p).read_text(encoding="utf-8")) for p in paths]
    kinds = {b.get("bench") for b in benches}
    if len(kinds) != 1 or not kinds <= set(BENCH_KINDS):
        raise SystemExit(f"--add-bench takes records of one of {', '.join(BENCH_KINDS)}; got {sorted(map(str, kinds))}")
    kind = kinds.pop()
    spec = BENCH_KINDS[kind]
    machines = {_cpu(b["provenance"]["machine"]) for b in benches}
    if len(machines) != 1:
        raise SystemExit(f"the bench records come from {len(machines)} machines; one record per machine")
    threads = sorted({str(t) for b in benches for t in (b["threads"] if kind == "encode_peers"
                                                          else [b["settings"]["threads"]])})
    where = "; ".join(f"{_model_name(b)}: {_load(b)}, {Path(p).as_posix()}" for p, b in zip(paths, benches))
    return {
        "id": rid, "title": spec["title"],
        "headline": {"what": spec["what"], "figure": _headline(kind, benches)},
        "readme": False, "reproduce": spec["reproduce"],
        "command": "\n".join(b["provenance"]["command"] for b in benches),
        "commit": benches[0]["provenance"]["commit"],
        "date": max(b["provenance"]["date"] for b in benches),
        "machine": {"cpu": machines.pop(), "threads": " and ".join(threads)},
        "source": "bench records (JSON)",
        "notes": (notes + " " if notes else "") + f"Bench JSON and machine load: {where}.",
        "table": {"columns": spec["columns"], "rows": [row for b in benches for row in spec["rows"](b)]},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a generated page is stale")
    ap.add_argument("--add-curve", metavar="CURVE_JSON", help="write a record made from a curve.json first")
    ap.add_argument("--id")
    ap.add_argument("--title")
    ap.add_argument("--headline-what")
    ap.add_argument("--reproduce", default="../transfer.md")
    ap.add_argument("--add-demo-time", metavar="DEMO_DIR", help="write a record of a demo run's time first")
    ap.add_argument("--add-bench", metavar="BENCH_JSON", nargs="+",
                    help="write a record made from bench JSON (bench_encode_peers.py, bench_serve.py) first")
    ap.add_argument("--notes", default="", help="--add-bench: what the record's notes say before the load")
    args = ap.parse_args(argv)
    if args.add_bench:
        if not args.id:
            ap.error("--add-bench needs --id")
        record = bench_record([Path(p) for p in args.add_bench], args.id, args.notes)
        (RECORDS / f"{args.id.replace('-', '_')}.json").write_text(json.dumps(record, indent=2) + "\n",
                                                                    encoding="utf-8")
    if args.add_demo_time:
        if not args.id:
            ap.error("--add-demo-time needs --id")
        record = demo_time_record(Path(args.add_demo_time), args.id)
        (RECORDS / f"{args.id.replace('-', '_')}.json").write_text(json.dumps(record, indent=2) + "\n",
                                                                    encoding="utf-8")
    if args.add_curve:
        if not (args.id and args.title and args.headline_what):
            ap.error("--add-curve needs --id, --title and --headline-what")
        curve = json.loads(Path(args.add_curve).read_text(encoding="utf-8"))
        record = curve_record(curve, args.id, args.title, args.headline_what, args.reproduce)
        path = RECORDS / f"{args.id.replace('-', '_')}.json"
        path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    records = load_records()
    pages = {PAGE: render_page(records),
             README: readme_with_block(README.read_text(encoding="utf-8"), render_readme_block(records))}
    for page, link in TIME_PAGES.items():
        text = pages.get(page) or page.read_text(encoding="utf-8")
        pages[page] = readme_with_block(text, demo_time_block(records, link), TIME_START, TIME_END,
                                        str(page.relative_to(ROOT)))
    if args.check:
        stale = [str(p.relative_to(ROOT)) for p, text in pages.items()
                 if not p.exists() or p.read_text(encoding="utf-8") != text]
        if stale:
            print(f"stale: {', '.join(stale)}: run python scripts/make_results.py", file=sys.stderr)
        for line in stale_demo_times(records):
            print(f"stale: {line}", file=sys.stderr)
        return 1 if stale or stale_demo_times(records) else 0
    for p, text in pages.items():
        p.write_text(text, encoding="utf-8")
    print(f"wrote {PAGE.relative_to(ROOT)} ({len(records)} records), the README's results table and the demo's "
          f"time in {', '.join(str(p.relative_to(ROOT)) for p in TIME_PAGES)}")
    for line in stale_demo_times(records):
        print(f"stale: {line}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
