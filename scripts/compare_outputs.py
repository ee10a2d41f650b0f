"""Compare `diagnose` outputs of two versions of tracecliff, job by job.

    python scripts/compare_outputs.py OLD_REPO NEW_REPO JOB_DIR... [--keep-new-keys]

Runs `python -m analyzer diagnose JOB --no-cache --format json` (and html) in each checkout,
then reports, per job, whether the JSON is identical once keys added by the new version are
set aside (new report sections, new rank fields), and lists every value that differs. HTML is
compared byte for byte. Used for the restructuring's before/after evidence.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path


def outputs(repo: Path, job: Path, out: Path, fmt: str) -> Path:
    target = out / f"{job.parent.name}__{job.name}.{fmt}"
    subprocess.run([sys.executable, "-m", "analyzer", "diagnose", str(job), "--no-cache", "--format", fmt,
                    "-o", str(target)], cwd=repo, check=False, capture_output=True)
    return target


def added_keys_removed(old, new):
    """``new`` without the keys ``old`` lacks (recursively in dicts and equal-length lists)."""
    if isinstance(old, dict) and isinstance(new, dict):
        return {k: added_keys_removed(old[k], v) for k, v in new.items() if k in old}
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [added_keys_removed(o, n) for o, n in zip(old, new)]
    return new


def differences(a, b, path="", out=None) -> list[str]:
    out = [] if out is None else out
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                out.append(f"{path}.{k}: {'added' if k not in a else 'removed'}")
            else:
                differences(a[k], b[k], f"{path}.{k}", out)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            differences(x, y, f"{path}[{i}]", out)
    elif a != b:
        out.append(f"{path}: {str(a)[:80]!r} -> {str(b)[:80]!r}")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("jobs", type=Path, nargs="+")
    args = parser.parse_args()
    changed = 0
    with tempfile.TemporaryDirectory() as tmp:
        old_out, new_out = Path(tmp) / "old", Path(tmp) / "new"
        old_out.mkdir()
        new_out.mkdir()
        for job in args.jobs:
            job = job.resolve()
            a = json.loads(outputs(args.old, job, old_out, "json").read_text())
            b_full = json.loads(outputs(args.new, job, new_out, "json").read_text())
            diff = differences(a, added_keys_removed(a, b_full))
            html_same = outputs(args.old, job, old_out, "html").read_bytes() == \
                outputs(args.new, job, new_out, "html").read_bytes()
            changed += bool(diff)
            print(f"{job.parent.name}/{job.name}: JSON {'identical (new keys aside)' if not diff else f'{len(diff)} value(s) differ'}"
                  f", HTML {'identical' if html_same else 'differs'}")
            for line in diff[:8]:
                print("   ", line)
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
