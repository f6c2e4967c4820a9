"""Build docs/results/ and the README's results table from the run records in docs/results/records/.

    python scripts/make_results.py            # rewrite docs/results/README.md and the README's table
    python scripts/make_results.py --check    # exit 1 if either is stale (tests/test_docs.py runs this)
    python scripts/make_results.py --add-curve runs/x/curve.json --id ID --title TITLE --headline-what WHAT
                                              # turn a learning curve's curve.json into a record

A record is one JSON file: what was measured (``title``, ``table``), the line it gives the README
(``headline``), the page that shows how to reproduce it (``reproduce``), and where it came from
(``command``, ``commit``, ``date``, ``machine``). Every figure in the results pages comes from a
record; a page is never edited by hand.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ROOT / "docs" / "results" / "records"
PAGE = ROOT / "docs" / "results" / "README.md"
README = ROOT / "README.md"
START, END = "<!-- results:start -->", "<!-- results:end -->"
REQUIRED = ("id", "title", "headline", "reproduce", "command", "commit", "date", "machine", "table")


def load_records(folder: Path = RECORDS) -> list[dict]:
    records = []
    for path in sorted(folder.glob("*.json")):
        record = json.loads(path.read_text(encoding="utf-8"))
        missing = [k for k in REQUIRED if k not in record]
        if missing:
            raise SystemExit(f"{path.relative_to(ROOT)}: missing {', '.join(missing)}")
        if not record["machine"].get("cpu"):
            raise SystemExit(f"{path.relative_to(ROOT)}: machine.cpu is empty (name the CPU beside every figure)")
        records.append(record)
    order = {"en-": 0, "zh-": 1, "wic": 2, "demo": 3, "speed": 4}
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
        rows.append(f"| {head['what']} ([how]({page})) | {head['figure']} | {_machine(r['machine'])} |")
    return "\n".join([START, *rows, END])


def readme_with_block(text: str, block: str) -> str:
    if START not in text or END not in text:
        raise SystemExit(f"README.md needs the markers {START} and {END} where the results table goes")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return head + block + tail


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a generated page is stale")
    ap.add_argument("--add-curve", metavar="CURVE_JSON", help="write a record made from a curve.json first")
    ap.add_argument("--id")
    ap.add_argument("--title")
    ap.add_argument("--headline-what")
    ap.add_argument("--reproduce", default="../transfer.md")
    args = ap.parse_args(argv)
    if args.add_curve:
        if not (args.id and args.title and args.headline_what):
            ap.error("--add-curve needs --id, --title and --headline-what")
        curve = json.loads(Path(args.add_curve).read_text(encoding="utf-8"))
        record = curve_record(curve, args.id, args.title, args.headline_what, args.reproduce)
        path = RECORDS / f"{args.id.replace('-', '_')}.json"
        path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    records = load_records()
    page = render_page(records)
    readme = readme_with_block(README.read_text(encoding="utf-8"), render_readme_block(records))
    if args.check:
        stale = [p.relative_to(ROOT) for p, text in ((PAGE, page), (README, readme))
                 if not p.exists() or p.read_text(encoding="utf-8") != text]
        if stale:
            print(f"stale: {', '.join(map(str, stale))}: run python scripts/make_results.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(page, encoding="utf-8")
    README.write_text(readme, encoding="utf-8")
    print(f"wrote {PAGE.relative_to(ROOT)} ({len(records)} records) and the README's results table")
    return 0


if __name__ == "__main__":
    sys.exit(main())
