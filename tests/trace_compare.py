"""Comparing loaded traces whose string ids may differ (the ids follow the order in which names
were first met, which depends on how the text was cut into batches)."""

import numpy as np


def resolved(trace):
    """A RankTrace with string ids replaced by the strings (ids depend on the batching)."""
    names, threads = np.array(trace.strings, dtype=object), np.array(trace.threads, dtype=object)
    return {"gpu": dict(vars(trace.gpu), name=names[trace.gpu.name]),
            "launches": dict(vars(trace.launches), thread=threads[trace.launches.thread]),
            "markers": dict(vars(trace.markers), name=names[trace.markers.name], thread=threads[trace.markers.thread]),
            "shape_ops": _shape_ops(trace, threads),
            "args": trace.kernel_comm_args, "strings": set(trace.strings), "threads": set(trace.threads),
            "events": trace.event_count, "warnings": trace.warnings,
            "meta": (trace.rank, trace.world_size, trace.host, trace.process_groups, trace.devices, trace.nccl_version)}


def _shape_ops(trace, threads):
    """The kept shape ops (analyzer.ingest.shapes) as rows of plain values (ids resolved)."""
    ops = trace.shape_ops
    names = np.array(ops.names, dtype=object)
    return [(int(t), int(e), threads[th], names[n], ops.recorded[a], int(x)) for t, e, th, n, a, x in
            zip(ops.ts, ops.end, ops.thread, ops.name, ops.args, ops.external_id)]


def assert_same(a, b):
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], dict) and key in ("gpu", "launches", "markers"):
            for name, column in a[key].items():
                if isinstance(column, np.ndarray):
                    np.testing.assert_array_equal(column, b[key][name], err_msg=f"{key}.{name}")
                else:
                    assert column == b[key][name], f"{key}.{name}"
        else:
            assert a[key] == b[key], key
