"""``python -m benchmarks.same_result A B``: whether two benchmark results are the same.

``A`` and ``B`` are ``metrics.json`` files or the benchmark directories holding them
(``results/default``). Everything is compared exactly except the ``timings`` key (wall and
CPU seconds, worker count, backend), the processor's name and, when ``--ignore-commit`` is
given, ``provenance.commit`` / ``provenance.uncommitted_changes``; with directories,
``report.md`` is compared byte for byte too. Prints each difference as ``path: a != b``
and exits 1 if there is any, else 0.

Examples
--------
python -m benchmarks.same_result /tmp/cloneA/results/default /tmp/cloneB/results/default
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["differences", "main"]

#: Keys whose values are expected to differ between two runs of the same commit (the
#: processor too: the pinned code paths are there to make the numbers the same on any).
IGNORED: tuple[str, ...] = ("timings", "provenance.cpu_paths.processor")


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Every place where two JSON values differ (exactly; dict keys in sorted order)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            p = f"{path}.{k}" if path else str(k)
            if k not in a or k not in b:
                out.append(f"{p}: only in {'B' if k not in a else 'A'}")
            else:
                out += differences(a[k], b[k], p)
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} items != {len(b)} items"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True))
                for d in differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def _load(p: Path, ignore: tuple[str, ...]) -> dict[str, Any]:
    f = p / "metrics.json" if p.is_dir() else p
    if not f.is_file():
        raise SystemExit(f"{f} not found: pass a metrics.json or a benchmark directory "
                         "(results/<suite>) that holds one.")
    data = json.loads(f.read_text())
    for key in ignore:
        node = data
        *parents, last = key.split(".")
        for k in parents:
            node = node.get(k, {})
        node.pop(last, None)
    return data


def main(argv: list[str] | None = None) -> int:
    """Entry point; exit status 0 when the results agree."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.same_result",
                                description=__doc__.split("\n")[0])
    p.add_argument("a", type=Path)
    p.add_argument("b", type=Path)
    p.add_argument("--ignore-commit", action="store_true",
                   help="also ignore which commit produced each result")
    args = p.parse_args(argv)
    ignore = IGNORED + (("provenance.commit", "provenance.uncommitted_changes")
                        if args.ignore_commit else ())
    diffs = differences(_load(args.a, ignore), _load(args.b, ignore))
    if args.a.is_dir() and args.b.is_dir():
        ra, rb = args.a / "report.md", args.b / "report.md"
        if ra.is_file() and rb.is_file() and ra.read_bytes() != rb.read_bytes():
            diffs.append("report.md: the two files differ (diff them)")
    for d in diffs:
        print(d)
    print(f"{len(diffs)} difference(s) apart from {', '.join(ignore)}")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
