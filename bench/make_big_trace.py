"""Make a large single-rank Kineto trace by tiling a real one in time (realistic event mix).

    python bench/make_big_trace.py SOURCE.json[.gz] OUT.json --mb 500
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path


def tile(source: Path, out: Path, target_mb: float) -> int:
    opener = gzip.open if source.read_bytes()[:2] == b"\x1f\x8b" else open
    with opener(source, "rt") as handle:
        doc = json.load(handle)
    events = doc.pop("traceEvents")
    times = [e["ts"] for e in events if isinstance(e.get("ts"), (int, float))]
    period = (max(times) - min(times)) * 1.01 + 1000.0
    encoded = [json.dumps(e, separators=(",", ":")) for e in events]
    one_copy = sum(len(s) + 1 for s in encoded)
    copies = max(1, int(target_mb * 1e6 / one_copy))
    written = 0
    with open(out, "w") as handle:
        head = json.dumps(doc, separators=(",", ":"))[:-1]
        handle.write(head + ',"traceEvents":[')
        first = True
        for k in range(copies):
            shift = k * period
            for event in events:
                e = dict(event)
                if isinstance(e.get("ts"), (int, float)):
                    e["ts"] = round(e["ts"] + shift, 3)
                for key in ("correlation", "External id"):
                    if isinstance(e.get("args"), dict) and isinstance(e["args"].get(key), int):
                        e["args"] = dict(e["args"], **{key: e["args"][key] + k * 10_000_000})
                if e.get("ph") in ("s", "f") and isinstance(e.get("id"), int):
                    e["id"] += k * 10_000_000
                if isinstance(e.get("name"), str) and e["name"].startswith("ProfilerStep#"):
                    e["name"] = f"ProfilerStep#{k * 100 + int(e['name'][13:] or 0)}"
                handle.write(("" if first else ",") + json.dumps(e, separators=(",", ":")))
                first = False
                written += 1
        handle.write("]}")
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("source", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--mb", type=float, default=500.0)
    args = parser.parse_args()
    count = tile(args.source, args.out, args.mb)
    print(f"{args.out}: {args.out.stat().st_size / 1e6:.0f} MB, {count:,} events")


if __name__ == "__main__":
    main()
