"""Merge duplex benchmark runs made in parts into one report (JSON, markdown, PNG).

    python -m perf.bench_merge part_a.json part_b.json --name duplex_h200 --out perf/results \
        --title "Duplex realtime benchmark, 1x H200, full-random"

A sweep over C can run as several parts (each its own server start, short enough for a
time-limited GPU job), each writing its own JSON; this puts their levels together, sorted by C
(a C present twice keeps the later part), and keeps every part's command, commit, device and
start time.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from perf.bench_plot import plot_levels
from perf.bench_report import render_markdown, write_json

META_KEYS = ("command", "commit", "device", "profile", "workload", "started")


def merge(parts: list[dict[str, Any]]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(meta, levels) of the parts, in order; meta values that differ are joined with ' | '."""
    if not parts:
        raise ValueError("nothing to merge")
    meta = {}
    for key in META_KEYS:
        values = list(dict.fromkeys(str(part[key]) for part in parts if key in part))
        if values:
            meta[key] = " | ".join(values)
    meta["notes"] = list(dict.fromkeys(note for part in parts for note in part.get("notes", [])))
    by_concurrency = {level["summary"]["concurrency"]: level for part in parts for level in part["levels"]}
    return meta, [by_concurrency[c] for c in sorted(by_concurrency)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("parts", nargs="+", type=Path, help="JSON files written by perf.duplex_bench")
    parser.add_argument("--name", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--title", default="Duplex realtime benchmark")
    args = parser.parse_args(argv)
    try:
        meta, levels = merge([json.loads(path.read_text()) for path in args.parts])
    except (OSError, ValueError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / f"{args.name}.json", meta, levels)
    (args.out / f"{args.name}.md").write_text(render_markdown(args.title, meta, levels), encoding="utf-8")
    plot_levels(args.out / f"{args.name}.png", args.title, levels, meta)
    print(f"wrote {args.out / args.name}.json, .md, .png ({len(levels)} levels)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
