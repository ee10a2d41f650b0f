"""analyzer.model.hardware: the shipped profiles, device-name matching and resolution provenance."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from analyzer.model import formulas as models
from analyzer.model.hardware import (ORIGINS, OVERRIDE_KEYS, HardwareAssumptions, gpu_profile, load_profiles,
                                     match_gpu, nic_profile, resolve_hardware)

A100_40GB_MEM = 42_297_524_224      # totalGlobalMem of the HTA trace's A100-PG509-200
V100_32GB_MEM = 34_079_899_648      # totalGlobalMem of the PARAM traces' V100-SXM2-32GB


# ---------------------------------------------------------------- data file
def test_every_profile_number_has_a_source():
    profiles = load_profiles()
    assert {p.family for p in profiles.gpus} >= {"A100", "H100", "H200", "V100", "MI300X"}
    for gpu in profiles.gpus:
        for name in ("memory_gb", "peak_bf16_tflops", "hbm_gbps", "intra_node_gbps",
                     "intra_node_alpha_us"):
            assert getattr(gpu, name) > 0
            assert gpu.sources[name].strip()
    assert [nic.line_rate_gbit for nic in profiles.nics] == [100, 200, 400, 800]
    for nic in profiles.nics:
        assert nic.line_rate_gbps == pytest.approx(nic.line_rate_gbit / 8)
        assert nic.achievable_gbps == pytest.approx(0.9 * nic.line_rate_gbps)
        assert nic.alpha_us > 0 and all(s.strip() for s in nic.sources.values())
    assert profiles.notes


@pytest.mark.parametrize("profile_id, peak, hbm, link, memory", [
    ("a100-sxm4-40gb", 312, 1555, 300, 40),
    ("a100-sxm4-80gb", 312, 2039, 300, 80),
    ("h100-sxm5-80gb", 989, 3350, 450, 80),
    ("h200-sxm-141gb", 989, 4800, 450, 141),
    ("v100-sxm2-16gb", 125, 900, 150, 16),
    ("v100-sxm2-32gb", 125, 900, 150, 32),
    ("mi300x-oam-192gb", 1307, 5300, 448, 192),
])
def test_profiles_carry_the_datasheet_numbers_one_way(profile_id, peak, hbm, link, memory):
    gpu = gpu_profile(profile_id)
    assert (gpu.peak_bf16_tflops, gpu.hbm_gbps, gpu.intra_node_gbps, gpu.memory_gb) == \
        (peak, hbm, link, memory)


def test_profiles_reproduce_the_models_md_figures():
    h100 = gpu_profile("h100-sxm5-80gb")
    nic = nic_profile(400)
    assert models.crossover_bytes(h100.intra_node_alpha_us, h100.intra_node_gbps) == \
        pytest.approx(360e3)
    assert models.crossover_bytes(nic.alpha_us, nic.achievable_gbps) == pytest.approx(540e3)
    # the roofline ridge point of models.md §6: peak FLOP/s over HBM bytes/s
    assert h100.peak_bf16_tflops * 1e12 / (h100.hbm_gbps * 1e9) == pytest.approx(295.22, abs=0.01)


# ---------------------------------------------------------------- matching
@pytest.mark.parametrize("name, total_mem, expected", [
    ("NVIDIA A100-SXM4-80GB", None, "a100-sxm4-80gb"),
    ("NVIDIA A100-SXM4-40GB", None, "a100-sxm4-40gb"),
    ("NVIDIA A100-PG509-200", A100_40GB_MEM, "a100-sxm4-40gb"),
    ("NVIDIA A100-PG509-200", None, "a100-sxm4-80gb"),          # no memory: largest variant
    ("NVIDIA A100-PCIE-40GB", None, "a100-pcie-40gb"),
    ("NVIDIA A100 80GB PCIe", None, "a100-pcie-80gb"),
    ("Tesla V100-SXM2-32GB", V100_32GB_MEM, "v100-sxm2-32gb"),
    ("Tesla V100-SXM2-16GB", None, "v100-sxm2-16gb"),
    ("Tesla V100-SXM2-32GB-LS", None, "v100-sxm2-32gb"),
    ("Tesla V100-PCIE-16GB", None, "v100-pcie-16gb"),
    ("NVIDIA H100 80GB HBM3", None, "h100-sxm5-80gb"),
    ("NVIDIA H100 80GB HBM3", 85_045_477_376, "h100-sxm5-80gb"),
    ("NVIDIA H100 PCIe", None, "h100-pcie-80gb"),
    ("NVIDIA H200", None, "h200-sxm-141gb"),
    ("NVIDIA H200", 150_754_820_096, "h200-sxm-141gb"),
    ("AMD Instinct MI300X", None, "mi300x-oam-192gb"),
    ("AMD Instinct MI300X OAM", 206_141_652_992, "mi300x-oam-192gb"),
    ("nvidia a100-sxm4-80gb", None, "a100-sxm4-80gb"),
])
def test_match_gpu_names(name, total_mem, expected):
    profile = match_gpu(name, total_mem)
    assert profile is not None and profile.id == expected


@pytest.mark.parametrize("name", [
    "NVIDIA GeForce RTX 4090", "NVIDIA GH200 480GB", "NVIDIA H100 NVL", "NVIDIA H200 NVL",
    "Tesla V100S-PCIE-32GB", "AMD Instinct MI300A", "AMD Instinct MI250X", "NVIDIA L40S",
    "Tesla T4", "", "   ",
])
def test_unknown_names_match_nothing(name):
    assert match_gpu(name) is None


def test_match_gpu_tolerates_non_strings():
    assert match_gpu(None) is None  # type: ignore[arg-type]


def _first_device(path: Path) -> dict:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as handle:
        return json.load(handle)["deviceProperties"][0]


@pytest.mark.parametrize("relative, expected", [
    ("hta_ddp_rank0_of_2/rank-0.json.gz", "a100-sxm4-40gb"),
    ("param_dlrm_ddp_8rank/worker0_step_12.1694128201545.pt.trace.json", "v100-sxm2-32gb"),
])
def test_real_trace_devices_match(real_traces, relative, expected):
    path = real_traces / relative
    assert path.exists(), f"{path}: the real trace set changed"
    device = _first_device(path)
    assert match_gpu(device["name"], device["totalGlobalMem"]).id == expected


def test_gpu_profile_lookup():
    assert gpu_profile("H100").id == "h100-sxm5-80gb"
    assert gpu_profile(" MI300X ").id == "mi300x-oam-192gb"
    assert gpu_profile("A100 40GB").id == "a100-sxm4-40gb"
    with pytest.raises(ValueError, match="known:"):
        gpu_profile("TPU v5")


def test_nic_profiles():
    assert nic_profile(400).achievable_gbps == 45.0 and nic_profile(400).alpha_us == 12.0
    assert nic_profile(800).line_rate_gbps == 100.0
    assert nic_profile(300) is None


# ---------------------------------------------------------------- resolution and provenance
def test_resolution_from_the_trace_marks_measured_and_assumed():
    hw = resolve_hardware(["NVIDIA A100-PG509-200"] * 8, [A100_40GB_MEM] * 8)
    assert hw.gpu_profile.value == "a100-sxm4-40gb"
    assert hw.names_by_origin("measured") == ("gpu_name", "memory_bytes", "gpus_per_node")
    assert hw.memory_bytes.value == A100_40GB_MEM
    assert hw.gpus_per_node.value == 8
    assert hw.names_by_origin("default") == ("nics_per_node", "nic_line_rate_gbit")
    assert hw.nics_per_node.value == 8 and hw.nic_line_rate_gbit.value == 400
    assert (hw.peak_tflops.origin, hw.peak_tflops.value) == ("profile", 312)
    assert (hw.intra_node_gbps.value, hw.nic_gbps.value, hw.nic_alpha_us.value) == (300, 45, 12)
    assert hw.names_by_origin("user") == ()


def test_topology_gpus_per_node_drives_the_nic_default():
    hw = resolve_hardware(["NVIDIA H100 80GB HBM3"], 85_045_477_376, gpus_per_node=4)
    assert (hw.gpus_per_node.value, hw.gpus_per_node.origin) == (4, "measured")
    assert hw.nics_per_node.value == 4


def test_overrides_are_marked_user():
    hw = resolve_hardware(["Tesla V100-SXM2-32GB"] * 8, V100_32GB_MEM,
                          {"nics_per_node": 1, "nic_line_rate_gbit": 100, "peak_tflops": 130})
    assert (hw.nics_per_node.value, hw.nics_per_node.origin) == (1, "user")
    assert (hw.nic_line_rate_gbit.value, hw.nic_line_rate_gbit.origin) == (100, "user")
    assert (hw.nic_gbps.value, hw.nic_gbps.origin) == (11.25, "profile")   # the 100G profile
    assert (hw.peak_tflops.value, hw.peak_tflops.origin) == (130.0, "user")
    assert hw.hbm_gbps.origin == "profile"


def test_gpu_override_selects_a_profile():
    hw = resolve_hardware(["NVIDIA GeForce RTX 4090"], None, {"gpu": "h200"})
    assert (hw.gpu_profile.value, hw.gpu_profile.origin) == ("h200-sxm-141gb", "user")
    assert (hw.peak_tflops.value, hw.peak_tflops.origin) == (989, "profile")
    assert hw.memory_bytes.value == 141 * 2**30 and hw.memory_bytes.origin == "profile"


def test_unknown_gpu_without_override_is_unknown_not_guessed():
    hw = resolve_hardware(["NVIDIA GeForce RTX 4090"] * 2, [25_393_692_672] * 2)
    assert hw.gpu_name.origin == "measured" and hw.gpu_profile.origin == "unknown"
    for name in ("peak_tflops", "hbm_gbps", "intra_node_gbps", "intra_node_alpha_us"):
        assert getattr(hw, name).value is None and getattr(hw, name).origin == "unknown"
    assert hw.memory_bytes.origin == "measured"
    assert hw.nic_gbps.value == 45.0   # NIC assumptions do not depend on the GPU


def test_no_device_properties_uses_defaults():
    hw = resolve_hardware([])
    assert (hw.gpus_per_node.value, hw.gpus_per_node.origin) == (8, "default")
    assert hw.memory_bytes.origin == "unknown" and hw.gpu_name.value is None


def test_nic_rate_without_profile_is_a_stated_default():
    hw = resolve_hardware([], overrides={"nic_line_rate_gbit": 1600})
    assert hw.nic_gbps.value == pytest.approx(1600 / 8 * 0.9)
    assert hw.nic_gbps.origin == "default" and "1600" in hw.nic_gbps.source


def test_mixed_devices_use_the_most_common_and_say_so():
    hw = resolve_hardware(["NVIDIA H100 80GB HBM3"] * 3 + ["NVIDIA H200"])
    assert hw.gpu_profile.value == "h100-sxm5-80gb" and "mixed" in hw.gpu_name.source


def test_to_dict_is_complete_and_json_ready():
    hw = resolve_hardware(["AMD Instinct MI300X"] * 8)
    data = hw.to_dict()
    assert list(data) == ["gpu_name", "gpu_profile", "memory_bytes", "peak_tflops", "hbm_gbps",
                          "intra_node_link", "intra_node_gbps", "intra_node_alpha_us",
                          "gpus_per_node", "nics_per_node", "nic_line_rate_gbit", "nic_gbps",
                          "nic_alpha_us", "peak_fp32_tflops", "peak_tf32_tflops", "peak_fp8_tflops"]
    assert all(entry["origin"] in ORIGINS and entry["source"] for entry in data.values())
    assert json.loads(json.dumps(data, sort_keys=True)) == data


@pytest.mark.parametrize("overrides", [
    {"nic_speed": 400}, {"nics_per_node": 0}, {"nics_per_node": 2.5}, {"peak_tflops": -1},
    {"peak_tflops": float("nan")}, {"gpu": "TPU v5"}, {"gpus_per_node": True},
])
def test_bad_overrides_raise(overrides):
    assert set(OVERRIDE_KEYS) >= {"gpu", "nics_per_node", "nic_line_rate_gbit"}
    with pytest.raises(ValueError):
        resolve_hardware(["NVIDIA H100 80GB HBM3"], None, overrides)


def test_total_mem_must_align():
    with pytest.raises(ValueError):
        resolve_hardware(["NVIDIA H100 80GB HBM3"] * 2, [1, 2, 3])


def test_every_profile_has_a_dense_peak_per_dtype_with_its_source():
    """fp32 < tf32 < bf16 < fp8 where the GPU has them; V100 has no TF32/fp8, A100 no fp8; each
    value names its datasheet (issue 29: MFU from recorded shapes counts each op at its dtype)."""
    for gpu in load_profiles().gpus:
        for name in ("peak_fp32_tflops", "peak_tf32_tflops", "peak_fp8_tflops"):
            assert gpu.sources[name], (gpu.id, name)
        chain = [v for v in (gpu.peak_fp32_tflops, gpu.peak_tf32_tflops, gpu.peak_bf16_tflops, gpu.peak_fp8_tflops)
                 if v is not None]
        assert chain == sorted(chain) and len(set(chain)) == len(chain), gpu.id
        assert (gpu.peak_tf32_tflops is None) == (gpu.family == "V100")
        assert (gpu.peak_fp8_tflops is None) == (gpu.family in ("V100", "A100"))
    h100 = gpu_profile("h100-sxm5-80gb")
    assert (h100.peak_fp32_tflops, h100.peak_tf32_tflops, h100.peak_bf16_tflops, h100.peak_fp8_tflops) == \
        (67, 494.5, 989, 1979)


def test_peak_of_a_dtype():
    hw = resolve_hardware(["NVIDIA A100-SXM4-80GB"])
    assert [hw.peak_of(d).value for d in ("bf16", "fp16", "tf32", "fp32", "fp8", "fp64", None)] == \
        [312, 312, 156, 19.5, None, None, None]
    assert hw.peak_of("fp8").origin == "unknown" and "no fp8" in hw.peak_of("fp8").source
    saved = {k: v for k, v in hw.to_dict().items() if k not in ("peak_fp32_tflops", "peak_tf32_tflops", "peak_fp8_tflops")}
    assert HardwareAssumptions.from_dict(saved).peak_of("fp32").value is None  # a result saved before them


def test_a_device_without_a_name_is_dropped_with_its_memory():
    """deviceProperties may hold a device whose name is missing or blank: it is left out, and so is
    its memory, so the next device's memory is not read as its (a fuzzer's draw once had the
    resolver refuse the job over the two lists' lengths)."""
    hw = resolve_hardware([None, "NVIDIA H100 80GB HBM3", " "], [1, 85_000_000_000, 2])  # type: ignore[list-item]
    assert hw.gpu_name.value == "NVIDIA H100 80GB HBM3"
    assert hw.memory_bytes.value == 85_000_000_000
