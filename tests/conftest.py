import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "sample_traces"
REAL_TRACES = Path(os.environ.get("TRACECLIFF_REAL_TRACES", REPO.parent / "shared" / "traces" / "real"))


WORLD_TRACES = REAL_TRACES.parent / "world"


def _shared(folder: Path, what: str) -> Path:
    """A folder of ../shared: CI must have it; elsewhere its tests are skipped without it."""
    if not folder.is_dir():
        if os.environ.get("CI"):
            pytest.fail(f"{what} missing at {folder} (CI must provide ../shared)")
        pytest.skip(f"{what} not found at {folder}")
    return folder


@pytest.fixture(scope="session")
def real_traces() -> Path:
    return _shared(REAL_TRACES, "real traces")


@pytest.fixture(scope="session")
def world_traces() -> Path:
    """../shared/traces/world (traces other teams recorded)."""
    return _shared(WORLD_TRACES, "world traces")


@pytest.fixture()
def isolated(tmp_path, monkeypatch) -> Path:
    """A test run from an empty directory (no ./pyproject.toml of the repo is read) with a
    per-rank cache of its own; use with ``pytestmark = pytest.mark.usefixtures("isolated")``."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TRACECLIFF_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path
