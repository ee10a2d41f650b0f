"""The communication-kernel catalog: which kernels count as communication, their library and
collective, user patterns, generic NCCL kernels, on hand-built traces with hand-worked answers."""

import json
import re

import pytest
from click.testing import CliRunner

from analyzer.api import DiagnoseOptions, diagnose
from analyzer.base.errors import ConfigError
from analyzer.cli.main import cli
from analyzer.ingest.catalog import DEFAULT_COMM_PATTERN, catalog, lookup
from builders import MAIN, TraceBuilder

COMPUTE_NAMES = [
    "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>",
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64",
    "deep_ep::layout::get_dispatch_layout<256, 32, 8>(long const*, int*, int*, int*, bool*, int, int, int, int)",
    "void moe_align_block_size_kernel<int>", "triton_poi_fused_add_0", "flash_fwd_kernel",
    "Memcpy DtoD (Device -> Device)", "void at::native::index_elementwise_kernel<128, 4>",
]


def test_every_catalog_example_is_matched_by_its_own_entry():
    ids = [k.id for k in catalog()]
    assert len(ids) == len(set(ids))
    for kernel in catalog():
        if kernel.id == "nccl-other":  # the catch-all: its example is also an NCCL name
            continue
        assert lookup(kernel.example) is kernel, kernel.id


@pytest.mark.parametrize("name", COMPUTE_NAMES)
def test_compute_kernels_are_not_communication(name):
    assert lookup(name) is None
    assert not re.search(DEFAULT_COMM_PATTERN, name, re.IGNORECASE)


@pytest.mark.parametrize("name, library, collective", [
    ("deep_ep::intranode::notify_dispatch<8>(int const*, int*, int, int const*)", "deepep", "alltoall"),
    ("deep_ep::intranode::cached_notify_combine<8>(void**, int*, int, int, int, int**, int)", "deepep", "alltoall"),
    ("uccl::internode_ll::dispatch<true, 3, 7168>(void*, float*)", "deepep", "alltoall"),  # another namespace
    ("mori::internode::combine<__nv_bfloat16>(...)", "deepep", "alltoall"),
    ("vllm::cross_device_reduce_2stage<__nv_bfloat16, 4>(vllm::RankData*)", "custom_allreduce", "allreduce"),
    ("c10d::symmetric_memory::one_shot_all_reduce_kernel<float, 8>", "custom_allreduce", "allreduce"),
    ("userbuffers_fp16_sum_inplace_gpu_rr_rs(int, int*, int*)", "userbuffers", "reduce_scatter"),
    ("ncclDevKernel_Generic(ncclDevComm*, channelMasks, ncclWork*)", "nccl", None),
    ("ncclSymDevKernel_AllReduce_AGxLL_R_sum_bf16(ncclSymDevArgs)", "nccl", None),
])
def test_library_and_collective_by_name(name, library, collective):
    kernel = lookup(name)
    assert kernel is not None and kernel.library == library and kernel.collective == collective


def expert_parallel(tmp_path, dispatch="deep_ep::intranode::dispatch<__nv_bfloat16, 8, 768>(int4*)",
                    combine="deep_ep::intranode::combine<__nv_bfloat16, 8, 768>(int4*)"):
    """One step: compute [1000, 1100) on stream 7; dispatch [1010, 1040) and combine
    [1080, 1120) on stream 30 (their own stream). Comm 70, overlap 30 + 20 = 50, exposed 20."""
    b = TraceBuilder()
    b.cpu("ProfilerStep#1", 990, 200, cat="user_annotation")
    b.kernel("sm90_xmma_gemm_bf16", 1000, 100, launch_ts=995)
    b.cpu("dispatch", 996, 2, cat="user_annotation")
    b.kernel(dispatch, 1010, 30, stream=30, launch_ts=997)
    b.kernel(combine, 1080, 40, stream=30, launch_ts=999)
    return b.write(tmp_path / "rank-0.json")


def test_expert_parallel_kernels_count_as_communication(tmp_path):
    result = diagnose([str(expert_parallel(tmp_path))])
    m = result.ranks[0].metrics
    assert m["comm_us"] == 70.0 and m["overlap_us"] == 50.0 and m["exposed_comm_us"] == 20.0
    assert m["compute_us"] == 100.0
    rows = result.collectives
    assert [(r["library"], r["collective"], r["exposed_us"]) for r in rows] == [
        ("deepep", "alltoall", 0.0), ("deepep", "alltoall", 20.0)]
    # the trace gives neither size nor group: they stay unknown, never guessed
    assert all(r["bytes"] is None and r["group"]["name"] is None and r["group"]["ranks"] is None
               for r in rows)
    assert not any("no communication kernels" in w for w in result.warnings)


def test_user_pattern_extends_the_catalog(tmp_path):
    path = str(expert_parallel(tmp_path, dispatch="my_a2a_send(int4*)", combine="my_a2a_recv(int4*)"))
    plain = diagnose([path])
    assert plain.ranks[0].metrics["comm_us"] == 0.0
    assert any("no communication kernels" in w for w in plain.warnings)
    extended = diagnose([path], DiagnoseOptions(comm_kernels=("my_a2a_",)))
    assert extended.ranks[0].metrics["comm_us"] == 70.0
    assert {r["library"] for r in extended.collectives} == {"user"}
    assert {r["collective"] for r in extended.collectives} == {"unknown"}
    from_config = diagnose([path], config={"communication": {"kernels": ["my_a2a_"]}})
    assert from_config.ranks[0].metrics == extended.ranks[0].metrics


@pytest.mark.parametrize("table, message", [
    ({"kernels": "x"}, "communication.kernels: expected `array`, got `str`"),
    ({"kernels": ["("]}, "invalid regular expression"),
    ({"kernel": ["x"]}, "communication: unknown key 'kernel'; known: kernels"),
])
def test_bad_communication_config_is_a_config_error(tmp_path, table, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        diagnose([str(expert_parallel(tmp_path))], config={"communication": table})


def test_cli_comm_kernel_option(tmp_path):
    path = str(expert_parallel(tmp_path, dispatch="my_a2a_send", combine="my_a2a_recv"))
    runner = CliRunner()
    ok = runner.invoke(cli, ["diagnose", path, "--comm-kernel", "my_a2a_", "--format", "json", "--no-cache"])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.output)["ranks"][0]["comm_us"] == 70.0
    bad = runner.invoke(cli, ["diagnose", path, "--comm-kernel", "(", "--no-cache"])
    assert bad.exit_code == 2 and "invalid regular expression" in bad.output and "Traceback" not in bad.output


def test_explain_communication_lists_the_catalog():
    out = CliRunner().invoke(cli, ["explain", "communication"])
    assert out.exit_code == 0
    for kernel in catalog():
        assert kernel.id in out.output and kernel.pattern in out.output
    doc = json.loads(CliRunner().invoke(cli, ["explain", "communication", "--format", "json"]).output)
    assert [e["id"] for e in doc["communication_kernels"]] == [k.id for k in catalog()]


GENERIC = "ncclDevKernel_Generic_4(ncclDevKernelArgsStorage<4096ul>)"


def _params(b, ts, collective, pg="0"):
    b.cpu("record_param_comms", ts, 1, **{"Collective name": collective, "In msg nelems": 1000,
                                          "Out msg nelems": 1000, "dtype": "Float", "Process Group Name": pg,
                                          "Group size": 2})


def test_generic_kernels_take_their_kind_from_the_linked_op_or_the_stream_order(tmp_path):
    b = TraceBuilder()
    b.cpu("ProfilerStep#1", 900, 500, cat="user_annotation")
    # linked: the kernel's launch lies inside record_param_comms (allgather)
    b.cpu("record_param_comms", 905, 3, **{"Collective name": "_allgather_base", "In msg nelems": 10,
                                           "Out msg nelems": 20, "dtype": "Float", "Process Group Name": "0"})
    b.kernel(GENERIC, 1000, 10, stream=20, launch_ts=906)
    # unlinked (no launch recorded): two all-reduces then a reduce-scatter issued on the CPU
    _params(b, 910, "allreduce")
    _params(b, 920, "allreduce")
    _params(b, 930, "reduce_scatter_tensor_coalesced")
    b.kernel(GENERIC, 1100, 10, stream=20)
    b.kernel(GENERIC, 1200, 10, stream=20)
    b.kernel(GENERIC, 1300, 10, stream=20)
    b.kernel("sm90_gemm", 1000, 400, launch_ts=901, tid=MAIN)
    rows = diagnose([str(b.write(tmp_path / "rank-0.json"))]).collectives
    assert [r["collective"] for r in rows] == ["allgather", "allreduce", "allreduce", "reduce_scatter"]
    assert [r.get("collective_source") for r in rows] == [None] + ["stream order of CPU collectives"] * 3
    assert rows[0]["bytes"] == 80 and all(r["bytes"] is None for r in rows[1:])  # sizes never inferred


def test_unlinked_generic_kernel_without_cpu_collectives_stays_unknown(tmp_path):
    b = TraceBuilder()
    b.kernel(GENERIC, 1000, 10, stream=20)
    b.kernel("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", 1100, 10, stream=20)
    rows = diagnose([str(b.write(tmp_path / "rank-0.json"))]).collectives
    assert [r["collective"] for r in rows] == ["unknown", "unknown"]  # not "sendrecv" from the name


def test_rccl_is_told_apart_by_the_device(tmp_path):
    b = TraceBuilder()
    b.doc["deviceProperties"] = [{"id": 0, "name": "AMD Instinct MI300X", "totalGlobalMem": 192e9}]
    b.kernel("ncclDevKernel_Generic(ncclDevComm*, channelMasks, ncclWork*)", 1000, 10, stream=20)
    b.kernel("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", 1100, 10, stream=20)
    rows = diagnose([str(b.write(tmp_path / "rank-0.json"))]).collectives
    assert [(r["library"], r["collective"]) for r in rows] == [("rccl", "unknown"), ("rccl", "allreduce")]


def test_void_prefixed_names_keep_their_entry():
    # some Kineto versions write the demangled return type
    assert lookup("void ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)").generic
    assert lookup("void ncclDevKernel_Generic_1(ncclDevKernelArgsStorage<4096ul>)").id == "nccl-generic"
    assert lookup("void ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)").id == "nccl"


def test_stream_order_counts_nested_ops_once(tmp_path):
    """No record_param_comms: c10d::allreduce_ encloses nccl:all_reduce; each is one collective."""
    b = TraceBuilder()
    for k, (c10d, nccl) in enumerate((("c10d::allreduce_", "nccl:all_reduce"),
                                      ("c10d::_allgather_base_", "nccl:_all_gather_base"))):
        b.cpu(c10d, 900 + 20 * k, 10)
        b.cpu(nccl, 901 + 20 * k, 8)
    b.kernel(GENERIC, 1000, 10, stream=20)
    b.kernel(GENERIC, 1100, 10, stream=20)
    rows = diagnose([str(b.write(tmp_path / "rank-0.json"))]).collectives
    assert [r["collective"] for r in rows] == ["allreduce", "allgather"]
