"""Write the NCCL-format Flight Recorder dumps in sample_traces/flight_recorder/nccl/ (no GPU
needed): the jobs of analyzer.synth.flight_recorder, each in the format version its scenario
names, as torch's pickle writer (``nccl_trace_rank_<r>``) and, where the version has one, its
JSON writer (``nccl_trace_rank_<r>.json``), with the verdicts in ``expected.json``.

    python scripts/make_nccl_fr_dumps.py
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(REPO_ROOT))

from analyzer.synth.flight_recorder import SCENARIOS, write_scenario  # noqa: E402

OUT = REPO_ROOT / "sample_traces" / "flight_recorder" / "nccl"


def main() -> None:
    expected = {"_about": "Synthetic NCCL-backend Flight Recorder dumps written by scripts/make_nccl_fr_dumps.py "
                          "from analyzer.synth.flight_recorder (the format of torch's FlightRecorder sources, "
                          "version by version); the verdict tracecliff hang must give on each folder."}
    for name in SCENARIOS:
        folder = OUT / name
        if folder.exists():
            shutil.rmtree(folder)
        expected[name] = write_scenario(name, folder)
        print(f"{name}: {sorted(p.name for p in folder.iterdir())}")
    (OUT / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")


if __name__ == "__main__":
    main()
