"""GpusCommand: ``hybridtrain gpus`` — this machine's GPUs as jobs at a site without SSH hosts claim them, and who holds each."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from hybridtrain.errors import HybridtrainError

console = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def gpus(
    lock_dir: Annotated[Path | None, typer.Option("--lock-dir", help="The workers' lock directory (default: "
                                                  "HYBRIDTRAIN_GPU_LOCK_DIR or /tmp/hybridtrain-gpu-locks).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object: GPU name -> holder or null.")] = False,
) -> None:
    """List this machine's GPUs (as CUDA_VISIBLE_DEVICES names them here) and the job holding each.

    Run it on a pool worker's machine with the worker's environment: a job at a site without SSH hosts trains on GPUs of that machine that no other job holds (README: "Several GPUs on the worker's machine").
    """
    from hybridtrain.training.local_gpus import UNKNOWN, LocalGpus

    try:
        machine = LocalGpus(lock_dir=lock_dir)
        held = machine.holders()
    except HybridtrainError as exc:
        err.print(f"error: {exc}", markup=False)
        raise typer.Exit(exc.exit_code) from None
    if as_json:
        console.print_json(json.dumps({name: None if h is None else asdict(h) for name, h in held.items()}))
        return
    if not held:
        console.print("no CUDA GPU visible here: jobs of sites without SSH hosts train on this machine's CPU")
        return
    table = Table("GPU", "held by", "pid", "since (UTC)", title=f"GPUs of this machine (locks in {machine.lock_dir})")
    for name, h in held.items():
        if h is None:
            table.add_row(escape(name), "free", "", "")
        elif h is UNKNOWN:
            table.add_row(escape(name), "a process that did not say", "", "")
        else:
            table.add_row(escape(name), escape(f"job {h.job} at site {h.site}"), str(h.pid), h.started)
    console.print(table)
    free = sum(h is None for h in held.values())
    console.print(f"{free} of {len(held)} free")


def register(app: typer.Typer) -> None:
    app.command()(gpus)
