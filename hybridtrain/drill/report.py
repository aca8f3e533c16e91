"""DrillReport: what a failover drill measured — per scenario its outcome, RTO, RPO and timeline."""

from __future__ import annotations

import logging
import os
from datetime import datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

log = logging.getLogger(__name__)



EXPERIMENT = "hybridtrain-drills"
JOB = "failover-drill"
LABEL = "churned"
DEFAULT_STEPS = 300
EPOCHS = 2
BATCH_SIZE = 512
VAL_ROWS = 500
#: the drill waits 5 s, so production's RTO for a lost host is about 55 s longer than measured here.
DRILL_SSH_TIMEOUTS = {"connect": 3.0, "command": 20.0, "reconnect": 5.0}

Outcome = Literal["ok", "failed", "skipped"]
DEFINITIONS = {
    "rto_s": "seconds from the injection of the fault to the end of the first optimizer step completed by the "
             "resumed run (grace checkpoint, retries, health checks, placement, checkpoint copy, process start, "
             "data fetch and checkpoint load included; the orchestrator's own detection and scheduling delays "
             "are not)",
    "rpo_steps": "optimizer steps lost: the last step the interrupted run completed before it stopped minus the "
                 "step the resumed run restarted from",
    "rpo_s": "rpo_steps times the interrupted run's mean seconds per step",
}


# -- the report --------------------------------------------------------------------------------


class Event(BaseModel):
    """One moment of a scenario, in seconds after the fault (negative: before it)."""

    at_s: float
    what: str


class ScenarioResult(BaseModel):
    """What one scenario did and measured."""

    scenario: str
    outcome: Outcome
    rto_s: float | None = Field(None, description=DEFINITIONS["rto_s"])
    rpo_steps: int | None = Field(None, description=DEFINITIONS["rpo_steps"])
    rpo_s: float | None = Field(None, description=DEFINITIONS["rpo_s"])
    rpo_estimated: bool = Field(False, description="True when the last step before the fault could not be "
                                                   "observed and was estimated from the elapsed time.")
    last_step: int | None = Field(None, description="Last optimizer step the interrupted run completed.")
    resumed_from_step: int | None = None
    checkpoint_interval: int
    site: str | None = Field(None, description="Where the run was interrupted.")
    resumed_site: str | None = Field(None, description="Where it resumed.")
    weights_match_reference: bool | None = Field(
        None, description="Final weights equal (torch.equal) to the uninterrupted reference run's.")
    notes: list[str] = Field(default_factory=list)
    timeline: list[Event] = Field(default_factory=list)
    seconds: float = Field(0.0, description="Wall time the scenario took.")


class DrillReport(BaseModel):
    """A drill: its settings, one result per scenario, where it is stored."""

    started_at: datetime
    finished_at: datetime | None = None
    workspace: str
    steps: int = Field(description="Optimizer steps of a whole run.")
    checkpoint_interval: int
    fault_step: int = Field(description="The step at which the drill strikes (processes it can watch).")
    device: str = "cpu"
    reference_seconds: float | None = None
    seconds_per_step: float | None = Field(None, description="Of the uninterrupted reference run.")
    definitions: dict[str, str] = Field(default_factory=lambda: dict(DEFINITIONS))
    scenarios: list[ScenarioResult] = Field(default_factory=list)
    directory: str | None = None
    mlflow_run_id: str | None = None
    notes: list[str] = Field(default_factory=list)

    @property
    def failed(self) -> list[ScenarioResult]:
        return [s for s in self.scenarios if s.outcome == "failed"]

    def to_markdown(self) -> str:
        def num(v: float | int | None, fmt: str) -> str:
            return "" if v is None else format(v, fmt)

        lines = [
            f"# Failover drill {self.started_at.strftime('%Y-%m-%d %H:%M:%S')} UTC",
            "",
            f"Workspace `{self.workspace}`; {self.steps} steps per run ({EPOCHS} epochs), a checkpoint every "
            f"{self.checkpoint_interval} steps, faults at step {self.fault_step}; training on the {self.device}"
            + (f"; uninterrupted reference run {self.reference_seconds:.1f} s "
               f"({(self.seconds_per_step or 0) * 1000:.1f} ms/step)" if self.reference_seconds is not None else "")
            + ".",
            "",
            "| scenario | outcome | RTO s | RPO steps | RPO s | resumed from step | weights = reference | notes |",
            "|---|---|---:|---:|---:|---:|---|---|",
        ]
        for s in self.scenarios:
            match = {True: "yes", False: "NO", None: ""}[s.weights_match_reference]
            rpo = num(s.rpo_steps, "d") + (" (est.)" if s.rpo_estimated and s.rpo_steps is not None else "")
            notes = "; ".join(s.notes).replace("|", "\\|").replace("\n", " ")
            lines.append(f"| {s.scenario} | {s.outcome} | {num(s.rto_s, '.2f')} | {rpo} | {num(s.rpo_s, '.3f')} | "
                         f"{num(s.resumed_from_step, 'd')} | {match} | {notes} |")
        lines += ["", "## Definitions", ""]
        lines += [f"- **{k}**: {v}." for k, v in self.definitions.items()]
        for s in self.scenarios:
            if not s.timeline:
                continue
            lines += ["", f"## {s.scenario}: timeline (seconds after the fault)", ""]
            lines += [f"- {e.at_s:+.3f} s — {e.what}" for e in s.timeline]
        if self.notes:
            lines += ["", "## Notes", ""] + [f"- {n}" for n in self.notes]
        if self.mlflow_run_id:
            lines += ["", f"MLflow: experiment `{EXPERIMENT}`, run `{self.mlflow_run_id}`."]
        return "\n".join(lines) + "\n"

    def write(self, directory: Path) -> tuple[Path, Path]:
        """Write ``report.md`` and ``report.json`` into ``directory``, each atomically (temp file + rename)."""
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = str(directory)
        md = write_atomic(directory / "report.md", self.to_markdown())
        js = write_atomic(directory / "report.json", self.model_dump_json(indent=1))
        return md, js

    @classmethod
    def read(cls, directory: Path | str) -> DrillReport:
        return cls.model_validate_json((Path(directory) / "report.json").read_text())


def write_atomic(path: Path, text: str) -> Path:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path
