"""Traces: the public traces the simulator replays — GPU pods, spot availability, cloud prices — read from ``data/traces``.

Copies of the files (with their origin READMEs) live in ``data/traces/``; nothing is read from
outside the repository at run time.

Spot trace value convention. The SkyPilot traces (Can't Be Late, NSDI'24) hold one value per
tick. Their repository README calls it the "number of available instances", but the authors'
simulator treats a non-zero value as spot *unavailable* (``TraceEnv.spot_available()`` returns
``not trace[tick]``), and the published per-region availabilities order the same way only under
that reading (e.g. us-west-2a K80 ≈ 4% vs us-west-2b K80 ≈ 78%: the files hold 89% and 12%
non-zero ticks). We therefore read **0 = spot available, non-zero = unavailable / preempted**
(``NONZERO_IS_UNAVAILABLE``); ``tests/unit/test_simulator.py`` checks that ordering on the copied
files. A trace is cyclic: simulated time past its end wraps around to its start.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from pydantic import BaseModel, Field, FiniteFloat, ValidationError, field_validator

from hybridtrain.errors import DataError, Problem
from hybridtrain.placement.spot_market import SpotOutlook
from hybridtrain.specs.config_file import problems_from_validation_error

#: Where the copied traces live, relative to the repository root.
TRACES_DIR = Path(__file__).resolve().parents[2] / "data" / "traces"
POD_TRACE = TRACES_DIR / "alibaba-gpu-v2023-openb" / "openb_pod_list_default.csv"
PRICES = TRACES_DIR / "cloud-gpu-prices" / "skypilot_catalog_gpu_price_extract.csv"
SPOT_DIR = TRACES_DIR / "skypilot-spot-traces"

NONZERO_IS_UNAVAILABLE = "nonzero_is_unavailable"
NONZERO_IS_AVAILABLE = "nonzero_is_available"


@dataclass(frozen=True)
class Pod:
    """One row of the Alibaba GPU pod trace (times in seconds from the trace start)."""

    name: str
    num_gpu: int
    gpu_milli: int
    qos: str
    phase: str
    creation: float
    scheduled: float | None
    deletion: float


#: The pod-trace columns the simulator reads (others, e.g. ``cpu_milli``, are ignored).
POD_COLUMNS = ("name", "num_gpu", "gpu_milli", "qos", "pod_phase", "creation_time", "deletion_time", "scheduled_time")


class _PodRow(BaseModel):
    name: str
    num_gpu: int = Field(ge=0)
    gpu_milli: int = Field(ge=0)
    qos: str
    pod_phase: str
    creation_time: FiniteFloat
    deletion_time: FiniteFloat
    scheduled_time: FiniteFloat | None = None

    @field_validator("scheduled_time", mode="before")
    @classmethod
    def _blank_is_none(cls, v: object) -> object:
        return None if isinstance(v, str) and not v.strip() else v


def load_pods(path: Path | str = POD_TRACE) -> list[Pod]:
    """Every pod of the trace, in file order; ``DataError`` names each bad cell (column and line), at most 20."""
    path = Path(path)
    if not path.is_file():
        raise DataError(str(path), [Problem("", "pod trace not found; restore data/traces or pass --pods")])
    pods, problems = [], []
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            missing = [c for c in POD_COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise DataError(str(path), [Problem("columns", f"missing {', '.join(missing)}: a pod trace (the "
                                                               "Alibaba GPU trace's layout) has " + ", ".join(POD_COLUMNS))])
            for line, row in enumerate(reader, start=2):
                try:
                    r = _PodRow.model_validate({c: row[c] for c in POD_COLUMNS})
                except ValidationError as exc:
                    problems += [replace(q, line=line) for q in problems_from_validation_error(exc)]
                    if len(problems) >= 20:
                        break
                    continue
                pods.append(Pod(name=r.name, num_gpu=r.num_gpu, gpu_milli=r.gpu_milli, qos=r.qos, phase=r.pod_phase,
                                creation=r.creation_time, scheduled=r.scheduled_time, deletion=r.deletion_time))
    except (UnicodeDecodeError, csv.Error) as exc:
        raise DataError(str(path), [Problem("", f"not a CSV pod trace: {exc}")]) from None
    if problems:
        raise DataError(str(path), problems[:20])
    return pods


TRACE_LAYOUT = '{"metadata": {"gap_seconds": N > 0}, "data": [one number per tick, 0 = spot available, ...]}'


class _TraceMetadata(BaseModel):
    gap_seconds: FiniteFloat = Field(gt=0)


class _TraceFile(BaseModel):
    """The part of a SkyPilot spot-trace file the simulator reads (other keys, e.g. ``prices``, are ignored)."""

    metadata: _TraceMetadata
    data: list[FiniteFloat] = Field(min_length=1)


class SpotTrace:
    """Spot availability over time, from one SkyPilot trace file (cyclic)."""

    def __init__(self, name: str, available: np.ndarray, gap_s: float) -> None:
        self.name = name
        self.gap_s = float(gap_s)
        self.available = available.astype(bool)
        n = len(self.available)
        self.period_s = n * self.gap_s
        # next_change[i]: first tick after i (cyclically, as an unwrapped index) whose state differs
        nxt = np.empty(n, dtype=np.int64)
        a = self.available
        if a.all() or not a.any():
            nxt[:] = np.iinfo(np.int64).max // 4
        else:
            doubled = np.concatenate([a, a])
            change = np.flatnonzero(doubled[1:] != doubled[:-1]) + 1  # ticks where the state flips
            pos = np.searchsorted(change, np.arange(n), side="right")
            nxt[:] = change[pos]
        self._next = nxt
        up = a.astype(np.int64)
        lost = (a & ~np.roll(a, -1)).astype(np.int64)  # available at i, gone at i+1
        self._cum_up = np.concatenate([[0], np.cumsum(np.concatenate([up, up]))])
        self._cum_lost = np.concatenate([[0], np.cumsum(np.concatenate([lost, lost]))])

    @classmethod
    def load(cls, path: Path | str, convention: str = NONZERO_IS_UNAVAILABLE) -> SpotTrace:
        path = Path(path)
        try:
            doc = _TraceFile.model_validate(json.loads(path.read_text()))
        except ValidationError as exc:
            problems = [p if p.path else replace(p, message="not a JSON object") for p in
                        problems_from_validation_error(exc)[:3]]
            raise DataError(str(path), [*problems, Problem("expected", TRACE_LAYOUT)]) from None
        except (OSError, ValueError) as exc:  # unreadable, not UTF-8, not JSON
            raise DataError(str(path), [Problem("", f"not a SkyPilot spot trace: {exc}"),
                                        Problem("expected", TRACE_LAYOUT)]) from None
        values, gap = np.asarray(doc.data, dtype=float), doc.metadata.gap_seconds
        if convention == NONZERO_IS_UNAVAILABLE:
            available = values == 0
        elif convention == NONZERO_IS_AVAILABLE:
            available = values != 0
        else:
            raise ValueError(f"unknown convention {convention!r}")
        return cls(path.stem, available, gap)

    def tick(self, t: float) -> int:
        return int((t % self.period_s) // self.gap_s)

    def is_available(self, t: float) -> bool:
        return bool(self.available[self.tick(t)])

    def next_change(self, t: float) -> float:
        """The first time after ``t`` when availability flips (``inf`` if it never does)."""
        i = self.tick(t)
        j = int(self._next[i])
        if j >= 2 * len(self.available):
            return float("inf")
        base = t - (t % self.period_s)
        return base + j * self.gap_s

    @property
    def availability(self) -> float:
        return float(self.available.mean())

    def outlook(self, t: float, window_s: float = 86400.0) -> SpotOutlook:
        """What the last ``window_s`` before ``t`` say about spot here (never looks past ``t``)."""
        n = len(self.available)
        end = self.tick(t) + n  # index in the doubled arrays
        width = max(1, min(n, int(window_s // self.gap_s)))
        start = end - width
        up = int(self._cum_up[end] - self._cum_up[start])
        lost = int(self._cum_lost[end] - self._cum_lost[start])
        availability = max(up / width, 0.02)
        up_hours = max(up * self.gap_s / 3600.0, 1.0)
        now = self.is_available(t)
        wait = 0.0 if now else max(0.0, min(self.period_s, self._mean_gap_s(width, up, lost)))
        return SpotOutlook(available_now=now, availability=min(availability, 1.0),
                           preemptions_per_hour=lost / up_hours, expected_wait_s=wait)

    def _mean_gap_s(self, width: int, up: int, lost: int) -> float:
        """Mean length of an unavailable stretch in the window."""
        down = width - up
        return down * self.gap_s / max(lost, 1)


def trace_files(spot_dir: Path | str) -> list[Path]:
    """The SkyPilot trace files (``*.json``) under ``spot_dir``, sorted by their path inside it.

    Raises ``DataError`` naming the directory when it is missing or holds no trace file.
    """
    root = Path(spot_dir)
    if not root.is_dir():
        raise DataError(str(root), [Problem("--spot-traces", "not a directory; give a folder of SkyPilot spot "
                                                              "trace files (*.json, any depth)")])
    files = sorted(root.rglob("*.json"), key=lambda f: f.relative_to(root).as_posix())
    if not files:
        raise DataError(str(root), [Problem("--spot-traces", "holds no *.json spot trace; give a folder in the "
                                                              "SkyPilot spot-traces layout")])
    return files


@dataclass(frozen=True)
class PriceRow:
    cloud: str
    instance_type: str
    accelerator: str
    region: str
    zone: str
    ondemand_per_gpu_hour: float | None
    spot_per_gpu_hour: float | None


def load_prices(path: Path | str = PRICES) -> list[PriceRow]:
    """Rows of the SkyPilot catalog price extract that price whole instances with GPUs."""
    rows = []
    with Path(path).open(newline="") as fh:
        for r in csv.DictReader(fh):
            if r["row_kind"] != "instance":
                continue
            rows.append(PriceRow(
                cloud=r["cloud"], instance_type=r["instance_type"], accelerator=r["accelerator"], region=r["region"],
                zone=r["zone"],
                ondemand_per_gpu_hour=float(r["ondemand_usd_per_accel_hr"]) if r["ondemand_usd_per_accel_hr"] else None,
                spot_per_gpu_hour=float(r["spot_usd_per_accel_hr"]) if r["spot_usd_per_accel_hr"] else None,
            ))
    return rows


def find_price(rows: list[PriceRow], cloud: str, instance_type: str, region: str, zone: str | None = None) -> PriceRow:
    for r in rows:
        if r.cloud == cloud and r.instance_type == instance_type and r.region == region and (zone is None or r.zone == zone):
            return r
    raise DataError("price extract", [Problem(f"{cloud}/{instance_type}/{region}/{zone}", "no such row")])
