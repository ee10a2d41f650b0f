"""docs/notebook.ipynb runs top to bottom in a fresh kernel (nbclient) and shows what it says:
the inline summary, the DataFrames, the plot of exposed communication per step, the findings."""

import re
from pathlib import Path

import nbclient
import nbformat
import pytest

from conftest import REPO

NOTEBOOK = REPO / "docs" / "notebook.ipynb"


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    home = tmp_path_factory.mktemp("jupyter")
    patch = pytest.MonkeyPatch()
    # keep the kernel's files out of $HOME; the plot goes through the notebook's inline (Agg) backend
    patch.setenv("IPYTHONDIR", str(home / "ipython"))
    patch.setenv("JUPYTER_RUNTIME_DIR", str(home / "runtime"))
    patch.setenv("PYTHONPATH", str(REPO))
    patch.delenv("MPLBACKEND", raising=False)
    nb = nbformat.read(NOTEBOOK, as_version=4)
    try:
        nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                resources={"metadata": {"path": str(REPO)}}).execute()
    finally:
        patch.undo()
    return [c for c in nb.cells if c.cell_type == "code"]


def _outputs(cell, mime):
    return [o.get("data", {}).get(mime, "") for o in cell.outputs if "data" in o] + \
           [o.get("text", "") for o in cell.outputs if o.get("output_type") == "stream" and mime == "stream"]


def test_notebook_is_stored_without_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in nb.cells if c.cell_type == "code")


def test_inline_summary_tables_plot_and_findings(executed):
    summary = "".join(_outputs(executed[0], "text/html"))
    assert "tracecliff-summary" in summary and "ddp-bucket-oversized" in summary and "DDP buckets are oversized" in summary
    typical = "".join(_outputs(executed[1], "stream"))
    assert typical.startswith("typical step 5: 163.9 ms, exposed")  # the verdict's figure
    roles = "".join(_outputs(executed[1], "text/html")).split("<tbody>")[1]
    assert re.findall(r"<th>([a-z-]+)</th>", roles) == ["drain", "steady", "typical"]
    ranks = "".join(_outputs(executed[2], "text/html"))
    assert "exposed_comm_us" in ranks and ranks.split("<tbody>")[1].count("<tr") == 8
    per_step = "".join(_outputs(executed[3], "text/html")).split("<tbody>")[1]
    assert re.findall(r"<th>(\d+)</th>", per_step) == ["5", "6", "7"]
    assert any(_outputs(executed[4], "image/png")), "the plot cell drew no figure"
    findings = "".join(_outputs(executed[7], "stream"))
    from analyzer import diagnose
    job = Path(__file__).resolve().parents[1] / "sample_traces" / "synthetic" / "ddp_bucket_oversized"
    gain = diagnose(str(job), report=False).findings[0]["estimated_gain_us"]  # the notebook's job
    assert findings.startswith(f"[warning] ddp-bucket-oversized (TC101): {gain / 1000:.1f} ms per step")
    assert "bucket_cap_mb=100" in findings
