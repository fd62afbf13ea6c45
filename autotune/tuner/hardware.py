"""What a machine can do, from its datasheet: the cost model's starting point before anything
is measured, and all ``autotune plan`` has for hardware the user does not have at hand.

A catalog of common training GPUs (:data:`CATALOG`, datasheet figures for the SXM parts with
their usual nodes: 8 per node over NVLink, one InfiniBand port per GPU), a generic entry for
CPU ranks (gloo over shared memory), and JSON files with the same fields for anything else
(:func:`load_hardware`). Figures are peaks; the cost model fits what a run achieves of them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from autotune.config import ConfigError

PRECISIONS = ("fp32", "fp16", "bf16")


@dataclass(frozen=True)
class Hardware:
    """One accelerator and the links around it (all rates per GPU, bytes and FLOPs per second).

    Attributes:
        name: what it is called (``a100-80gb``).
        peak_flops: dense peak per precision (``fp32`` is what fp32 matmuls get by default:
            TF32 where the part has it and frameworks use it, else plain fp32).
        memory_bytes: device memory.
        memory_bandwidth: device memory bandwidth.
        intra_node_bandwidth: one direction of the GPU's link to its node peers (NVLink).
        inter_node_bandwidth: one direction of the GPU's share of the network between nodes.
        host_bandwidth: one direction of the link to the host (PCIe), for offloading.
        host_update_rate: parameters per second an offloaded optimizer updates on the host
            (for one GPU's share of the host's cores).
        gpus_per_node: the usual node.
    """

    name: str
    peak_flops: Mapping[str, float]
    memory_bytes: int
    memory_bandwidth: float
    intra_node_bandwidth: float
    inter_node_bandwidth: float
    host_bandwidth: float
    host_update_rate: float
    gpus_per_node: int = 8

    def flops(self, precision: str) -> float:
        """Peak FLOP/s at ``precision`` (``fp32``, ``fp16``, ``bf16``); a part without bf16
        (V100) runs it as fp32."""
        return float(self.peak_flops.get(precision) or self.peak_flops["fp32"])

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["peak_flops"] = dict(self.peak_flops)
        return data


_GB, _TB = 1e9, 1e12
_GIB = 1 << 30

CATALOG: dict[str, Hardware] = {
    hw.name: hw
    for hw in (
        # V100 SXM2 32GB: 125 TFLOPS fp16 tensor, 15.7 fp32; HBM2 900 GB/s; NVLink2 six links of
        # 25 GB/s each way (DGX-2's NVSwitch gives each GPU that much to any peer); EDR IB.
        Hardware(
            "v100-32gb",
            {"fp32": 15.7 * _TB, "fp16": 125 * _TB},
            32 * _GIB,
            900 * _GB,
            150 * _GB,
            12.5 * _GB,
            16 * _GB,
            2e8,
            gpus_per_node=16,
        ),
        # A100 SXM4: 312 TFLOPS fp16/bf16, 156 TF32; HBM2 1555 GB/s (80GB: 2039); NVLink3 300
        # GB/s each way; HDR IB 200 Gb/s per GPU; PCIe 4.
        Hardware(
            "a100-40gb",
            {"fp32": 156 * _TB, "fp16": 312 * _TB, "bf16": 312 * _TB},
            40 * _GIB,
            1555 * _GB,
            300 * _GB,
            25 * _GB,
            32 * _GB,
            3e8,
        ),
        Hardware(
            "a100-80gb",
            {"fp32": 156 * _TB, "fp16": 312 * _TB, "bf16": 312 * _TB},
            80 * _GIB,
            2039 * _GB,
            300 * _GB,
            25 * _GB,
            32 * _GB,
            3e8,
        ),
        # H100 SXM5: 989 TFLOPS fp16/bf16 dense, 494 TF32; HBM3 3.35 TB/s; NVLink4 450 GB/s each
        # way; NDR IB 400 Gb/s per GPU; PCIe 5.
        Hardware(
            "h100-80gb",
            {"fp32": 494 * _TB, "fp16": 989 * _TB, "bf16": 989 * _TB},
            80 * _GIB,
            3350 * _GB,
            450 * _GB,
            50 * _GB,
            64 * _GB,
            4e8,
        ),
        # H200: the H100's compute with 141 GB of HBM3e at 4.8 TB/s.
        Hardware(
            "h200-141gb",
            {"fp32": 494 * _TB, "fp16": 989 * _TB, "bf16": 989 * _TB},
            141 * 10**9,
            4800 * _GB,
            450 * _GB,
            50 * _GB,
            64 * _GB,
            4e8,
        ),
    )
}

# CPU ranks: a core or two of a server CPU each (vector FMA units at a few tens of GFLOP/s in
# practice), gloo over loopback and shared memory. A broad guess: the fit replaces it after
# the first measurements.
CPU_RANK = Hardware(
    "cpu",
    {"fp32": 50 * _GB, "fp16": 10 * _GB, "bf16": 25 * _GB},
    16 * _GIB,
    10 * _GB,
    2 * _GB,
    1 * _GB,
    10 * _GB,
    2e8,
    gpus_per_node=1,
)

_REQUIRED = tuple(f.name for f in fields(Hardware) if f.name not in ("gpus_per_node",))


def hardware_names() -> list[str]:
    return sorted(CATALOG)


def load_hardware(name_or_path: str) -> Hardware:
    """A catalog entry by name (``v100-32gb``), or a JSON file with :class:`Hardware`'s fields
    (``peak_flops`` a mapping of precision to FLOP/s; ``name`` defaults to the file's stem),
    or a profile ``autotune serve`` wrote (those fields under ``hardware``, beside the
    ``cost_model`` fitted there, which ``autotune plan`` predicts with).

    Raises:
        ConfigError: an unknown name, or a file that is missing, not JSON, or lacks a field
            (the message names it).

    Example:
        >>> load_hardware("a100-80gb").flops("bf16")
        312000000000000.0
    """
    key = name_or_path.strip().lower()
    if key in CATALOG:
        return CATALOG[key]
    path = Path(name_or_path)
    if not path.suffix == ".json" and not path.exists():
        raise ConfigError(
            "--hardware",
            f"unknown hardware {name_or_path!r}: one of {', '.join(hardware_names())}, or a "
            "JSON file with the same fields",
        )
    try:
        data = json.loads(path.read_text())
    except OSError as err:
        raise ConfigError("--hardware", f"{path}: {err.strerror or err}") from None
    except json.JSONDecodeError as err:
        raise ConfigError(
            "--hardware", f"{path}: not JSON ({err.msg}, line {err.lineno})"
        ) from None
    if isinstance(data, dict) and isinstance(data.get("hardware"), dict) and "cost_model" in data:
        data = data["hardware"]  # a profile autotune serve fitted: its hardware's fields
    if not isinstance(data, dict):
        raise ConfigError("--hardware", f"{path}: expected a JSON object of hardware fields")
    data.setdefault("name", path.stem)
    return hardware_from_fields(data, str(path))


def hardware_from_fields(data: Mapping[str, Any], source: str) -> Hardware:
    """:class:`Hardware` from its fields as JSON holds them (a file's, or the ``hardware`` of a
    profile ``autotune serve`` fitted); ``source`` names them in an error.

    Raises:
        ConfigError: a field is missing, unknown or not a positive number.
    """
    data = dict(data)
    missing = [f for f in _REQUIRED if f not in data]
    if missing:
        raise ConfigError("--hardware", f"{source}: missing {', '.join(missing)}")
    unknown = sorted(set(data) - {f.name for f in fields(Hardware)})
    if unknown:
        raise ConfigError("--hardware", f"{source}: unknown field {unknown[0]!r}")
    peaks = data["peak_flops"]
    if not isinstance(peaks, dict) or "fp32" not in peaks:
        raise ConfigError("--hardware", f"{source}: peak_flops needs at least an fp32 figure")
    try:
        hardware = Hardware(
            name=str(data["name"]),
            peak_flops={str(k): float(v) for k, v in peaks.items()},
            memory_bytes=int(float(data["memory_bytes"])),
            **{
                f: float(data[f])
                for f in (
                    "memory_bandwidth",
                    "intra_node_bandwidth",
                    "inter_node_bandwidth",
                    "host_bandwidth",
                    "host_update_rate",
                )
            },
            gpus_per_node=int(data.get("gpus_per_node", 8)),
        )
    except (TypeError, ValueError) as err:
        raise ConfigError("--hardware", f"{source}: {err}") from None
    values = [hardware.memory_bytes, hardware.memory_bandwidth, *hardware.peak_flops.values()]
    if min(values) <= 0 or hardware.gpus_per_node < 1:
        raise ConfigError("--hardware", f"{source}: every figure must be positive")
    return hardware


def hardware_for_device(device_name: str | None) -> Hardware:
    """The catalog entry a device's name matches (``NVIDIA H100 80GB HBM3`` → ``h100-80gb``);
    CPU ranks (None) get :data:`CPU_RANK`; an unknown GPU the closest by generation, else
    the H100 (the fit corrects it)."""
    if device_name is None:
        return CPU_RANK
    name = device_name.lower()
    for part, entry in (
        ("h200", "h200-141gb"),
        ("h100", "h100-80gb"),
        ("a100-sxm4-40", "a100-40gb"),
        ("a100-pcie-40", "a100-40gb"),
        ("a100", "a100-80gb"),
        ("v100", "v100-32gb"),
    ):
        if part in name:
            return CATALOG[entry]
    return CATALOG["h100-80gb"]
