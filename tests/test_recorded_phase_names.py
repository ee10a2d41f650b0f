"""The names torch itself records for a compiled training step and an eager inference loop
(recorded here on CPU with the installed torch), read as the phase markers the analysis expects:
dynamo's region and AOTAutograd's forward are forward, its backward node is backward, the
optimizer's ranges are the optimizer's; a no_grad loop holds no backward or optimizer marker."""

from __future__ import annotations

import numpy as np
import pytest

from analyzer.ingest.loader import load_rank_trace
from analyzer.ingest.trace import Marker
from analyzer.rank.workload import forward_only, workload_evidence

torch = pytest.importorskip("torch")


def _record(tmp_path, name, body):
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        body()
    path = tmp_path / f"{name}.json"
    prof.export_chrome_trace(str(path))
    return load_rank_trace(path)


def _kinds(trace) -> dict[str, set[int]]:
    m = trace.markers
    out: dict[str, set[int]] = {}
    for name, kind in zip(m.name.tolist(), m.kind.tolist()):
        out.setdefault(trace.strings[name], set()).add(kind)
    return out


def test_a_compiled_training_step(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    compiled = torch.compile(model, backend="aot_eager")  # AOTAutograd without a C++ toolchain
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 32)

    def step():
        compiled(x).sum().backward()
        opt.step()
        opt.zero_grad()

    step()  # compile outside the profile
    trace = _record(tmp_path, "compiled", step)
    kinds = _kinds(trace)
    region = [n for n in kinds if n.startswith("Torch-Compiled Region")]
    assert region and all(kinds[n] == {Marker.FORWARD} for n in region)
    assert kinds["CompiledFunction"] == {Marker.FORWARD}
    assert kinds["CompiledFunctionBackward"] == {Marker.BACKWARD}
    assert kinds["autograd::engine::evaluate_function: CompiledFunctionBackward"] == {Marker.BACKWARD}
    assert kinds["Optimizer.step#SGD.step"] == {Marker.OPTIMIZER}
    assert not forward_only(trace)
    assert workload_evidence(trace)["backward"] > 0


def test_an_eager_inference_loop(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    x = torch.randn(8, 32)

    def infer():
        with torch.no_grad():
            for _ in range(3):
                model(x).argmax(-1).tolist()

    trace = _record(tmp_path, "inference", infer)
    assert not np.isin(trace.markers.kind, (Marker.BACKWARD, Marker.OPTIMIZER)).any()
    assert forward_only(trace)
    assert len(trace.shape_ops.ts)  # its aten::addmm ops: the host side is there to show a backward
