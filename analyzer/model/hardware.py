"""Hardware profiles (``analyzer/data/hardware.json``) and the hardware assumptions of a run.

Units follow :mod:`analyzer.model.formulas`: bandwidths in GB/s (1e9 B/s) one-way per GPU, α in µs,
peaks in TFLOPS; NIC line rates are named ``*_gbit`` (Gb/s, e.g. 400).

:func:`resolve_hardware` returns :class:`HardwareAssumptions`, whose every field says where its
value came from, so that a report can print which numbers were measured and which assumed:

- ``measured``: read from the trace (``deviceProperties``);
- ``profile``: from the shipped data file (the profile chosen by the device name or ``--gpu``);
- ``user``: an override;
- ``default``: a stated assumption with no profile behind it (e.g. one 400G NIC per GPU);
- ``unknown``: no value (unrecognised GPU and no override).
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from functools import lru_cache
from typing import Any

from analyzer import data as data_files

__all__ = [
    "ORIGINS", "GpuProfile", "NicProfile", "Profiles", "Sourced", "HardwareAssumptions",
    "OVERRIDE_KEYS", "PEAK_FIELDS", "load_profiles", "match_gpu", "gpu_profile", "nic_profile",
    "resolve_hardware", "for_device",
]

ORIGINS = ("measured", "profile", "user", "default", "unknown")
_GIB = 2**30


@dataclass(frozen=True)
class GpuProfile:
    """One GPU variant; ``sources`` maps each numeric field to its source string."""

    id: str
    family: str
    form_factor: str  # "sxm" (SXM / OAM / mezzanine) or "pcie"
    label: str
    memory_gb: float
    peak_bf16_tflops: float  # also fp16 (V100: fp16, no bf16)
    peak_fp32_tflops: float
    peak_tf32_tflops: float | None  # None: no TF32 tensor cores (V100)
    peak_fp8_tflops: float | None  # None: no fp8 (V100, A100)
    hbm_gbps: float
    intra_node_link: str
    intra_node_gbps: float
    intra_node_alpha_us: float
    sources: Mapping[str, str]


@dataclass(frozen=True)
class NicProfile:
    """One NIC line rate: nominal and achievable one-way GB/s, α in µs, with sources."""

    line_rate_gbit: int
    label: str
    line_rate_gbps: float
    achievable_gbps: float
    alpha_us: float
    sources: Mapping[str, str]


@dataclass(frozen=True)
class Profiles:
    gpus: tuple[GpuProfile, ...]
    nics: tuple[NicProfile, ...]
    defaults: Mapping[str, Any]  # name -> {"value", "source"}
    notes: tuple[str, ...]


def _sourced_fields(entry: Mapping[str, Any], names: Sequence[str]) -> tuple[dict, dict]:
    values = {name: entry[name]["value"] for name in names}
    sources = {name: entry[name]["source"] for name in names}
    return values, sources


_GPU_NUMBERS = ("memory_gb", "peak_bf16_tflops", "peak_fp32_tflops", "peak_tf32_tflops", "peak_fp8_tflops",
                "hbm_gbps", "intra_node_gbps", "intra_node_alpha_us")
# The assumptions' peak of each dtype MFU from recorded shapes counts against (analyzer.job.compute):
# bf16 and fp16 share peak_tflops; fp64 and integer types have none.
PEAK_FIELDS = {"bf16": "peak_tflops", "fp16": "peak_tflops", "fp32": "peak_fp32_tflops",
               "tf32": "peak_tf32_tflops", "fp8": "peak_fp8_tflops"}
_NIC_NUMBERS = ("line_rate_gbps", "achievable_gbps", "alpha_us")


@lru_cache(maxsize=1)
def load_profiles() -> Profiles:
    """Read the shipped ``analyzer/data/hardware.json`` (cached)."""
    text = data_files.text("hardware.json")
    data = json.loads(text)
    gpus = []
    for entry in data["gpus"]:
        values, sources = _sourced_fields(entry, _GPU_NUMBERS)
        gpus.append(GpuProfile(id=entry["id"], family=entry["family"],
                               form_factor=entry["form_factor"], label=entry["label"],
                               intra_node_link=entry["intra_node_link"], sources=sources,
                               **values))
    nics = []
    for entry in data["nics"]:
        values, sources = _sourced_fields(entry, _NIC_NUMBERS)
        nics.append(NicProfile(line_rate_gbit=entry["line_rate_gbit"], label=entry["label"],
                               sources=sources, **values))
    return Profiles(tuple(gpus), tuple(nics), data["defaults"], tuple(data["notes"]))


# ---------------------------------------------------------------- GPU matching
# Word-bounded family tokens: "GH200" is not an H200, "V100S" not a V100, "MI300A" not MI300X.
_FAMILY_TOKENS = {
    "V100": re.compile(r"(?<![A-Z0-9])V100(?![A-Z0-9])"),
    "A100": re.compile(r"(?<![A-Z0-9])A100(?![A-Z0-9])"),
    "H100": re.compile(r"(?<![A-Z0-9])H100(?![A-Z0-9])"),
    "H200": re.compile(r"(?<![A-Z0-9])H200(?![A-Z0-9])"),
    "MI300X": re.compile(r"(?<![A-Z0-9])MI300X(?![A-Z0-9])"),
}
# Variants with other peaks / memory / links that the data file does not describe.
_UNPROFILED_VARIANT = re.compile(r"(?<![A-Z0-9])NVL(?![A-Z0-9])")
_PCIE = re.compile(r"PCIE")
_MEMORY_IN_NAME = re.compile(r"(\d+)\s*GB(?![A-Z0-9])")


def _family_of(upper_name: str) -> str | None:
    families = [family for family, token in _FAMILY_TOKENS.items() if token.search(upper_name)]
    return families[0] if len(families) == 1 else None


def _closest_memory(candidates: list[GpuProfile], memory_gib: float) -> GpuProfile:
    # Nearest on a log scale; ties (never between real variants) go to the larger memory.
    return min(candidates, key=lambda p: (abs(math.log(p.memory_gb / memory_gib)), -p.memory_gb))


def match_gpu(device_name: str, total_mem_bytes: int | None = None) -> GpuProfile | None:
    """The profile of a ``deviceProperties`` name (e.g. ``"NVIDIA A100-SXM4-80GB"``,
    ``"NVIDIA A100-PG509-200"``, ``"Tesla V100-SXM2-32GB"``, ``"NVIDIA H100 80GB HBM3"``,
    ``"NVIDIA H200"``, ``"AMD Instinct MI300X"``), or None when not recognised.

    The variant is chosen by form factor (``PCIe`` in the name) and memory: the size in the
    name, else ``totalGlobalMem`` (bytes, nearest variant), else the largest variant.
    """
    if not isinstance(device_name, str):
        return None
    upper = device_name.upper()
    family = _family_of(upper)
    if family is None or _UNPROFILED_VARIANT.search(upper):
        return None
    form = "pcie" if _PCIE.search(upper) else "sxm"
    candidates = [p for p in load_profiles().gpus if p.family == family and p.form_factor == form]
    if not candidates:
        return None
    named = _MEMORY_IN_NAME.search(upper)
    if named:
        memory_gib = float(named.group(1))
    elif total_mem_bytes is not None and total_mem_bytes > 0:
        memory_gib = total_mem_bytes / _GIB
    else:
        return max(candidates, key=lambda p: p.memory_gb)
    return _closest_memory(candidates, memory_gib)


def gpu_profile(name_or_id: str) -> GpuProfile:
    """A profile by id (``"h100-sxm5-80gb"``) or by a name :func:`match_gpu` recognises
    (``"H100"``, ``"A100 40GB"``); ValueError listing the known ids otherwise."""
    profiles = load_profiles().gpus
    key = name_or_id.strip().lower() if isinstance(name_or_id, str) else ""
    by_id = {p.id: p for p in profiles}
    found = by_id.get(key) or match_gpu(name_or_id)
    if found is None:
        raise ValueError(f"unknown GPU {name_or_id!r}; known: {', '.join(sorted(by_id))}")
    return found


def nic_profile(line_rate_gbit: int) -> NicProfile | None:
    """The NIC profile for a line rate in Gb/s (100, 200, 400, 800), or None."""
    for nic in load_profiles().nics:
        if nic.line_rate_gbit == line_rate_gbit:
            return nic
    return None


# ---------------------------------------------------------------- resolution with provenance
@dataclass(frozen=True)
class Sourced:
    """A value, where it came from (one of ORIGINS) and a human-readable source."""

    value: Any
    origin: str
    source: str

    def __post_init__(self) -> None:
        if self.origin not in ORIGINS:
            raise ValueError(f"origin must be one of {ORIGINS}, got {self.origin!r}")

    def to_dict(self) -> dict[str, Any]:
        return {"origin": self.origin, "source": self.source, "value": self.value}


@dataclass(frozen=True)
class HardwareAssumptions:
    """The hardware numbers a report uses, each with its provenance (see module docstring)."""

    gpu_name: Sourced             # device name (trace) or the user's --gpu
    gpu_profile: Sourced          # profile id
    memory_bytes: Sourced         # GPU memory, bytes
    peak_tflops: Sourced          # bf16 dense (V100: fp16 tensor)
    hbm_gbps: Sourced
    intra_node_link: Sourced
    intra_node_gbps: Sourced      # one-way per GPU (NVLink / xGMI / PCIe)
    intra_node_alpha_us: Sourced
    gpus_per_node: Sourced
    nics_per_node: Sourced
    nic_line_rate_gbit: Sourced   # Gb/s
    nic_gbps: Sourced             # achievable one-way GB/s of one NIC
    nic_alpha_us: Sourced
    # dense peaks of the other dtypes (MFU from recorded shapes, issue 29); a saved result
    # written before them reads them as unknown
    peak_fp32_tflops: Sourced = Sourced(None, "unknown", "not resolved")
    peak_tf32_tflops: Sourced = Sourced(None, "unknown", "not resolved")
    peak_fp8_tflops: Sourced = Sourced(None, "unknown", "not resolved")

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """``{field: {"origin", "source", "value"}}`` in field order (deterministic)."""
        return {f.name: getattr(self, f.name).to_dict() for f in fields(self)}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> "HardwareAssumptions":
        """The inverse of ``to_dict`` (a saved result's ``hardware`` section)."""
        return cls(**{f.name: Sourced(**doc[f.name]) for f in fields(cls) if f.name in doc})

    def peak_of(self, dtype: str | None) -> Sourced:
        """The dense peak (TFLOPS) of a dtype (``PEAK_FIELDS``), unknown for the others."""
        name = PEAK_FIELDS.get(dtype or "")
        if name is None:
            return Sourced(None, "unknown", f"no peak for {dtype or 'an unknown dtype'} in the hardware profiles")
        return getattr(self, name)

    def names_by_origin(self, origin: str) -> tuple[str, ...]:
        """Field names whose value has the given origin."""
        return tuple(f.name for f in fields(self) if getattr(self, f.name).origin == origin)


#: Keys accepted by ``resolve_hardware(overrides=...)``: ``gpu`` selects a profile; the others
#: set one field each (numbers; ``nic_line_rate_gbit`` also selects the NIC profile).
OVERRIDE_KEYS: tuple[str, ...] = (
    "gpu", "memory_bytes", "peak_tflops", "hbm_gbps", "intra_node_gbps", "intra_node_alpha_us",
    "gpus_per_node", "nics_per_node", "nic_line_rate_gbit", "nic_gbps", "nic_alpha_us",
)
_COUNT_KEYS = ("gpus_per_node", "nics_per_node", "nic_line_rate_gbit")


def _check_overrides(overrides: Mapping[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(overrides) - set(OVERRIDE_KEYS))
    if unknown:
        raise ValueError(f"unknown hardware override(s) {unknown}; known: {list(OVERRIDE_KEYS)}")
    checked = {}
    for key, value in overrides.items():
        if value is None:
            continue
        if key == "gpu":
            checked[key] = value
        elif key in _COUNT_KEYS:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{key} must be an integer >= 1, got {value!r}")
            checked[key] = value
        else:
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value) or value <= 0:
                raise ValueError(f"{key} must be a positive number, got {value!r}")
            checked[key] = int(value) if key == "memory_bytes" else float(value)
    return checked


def _most_common_device(device_names: Sequence[str],
                        total_mem: Sequence[int | None]) -> tuple[str, int | None, str]:
    counts = Counter(device_names)
    name = min(counts, key=lambda n: (-counts[n], n))
    memory = next((m for n, m in zip(device_names, total_mem) if n == name and m), None)
    note = "" if len(counts) == 1 else f" (mixed devices {sorted(counts)}; most common used)"
    return name, memory, note


def _aligned_memory(device_names: Sequence[str],
                    total_mem: Sequence[int | None] | int | None) -> list[int | None]:
    if total_mem is None or isinstance(total_mem, int):
        return [total_mem] * len(device_names)
    if len(total_mem) != len(device_names):
        raise ValueError("total_mem must align with device_names")
    return list(total_mem)


def _gpu_fields(profile: GpuProfile | None, chosen_by: str) -> dict[str, Sourced]:
    """Profile-derived GPU fields; ``unknown`` when no profile was found."""
    if profile is None:
        missing = Sourced(None, "unknown", f"no hardware profile ({chosen_by})")
        return {name: missing for name in ("peak_tflops", "hbm_gbps", "intra_node_link",
                                           "intra_node_gbps", "intra_node_alpha_us", "peak_fp32_tflops",
                                           "peak_tf32_tflops", "peak_fp8_tflops")}
    prefix = f"profile {profile.id} ({chosen_by}): "

    def from_profile(attr: str) -> Sourced:
        value = getattr(profile, attr)
        return Sourced(value, "profile" if value is not None else "unknown", prefix + profile.sources[attr])

    return {
        "peak_tflops": from_profile("peak_bf16_tflops"),
        "peak_fp32_tflops": from_profile("peak_fp32_tflops"),
        "peak_tf32_tflops": from_profile("peak_tf32_tflops"),
        "peak_fp8_tflops": from_profile("peak_fp8_tflops"),
        "hbm_gbps": from_profile("hbm_gbps"),
        "intra_node_link": Sourced(profile.intra_node_link, "profile", prefix + profile.label),
        "intra_node_gbps": from_profile("intra_node_gbps"),
        "intra_node_alpha_us": from_profile("intra_node_alpha_us"),
    }


def _nic_fields(line_rate: Sourced) -> dict[str, Sourced]:
    nic = nic_profile(line_rate.value)
    if nic is not None:
        prefix = f"profile {nic.line_rate_gbit}G NIC: "
        return {"nic_gbps": Sourced(nic.achievable_gbps, "profile",
                                    prefix + nic.sources["achievable_gbps"]),
                "nic_alpha_us": Sourced(nic.alpha_us, "profile", prefix + nic.sources["alpha_us"])}
    defaults = load_profiles().defaults
    efficiency = defaults["unknown_nic_efficiency"]
    alpha_nic = nic_profile(defaults["nic_line_rate_gbit"]["value"])
    return {
        "nic_gbps": Sourced(line_rate.value / 8 * efficiency["value"], "default",
                            f"no {line_rate.value}G profile: {efficiency['source']}"),
        "nic_alpha_us": Sourced(alpha_nic.alpha_us, "default",
                                f"no {line_rate.value}G profile: {alpha_nic.sources['alpha_us']}"),
    }


def resolve_hardware(device_names: Sequence[str] = (),
                     total_mem: Sequence[int | None] | int | None = None,
                     overrides: Mapping[str, Any] | None = None, *,
                     gpus_per_node: int | None = None) -> HardwareAssumptions:
    """Resolve the hardware of a run from the trace, the profiles and the user's overrides.

    device_names / total_mem: ``deviceProperties`` ``name`` / ``totalGlobalMem`` (bytes) of the
    trace (one per device, or one memory for all); gpus_per_node: the topology's measured
    value (else the number of device names, else the default 8). Overrides (keys in
    OVERRIDE_KEYS) win over everything and are marked ``user``. NICs default to one 400G NIC
    per GPU (``nics_per_node = gpus_per_node``), marked ``default``.
    """
    user = _check_overrides(overrides or {})
    memories = _aligned_memory(device_names, total_mem)
    # a device without a usable name is dropped with its memory (the two lists stay aligned)
    kept = [(n, m) for n, m in zip(device_names, memories) if isinstance(n, str) and n.strip()]
    names, memories = [n for n, _ in kept], [m for _, m in kept]
    defaults = load_profiles().defaults
    result: dict[str, Sourced] = {}

    if "gpu" in user:
        profile = gpu_profile(str(user["gpu"]))
        result["gpu_name"] = Sourced(str(user["gpu"]), "user", "--gpu override")
        result["gpu_profile"] = Sourced(profile.id, "user", "--gpu override")
        chosen_by, measured_memory = "selected by --gpu", None
    elif names:
        name, measured_memory, note = _most_common_device(names, memories)
        profile = match_gpu(name, measured_memory)
        result["gpu_name"] = Sourced(name, "measured", "trace deviceProperties.name" + note)
        result["gpu_profile"] = (
            Sourced(profile.id, "profile", f"matched from device name {name!r}") if profile
            else Sourced(None, "unknown", f"no profile matches device name {name!r}"))
        chosen_by = f"matched from {name!r}"
    else:
        profile, measured_memory, chosen_by = None, None, "no deviceProperties in the trace"
        result["gpu_name"] = Sourced(None, "unknown", chosen_by)
        result["gpu_profile"] = Sourced(None, "unknown", chosen_by)
    result.update(_gpu_fields(profile, chosen_by))

    if measured_memory:
        result["memory_bytes"] = Sourced(int(measured_memory), "measured",
                                         "trace deviceProperties.totalGlobalMem")
    elif profile is not None:
        result["memory_bytes"] = Sourced(int(profile.memory_gb * _GIB), "profile",
                                         f"profile {profile.id}: {profile.sources['memory_gb']}"
                                         " (GB taken as GiB)")
    else:
        result["memory_bytes"] = Sourced(None, "unknown", "no totalGlobalMem and no profile")

    if gpus_per_node is not None:
        result["gpus_per_node"] = Sourced(gpus_per_node, "measured", "trace topology")
    elif names:
        result["gpus_per_node"] = Sourced(len(names), "measured",
                                          "number of trace deviceProperties entries")
    else:
        default = defaults["gpus_per_node"]
        result["gpus_per_node"] = Sourced(default["value"], "default", default["source"])
    if "gpus_per_node" in user:
        result["gpus_per_node"] = Sourced(user["gpus_per_node"], "user", "override")

    nics = defaults["nics_per_gpu"]
    result["nics_per_node"] = Sourced(nics["value"] * result["gpus_per_node"].value, "default",
                                      nics["source"])
    rate = defaults["nic_line_rate_gbit"]
    result["nic_line_rate_gbit"] = Sourced(rate["value"], "default", rate["source"])
    for key in ("nics_per_node", "nic_line_rate_gbit"):
        if key in user:
            result[key] = Sourced(user[key], "user", "override")
    result.update(_nic_fields(result["nic_line_rate_gbit"]))

    for key in ("memory_bytes", "peak_tflops", "hbm_gbps", "intra_node_gbps",
                "intra_node_alpha_us", "nic_gbps", "nic_alpha_us"):
        if key in user:
            result[key] = Sourced(user[key], "user", "override")
    return HardwareAssumptions(**result)


#: The fields a GPU decides (its profile's, and its own memory); the rest is the job's network.
_DEVICE_FIELDS = ("gpu_name", "gpu_profile", "memory_bytes", "peak_tflops", "peak_fp32_tflops",
                  "peak_tf32_tflops", "peak_fp8_tflops", "hbm_gbps", "intra_node_link", "intra_node_gbps",
                  "intra_node_alpha_us")


def for_device(hardware: HardwareAssumptions, device_name: str | None,
               total_mem: int | None) -> HardwareAssumptions:
    """The job's hardware with one rank's own GPU (issue 41: ranks of a job on different GPUs):
    that device's profile fields and memory where its name is not the job's, unless ``--gpu``
    chose one GPU for every rank; a field the user overrode stays the user's."""
    if hardware.gpu_name.origin == "user" or not device_name or device_name == hardware.gpu_name.value:
        return hardware
    own = resolve_hardware([device_name], [total_mem], gpus_per_node=hardware.gpus_per_node.value)
    fields_of_device = {name: getattr(own, name) for name in _DEVICE_FIELDS}
    fields_of_device.update({name: getattr(hardware, name) for name in hardware.names_by_origin("user")})
    return replace(hardware, **fields_of_device)
