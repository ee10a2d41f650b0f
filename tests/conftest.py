import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "sample_traces"
REAL_TRACES = Path(os.environ.get("TRACECLIFF_REAL_TRACES", REPO.parent / "shared" / "traces" / "real"))


@pytest.fixture(scope="session")
def real_traces() -> Path:
    if not REAL_TRACES.is_dir():
        if os.environ.get("CI"):
            pytest.fail(f"real traces missing at {REAL_TRACES} (CI must provide ../shared)")
        pytest.skip(f"real traces not found at {REAL_TRACES}")
    return REAL_TRACES


@pytest.fixture()
def isolated(tmp_path, monkeypatch) -> Path:
    """A test run from an empty directory (no ./pyproject.toml of the repo is read) with a
    per-rank cache of its own; use with ``pytestmark = pytest.mark.usefixtures("isolated")``."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TRACECLIFF_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path
