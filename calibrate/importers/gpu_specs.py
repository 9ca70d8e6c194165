"""Convert gpu_specs.csv (datasheet facts, see gpu_specs_SOURCES.md) into conf/hardware/<key>.yaml.

The CSV is the single place where spec numbers are maintained; the YAML files
are generated so the two never drift. What the CSV cannot hold (lookup aliases
and a short provenance note) lives in ALIASES / SOURCES below; when re-run, a
non-empty `aliases` or `sources` already present in an existing YAML file wins,
so hand edits there survive regeneration from a newer CSV.

A number no public source states is derived by a stated rule and marked in the
CSV's optional `derived` column: `field=rule` entries separated by ';' (field: a
number column's Hardware name, peaks as `peak_tflops.<dtype>`). The YAML carries
them as `derived: {field: rule}` (Hardware.derived); a null field may be named
there too, with the reason it is absent.

Usage:  python -m kernelsight.calibrate.importers.gpu_specs path/to/gpu_specs.csv [out_dir]
"""
from __future__ import annotations

import csv
import sys
import textwrap
from pathlib import Path
from typing import Any

import yaml

from kernelsight.predictor.errors import KernelsightError
from kernelsight.predictor.hardware import DTYPES, Hardware, hardware_dir
from kernelsight.predictor.outputs import ensure_dir, write_text

__all__ = ["ALIASES", "SOURCES", "convert_gpu_specs", "read_gpu_specs"]

# CSV column -> peak_tflops dtype
_PEAK_COLUMNS = {
    "fp32_tflops": "fp32",
    "tf32_tflops_dense": "tf32",
    "bf16_tflops_dense": "bf16",
    "fp16_tflops_dense": "fp16",
    "fp8_tflops_dense": "fp8",
    "int8_tops_dense": "int8",
    "fp4_tflops_dense": "fp4",
}
_STR_COLUMNS = ("key", "name", "vendor", "arch", "compute_capability")
_INT_COLUMNS = ("num_sms", "pcie_gen")
_FLOAT_COLUMNS = ("boost_clock_mhz", "mem_gb", "mem_bw_gbs", "l2_mb", "smem_per_sm_kb", "tdp_w",
                  "nvlink_gbs_per_dir", "pcie_gbs_per_dir")
# Present in the CSV but not a Hardware field (memory technology is noted in `sources` where it matters).
_IGNORED_COLUMNS = ("mem_type",)
# May be absent (tables written before derived values or PCIe peer-to-peer were marked).
_OPTIONAL_COLUMNS = ("derived", "pcie_p2p")
# pcie_p2p cells: yes / no, empty = not known (Hardware.pcie_p2p).
_BOOL_CELLS = {"yes": True, "no": False}
_ALL_COLUMNS = set(_STR_COLUMNS) | set(_INT_COLUMNS) | set(_FLOAT_COLUMNS) | set(_PEAK_COLUMNS) \
    | set(_IGNORED_COLUMNS)
assert set(_PEAK_COLUMNS.values()) == set(DTYPES)

# Raw device names seen in the reference data (nvidia-smi / torch.cuda.get_device_name as recorded by
# aiconfigurator `device`, NeuSight `Device`, Vidur folder names a100/h100) plus common short names.
# An alias may appear under one key only (the loader enforces it).
ALIASES: dict[str, list[str]] = {
    "v100_pcie": ["Tesla V100-PCIE-32GB", "NVIDIA Tesla V100 PCIe 32GB"],
    "v100_sxm": ["Tesla V100-SXM2-32GB", "NVIDIA Tesla V100 SXM2 32GB", "v100"],
    "p100_pcie": ["Tesla P100-PCIE-16GB", "NVIDIA Tesla P100 PCIe 16GB", "p100"],
    "p4": ["Tesla P4", "NVIDIA Tesla P4"],
    "t4": ["Tesla T4", "NVIDIA T4"],
    "a10": ["NVIDIA A10"],
    "a100_pcie_40g": ["NVIDIA A100-PCIE-40GB", "a100_pcie_40gb"],
    "a100_sxm_40g": ["NVIDIA A100-SXM4-40GB", "a100_sxm4_40gb"],
    "a100_sxm": ["NVIDIA A100-SXM4-80GB", "a100", "a100_sxm4", "a100_sxm4_80gb"],
    "a100_pcie": ["NVIDIA A100 80GB PCIe", "NVIDIA A100 PCIe 80GB", "a100_pcie_80gb"],
    "a30": ["NVIDIA A30"],
    "l4": ["NVIDIA L4"],
    "l40s": ["NVIDIA L40S"],
    "h100_pcie": ["NVIDIA H100 PCIe", "NVIDIA H100 PCIe 80GB", "h100_pcie_80gb"],
    "h100_sxm": ["NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM5 80GB", "h100", "h100_sxm5"],
    "h200_sxm": ["NVIDIA H200", "NVIDIA H200 SXM 141GB", "h200"],
    "gh200": ["NVIDIA GH200 480GB", "NVIDIA GH200 120GB"],
    "b200_sxm": ["NVIDIA B200", "b200"],
    "gb200": ["NVIDIA GB200"],
    "b300_sxm": ["NVIDIA B300 SXM6 AC", "NVIDIA B300", "b300"],
    "gb300": ["NVIDIA GB300"],
    "rtx_pro_6000_server": ["NVIDIA RTX PRO 6000 Blackwell Server Edition", "rtx_pro_6000"],
    "mi100": ["AMD Instinct MI100"],
    "mi210": ["AMD Instinct MI210"],
    "mi250": ["AMD Instinct MI250", "mi250_gcd"],
    "mi300x": ["AMD Instinct MI300X"],
    "a10g": ["NVIDIA A10G"],
    "rtx_4090": ["NVIDIA GeForce RTX 4090", "GeForce RTX 4090"],
    "rtx_6000_ada": ["NVIDIA RTX 6000 Ada Generation", "RTX 6000 Ada Generation"],
    "l20": ["NVIDIA L20"],
    "h20": ["NVIDIA H20"],
    "mi325x": ["AMD Instinct MI325X"],
    "mi355x": ["AMD Instinct MI355X"],
    "h100_nvl": ["NVIDIA H100 NVL", "NVIDIA H100 NVL 94GB"],
    "h800_sxm": ["NVIDIA H800", "NVIDIA H800 80GB HBM3", "NVIDIA H800 SXM5 80GB", "h800"],
    "a800_sxm": ["NVIDIA A800-SXM4-80GB", "a800"],
    "l40": ["NVIDIA L40"],
    "rtx_5090": ["NVIDIA GeForce RTX 5090", "GeForce RTX 5090"],
}

# Short provenance per row; gpu_specs_SOURCES.md has the cell-by-cell evidence.
SOURCES: dict[str, str] = {
    "v100_pcie": (
        "Launch/datasheet figures: 14 TFLOPS FP32, 112 FP16 tensor, 900 GB/s, 250 W. SM count, 1380 MHz max "
        "clock and 6 MiB L2 from deviceQuery logs; the vendor peaks correspond to ~1370 MHz. Volta has no "
        "BF16/TF32 and no INT8 tensor cores (null)."),
    "v100_sxm": (
        "NVIDIA V100 datasheet: 15.7 FP32, 125 FP16 tensor, NVLink 300 GB/s bidirectional = 150 per direction. "
        "SM count, 1530 MHz and L2 from deviceQuery. FP16 is the only tensor dtype on Volta; a 16 GB SKU "
        "also exists (same bandwidth)."),
    "p100_pcie": (
        "Launch table: 9.3 FP32, 18.7 FP16, 250 W; SMs, 1329 MHz max clock and 4 MiB L2 from deviceQuery. "
        "fp16 is packed FP16 on CUDA cores (no tensor cores on Pascal). Trap: NeuSight's 1380 MHz contradicts "
        "its own FLOPs figure (1328 MHz)."),
    "p4": (
        "Launch table: 5.5 TFLOPS FP32 at the 1063 MHz vendor boost (1114 MHz is the device max); datasheet "
        "INT8 22 TOPS is DP4A on CUDA cores. Trap: 20 SMs x 128 lanes per deviceQuery, not NeuSight's 40 x 64. "
        "No FP16 rate is published."),
    "t4": (
        "T4 datasheet: 8.1 FP32, 65 FP16 tensor, 130 INT8, 70 W (Turing has no sparsity, so these are dense). "
        "SMs, 1590 MHz and 4 MiB L2 from deviceQuery and NeuSight; about 15 GiB of the 16 GB is usable."),
    "a10": (
        "A10 product page: 31.2 FP32, TF32 62.5, BF16/FP16 125, INT8 250 (dense = half the sparse figure). "
        "72 SMs, 1695 MHz and 6 MiB L2 from deviceQuery. PCIe Gen4 card without NVLink."),
    "a100_pcie_40g": (
        "A100 datasheet dense peaks (19.5 FP32 / 156 TF32 / 312 BF16, FP16 / 624 INT8); SMs, clock, memory and "
        "L2 as in NeuSight's device config. 250 W from the product brief (recalled). NVLink 300 per direction "
        "only through the optional 2-GPU bridge, otherwise PCIe."),
    "a100_sxm_40g": (
        "A100 datasheet dense peaks; 108 SMs, 1410 MHz and 40 MiB L2 from deviceQuery; 1555 GB/s HBM2, 400 W. "
        "NVLink 600 GB/s bidirectional = 300 per direction."),
    "a100_sxm": (
        "aiconfigurator a100_sxm system file (312 BF16, 624 INT8, 2039 GB/s, 400 W, NVLink 300 per direction, "
        "PCIe Gen4) and the A100 datasheet for FP32/TF32. SMs, 1410 MHz and 40 MiB L2 from deviceQuery. "
        "No FP8 on Ampere."),
    "a100_pcie": (
        "aiconfigurator a100_pcie (312 BF16, 1935 GB/s, 300 W) and the A100 datasheet; SMs, clock and L2 from "
        "NeuSight's device config. Flag: NVLink 300 per direction needs the optional 2-GPU bridge; "
        "aiconfigurator models this card as PCIe-only."),
    "a30": (
        "aiconfigurator a30 (165 BF16, 330 INT8, 933 GB/s, 165 W) and the A30 datasheet (10.3 FP32, 82 TF32). "
        "SM count, 1440 MHz and L2 come from a third-party database (no device log found): medium confidence. "
        "NVLink only via the optional bridge."),
    "l4": (
        "Datasheet (sparse figures halved) and aiconfigurator l4 (121 BF16, 300 GB/s, 72 W); deviceQuery for "
        "SMs, 2040 MHz and 48 MiB L2. Trap: 58 SMs are enabled; NeuSight and TechPowerUp-style pages count "
        "the full die (60), which overstates FP32 by about 3%."),
    "l40s": (
        "L40S datasheet (dense; sparse halved) and aiconfigurator l40s; SMs, 2520 MHz and L2 from deviceQuery. "
        "Trap: L2 is 96 MiB as the driver reports it, not the 48 MB some third-party pages list. No NVLink."),
    "h100_pcie": (
        "H100 spec table (sparse figures halved) and aiconfigurator h100_pcie; deviceQuery for 114 SMs, the "
        "1755 MHz max clock and 50 MiB L2. Trap: tensor peaks are at the 1620 MHz tensor clock. NVLink 300 per "
        "direction only via the optional bridge (aiconfigurator: PCIe-only)."),
    "h100_sxm": (
        "H100 SXM spec table, aiconfigurator h100_sxm and ml-engineering; SMs, 1980 MHz max clock and 50 MiB L2 "
        "from deviceQuery. Trap: BF16/FP16 989.4 dense = 132 SM x 4 TC x 512 FMA x 2 at the 1830 MHz tensor "
        "clock (1979 is with sparsity), while FP32 67 uses 1980 MHz. NeuSight's 3430 GB/s is not the vendor "
        "3350 used here."),
    "h200_sxm": (
        "aiconfigurator h200_sxm and ml-engineering; same compute die as H100 SXM (989.4 BF16 at 1830 MHz) with "
        "141 GB HBM3e at 4.8 TB/s. L2 60 MiB as the driver reported it on a lent H200 (GH200, same 6-stack "
        "layout, reports 60 too); the 50 MiB often quoted is copied from H100."),
    "gh200": (
        "The Hopper GPU of a GH200 superchip, 96 GB HBM3 variant; deviceQuery for SMs, 1980 MHz and 60 MiB L2, "
        "peaks as H100 SXM. TDP and PCIe are null: power is published only for the whole module and the host "
        "link is NVLink-C2C (450 GB/s per direction). The 144 GB HBM3e GH200 is a different entry."),
    "b200_sxm": (
        "HGX B200 datasheet (sparse halved: 75 FP32, 2250 BF16, 4500 FP8, 9000 FP4; 7.7 TB/s; 1000 W) and "
        "aiconfigurator b200_sxm; 148 SMs and 126.5 MiB L2 from a driver query. Trap: do not mix in GB200 "
        "values (80 FP32, 2500 BF16, 8 TB/s). PCIe Gen5 per the vendor sheet (aiconfigurator says Gen6)."),
    "gb200": (
        "One Blackwell GPU of a GB200 superchip (1 Grace + 2 GPUs), from the per-GPU GB200 NVL72 datasheet "
        "table and aiconfigurator gb200. 152 SMs from device logs; 2062 MHz from nvidia-smi reproduces 80 "
        "TFLOPS FP32. PCIe null (host link is NVLink-C2C); L2 126 MiB from the tuning guide, not measured."),
    "b300_sxm": (
        "Blackwell Ultra per-GPU datasheet table and aiconfigurator b300_sxm; 148 SMs, 2032 MHz and 126.5 MiB "
        "L2 from device logs. Trap: INT8 was cut to 153.5 TOPS dense (some tables copy B200's 4500). FP4 "
        "14 PF dense (sources range 12.6-15); 270 GB usable of 288 physical."),
    "gb300": (
        "One Blackwell Ultra GPU of a GB300 superchip, from the per-GPU datasheet table and aiconfigurator "
        "gb300; 152 SMs from device logs. INT8 cut to 165 TOPS dense. DERIVED (see `derived`): max clock 2056 "
        "MHz from the FP32 peak (no device log found) and L2 126.5 MiB from B300 (same die). PCIe null: the host "
        "link is NVLink-C2C to Grace."),
    "rtx_pro_6000_server": (
        "aiconfigurator rtx_pro_6000_server: its tensor peaks scale RTX PRO 6000 ratios to the observed 2430 "
        "MHz (derived, not a Server Edition datasheet); FP32 derived the same way. 188 SMs and 128 MiB L2 from "
        "device logs; 1792 GB/s is the GDDR7 family figure. No NVLink. TF32 and FP16 are unpublished: DERIVED "
        "from BF16 (TF32 half of it, FP16 equal; see `derived`)."),
    "mi100": (
        "AMD MI100 spec table (23.1 FP32 vector, 92.3 BF16, 184.6 FP16/INT8 matrix, 1.23 TB/s, 300 W) and the "
        "ROCm GPU table (120 CUs, 8 MiB L2, 64 KiB LDS). num_sms counts CUs, compute_capability is the gfx "
        "target; the 'nvlink' figure is Infinity Fabric via bridge (276 GB/s bidirectional / 2)."),
    "mi210": (
        "AMD MI210 spec table and the ROCm GPU table (104 CUs, 8 MiB L2, 64 KiB LDS); BF16 runs at the FP16 "
        "rate on CDNA2. Trap: NeuSight lists L2 16 (the 2-GCD MI250 total). 'nvlink' is the Infinity Fabric "
        "bridge, 3 links x 50 GB/s per direction."),
    "mi250": (
        "Per GCD (an MI250 package = 2 GCDs = 2 ROCm devices): AMD package figures halved (45.3 FP32, 362.1 "
        "BF16/FP16/INT8, 3.2768 TB/s) and ROCm docs for 104 CUs and 8 MiB L2 per GCD. DERIVED (see `derived`): "
        "TDP 280 W = the 560 W package figure / 2, and Infinity Fabric 150 GB/s per direction = 3 of the "
        "package's 6 external links x 50 (in-package GCD-GCD links not counted)."),
    "mi300x": (
        "AMD MI300X datasheet and ml-engineering (163.4 FP32, 1307.4 BF16/FP16, 2614.9 FP8/INT8 dense, 5.3 "
        "TB/s, 750 W); ROCm table for 304 CUs. l2_mb counts only the 32 MiB per-XCD L2, not the 256 MiB "
        "Infinity Cache. 'nvlink' = 7 Infinity Fabric links, 448 GB/s per direction in total."),
    "a10g": (
        "AWS's GA102 variant (G5 instances). 80 SMs, 1710 MHz max clock and a 300 W power cap from public device "
        "logs; 35 FP32 and 70 BF16/FP16, 35 TF32, 140 INT8 dense as Baseten's A10 vs A10G spec table lists them "
        "(half the A10's tensor rate per SM, a GeForce-class FP32-accumulate rate). 24 GB GDDR6 at 600 GB/s. "
        "L2 6 MiB DERIVED from the A10 (same die)."),
    "rtx_4090": (
        "GeForce (AD102, 128 SMs, 2520 MHz boost, 450 W, 24 GB GDDR6X at 1008 GB/s, 72 MB L2). Tensor peaks are the "
        "Ada whitepaper's FP32-accumulate rates that PyTorch uses (165.2 BF16/FP16, 330.3 FP8, 660.6 INT8, 82.6 "
        "TF32), as third-party copies reproduce them; GeForce runs FP16 with FP16 accumulate at twice that."),
    "rtx_6000_ada": (
        "Workstation AD102: 142 SMs (same count as L40S), 2505 MHz boost, 91.1 TFLOPS FP32, 48 GB GDDR6 at 960 "
        "GB/s, 96 MB L2, 300 W (press and PNY/Leadtek specs). Tensor peaks DERIVED: 142 SMs x the professional Ada "
        "rate x 2.505 GHz (364.2 BF16/FP16, FP8/INT8 twice, TF32 half); no vendor dense table was found."),
    "l20": (
        "China-market AD102 cut: 92 SMs, 2520 MHz boost, 59.35 FP32, 48 GB GDDR6 at 864 GB/s, 96 MB L2, 275 W, "
        "PCIe Gen4 (TechPowerUp-derived pages). Tensor peaks (119.5 BF16/FP16, 239 FP8/INT8) are the datasheet "
        "figures as recalled and consistent with half the professional Ada rate per SM: marked DERIVED."),
    "h20": (
        "China-market GH100 cut: 78 SMs (device logs), 148 FP16, 296 FP8/INT8, 74 TF32, 44 FP32 (press copies of "
        "the spec sheet), 96 GB HBM3 at 4.0 TB/s, 60 MB L2, 400 W, NVLink 900 GB/s. Clock DERIVED: 1980 MHz as "
        "the other GH100 parts report (the 44 TFLOPS FP32 figure does not fit 78 SMs at any Hopper clock)."),
    "mi325x": (
        "Same CDNA3 compute as MI300X (304 CUs, 2100 MHz, 163.4 FP32, 1307.4 BF16/FP16, 2614.9 FP8/INT8 dense; "
        "ml-engineering) with 256 GB HBM3e at 6 TB/s and 1000 W. ROCm table: 32 MiB L2 (4 per XCD, Infinity "
        "Cache not included), 64 KiB LDS. 'nvlink' = 7 Infinity Fabric links, DERIVED from MI300X's link rate."),
    "h100_nvl": (
        "PCIe GH100 card (bridged in pairs): 132 SMs, 1785 MHz max clock (device log), 60 FP32, 835.5 BF16/FP16 "
        "and 1670.5 FP8/INT8 dense (NVIDIA's sheet with sparsity, halved), 94 GB HBM3 at 3.9 TB/s, 60 MiB L2 "
        "(device log), 400 W (350-400 configurable), NVLink bridge 600 GB/s between the two cards of a pair."),
    "h800_sxm": (
        "China-market H100 SXM5: the same 132-SM GH100 cut, 1980 MHz, 50 MB L2, 80 GB at 3.35 TB/s, 700 W (device "
        "logs and distributor copies of the sheet) and H100 SXM's tensor rates; NVLink cut to 400 GB/s."),
    "a800_sxm": (
        "China-market A100 SXM4 80GB: 108 SMs, 19.5 FP32, 312 BF16/FP16 dense, 2039 GB/s, 400 W (third-party "
        "tables, device logs); NVLink cut to 400 GB/s (NVIDIA's A800 page). Clock and L2 DERIVED from the A100."),
    "l40": (
        "AD102, 142 SMs like the L40S, at half its tensor rates (NVIDIA's L40 datasheet: 181.05 BF16/FP16, 362 "
        "FP8/INT8 dense), 90.5 FP32, 48 GB GDDR6 at 864 GB/s, 96 MB L2, 300 W, PCIe Gen4, no NVLink."),
    "rtx_5090": (
        "GeForce GB202: 170 SMs, 2407 MHz, 96 MiB L2, 1792 GB/s GDDR7 (three deviceQuery logs), 104.8 FP32, 209.5 "
        "BF16/FP16 with FP32 accumulate (whitepaper), 575 W, PCIe Gen5, no P2P. FP8 and INT8 DERIVED (838)."),
    "mi355x": (
        "CDNA4 (gfx950): 256 CUs, 2400 MHz, 157.3 FP32, 2516.6 BF16/FP16, 5033.2 FP8/INT8, 10066.3 MXFP4 dense "
        "(AMD rounds to 2.5/5/10.1 PF; ml-engineering), 288 GB HBM3e at 8 TB/s, 1400 W. ROCm table: 32 MiB L2, "
        "160 KiB LDS. No TF32 figure is published (null: TF32 kernels are refused). 'nvlink' DERIVED: 7 links x "
        "153.6 GB/s / 2."),
}

_HEADER = ("# Generated by calibrate/importers/gpu_specs.py from {csv}.\n"
           "# Numbers: edit the CSV and regenerate. `aliases` and `sources` may be edited here; they are kept.\n"
           "# Units: TFLOPS dense (int8: TOPS), GB/s decimal per direction, L2 MiB, smem KiB; null = unknown.\n")


def _cell(row: dict[str, str], column: str, kind: type, where: str) -> Any:
    raw = (row.get(column) or "").strip()
    if raw == "":
        return None
    if kind is str:
        return raw
    try:
        value = float(raw)
    except ValueError:
        raise KernelsightError(f"{where}: column {column!r} = {raw!r} is not a number") from None
    if kind is int:
        if not value.is_integer():
            raise KernelsightError(f"{where}: column {column!r} = {raw!r} must be an integer")
        return int(value)
    return value


def _derived_cell(raw: str, where: str) -> dict[str, str]:
    """'l2_mb=same die as B300; boost_clock_mhz=...' -> {field: rule}; field names are checked by Hardware."""
    out: dict[str, str] = {}
    for part in raw.split(";"):
        if not part.strip():
            continue
        name, sep, rule = part.partition("=")
        name, rule = name.strip(), rule.strip()
        if not sep or not name or not rule:
            raise KernelsightError(f"{where}: column 'derived' entry {part.strip()!r} must be field=rule "
                                   f"(entries separated by ';')")
        if name in out:
            raise KernelsightError(f"{where}: column 'derived' names {name!r} twice")
        out[name] = rule
    return out


def read_gpu_specs(csv_path: str | Path) -> list[dict[str, Any]]:
    """Rows of gpu_specs.csv as Hardware-shaped mappings (no aliases/sources yet)."""
    csv_path = Path(csv_path)
    try:
        handle = csv_path.open(newline="", encoding="utf-8")
    except OSError as exc:
        raise KernelsightError(f"{csv_path}: cannot read GPU spec table: {exc.strerror or exc}") from None
    with handle:
        reader = csv.DictReader(handle)
        columns = set(reader.fieldnames or ())
        missing = sorted(_ALL_COLUMNS - columns)
        extra = sorted(columns - _ALL_COLUMNS - set(_OPTIONAL_COLUMNS))
        if missing or extra:
            raise KernelsightError(f"{csv_path}: unexpected columns (missing: {', '.join(missing) or '-'}; "
                                   f"unknown: {', '.join(extra) or '-'})")
        rows = []
        for line_no, row in enumerate(reader, start=2):
            where = f"{csv_path}:{line_no}"
            entry: dict[str, Any] = {c: _cell(row, c, str, where) for c in _STR_COLUMNS}
            entry["num_sms"] = _cell(row, "num_sms", int, where)
            entry["boost_clock_mhz"] = _cell(row, "boost_clock_mhz", float, where)
            entry["peak_tflops"] = {dtype: _cell(row, col, float, where) for col, dtype in _PEAK_COLUMNS.items()}
            for column in ("mem_gb", "mem_bw_gbs", "l2_mb", "smem_per_sm_kb", "tdp_w", "nvlink_gbs_per_dir"):
                entry[column] = _cell(row, column, float, where)
            entry["pcie_gen"] = _cell(row, "pcie_gen", int, where)
            entry["pcie_gbs_per_dir"] = _cell(row, "pcie_gbs_per_dir", float, where)
            p2p = _cell(row, "pcie_p2p", str, where)
            if p2p is not None and p2p.lower() not in _BOOL_CELLS:
                raise KernelsightError(f"{where}: column 'pcie_p2p' = {p2p!r} must be yes, no or empty (not known)")
            entry["pcie_p2p"] = None if p2p is None else _BOOL_CELLS[p2p.lower()]
            entry["derived"] = _derived_cell(row.get("derived") or "", where)
            rows.append(entry)
    keys = [r["key"] for r in rows]
    duplicates = sorted({k for k in keys if keys.count(k) > 1})
    if duplicates:
        raise KernelsightError(f"{csv_path}: duplicate keys: {', '.join(map(str, duplicates))}")
    return rows


def _existing_hand_fields(path: Path) -> dict[str, Any]:
    """aliases/sources from a previous YAML, if readable; a broken old file is simply regenerated."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: data[k] for k in ("aliases", "sources") if data.get(k)}


class _Dumper(yaml.SafeDumper):
    """Block style, multi-line strings as literal blocks, whole floats written as integers."""


def _str_representer(dumper: yaml.SafeDumper, value: str):
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


def _float_representer(dumper: yaml.SafeDumper, value: float):
    if value.is_integer() and abs(value) < 1e15:
        return dumper.represent_int(int(value))
    return yaml.SafeDumper.represent_float(dumper, value)


_Dumper.add_representer(str, _str_representer)
_Dumper.add_representer(float, _float_representer)


def _render(hw: Hardware, csv_name: str) -> str:
    data = hw.as_dict()
    if not data["derived"]:
        del data["derived"]  # entries without derived values stay as they were
    body = yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True,
                     width=110)
    return _HEADER.format(csv=csv_name) + body


def _wrap(text: str) -> str:
    """Wrap each paragraph to ~110 columns so the YAML stays readable."""
    return "\n".join(textwrap.fill(p.strip(), width=110) for p in text.strip().split("\n") if p.strip())


def convert_gpu_specs(csv_path: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Write one validated <key>.yaml per CSV row into out_dir (default: the shipped conf/hardware).

    Every entry is validated before anything is written, so a bad CSV leaves
    the catalog untouched. Returns the written paths in CSV order.
    """
    csv_path = Path(csv_path)
    out = Path(out_dir) if out_dir is not None else hardware_dir()
    ensure_dir(out, "out")
    rendered: list[tuple[Path, str, Hardware]] = []
    for row in read_gpu_specs(csv_path):
        path = out / f"{row['key']}.yaml"
        kept = _existing_hand_fields(path) if path.exists() else {}
        row["aliases"] = kept.get("aliases", ALIASES.get(row["key"], []))
        row["sources"] = kept.get("sources") or _wrap(SOURCES.get(row["key"], f"Row {row['key']!r} of "
                                                                                f"{csv_path.name}."))
        hw = Hardware.from_mapping(row, f"{csv_path}: row {row['key']!r}")
        text = _render(hw, csv_path.name)
        # What we write must load back to the same entry (catches YAML typing surprises such as "9.0").
        if Hardware.from_mapping(yaml.safe_load(text), str(path)) != hw:
            raise KernelsightError(f"{path}: generated YAML does not load back to the same entry")
        rendered.append((path, text, hw))
    for path, text, _ in rendered:
        write_text(path, text)
    return [p for p, _, _ in rendered]


def main(argv: list[str] | None = None) -> int:
    """CLI shim: convert and print the written files."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not 1 <= len(args) <= 2:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    try:
        written = convert_gpu_specs(args[0], args[1] if len(args) > 1 else None)
    except KernelsightError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
