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


@pytest.mark.parametrize("job", ["synthetic/megatron_tp4_dp2", "cpu_gloo/memory_ddp", "gpu_h200/fsdp2"])
def test_tables_keep_ranks_integer_and_name_groups_as_the_views_do(job):
    """A rank, step or count column is an integer (pandas' nullable Int64) in every table, also
    where some rows have none (a rank that waited for no peer) or the table is empty; a group
    is named as the text, the gate's ``busbw_gbps:<group>`` and the diff name it."""
    from analyzer.compare.metrics import run_metrics
    from analyzer.job import frames
    from analyzer.reports.text import TextRenderer
    from rule_cases_lib import diagnosed

    result = diagnosed(job)
    for name in ("ranks_df", "steps_df", "breakdown_df", "collectives_df", "groups_df", "compute_df", "memory_df"):
        df = getattr(result, name)()
        wrong = {c: str(t) for c, t in df.dtypes.items() if c in frames.INTEGER_COLUMNS and str(t) != "Int64"}
        assert not wrong, (name, wrong)
    breakdown = result.breakdown_df()
    assert all(isinstance(v, int) for v in breakdown["waited_for"].dropna().tolist())
    groups, collectives = result.groups_df(), result.collectives_df()
    text = TextRenderer().render(result)
    for g in result.groups or []:
        label = g.get("description") or g.get("name")
        assert label in groups["group"].tolist() and label in text
    assert set(collectives["group"].dropna()) <= set(groups["group"])
    busbw = {k.split(":", 1)[1] for k in run_metrics(result) if k.startswith("busbw_gbps:")}
    assert busbw <= set(groups["group"])
