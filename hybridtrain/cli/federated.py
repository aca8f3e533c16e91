"""FederatedCommands: ``hybridtrain data split-sites`` — the sample data split over N sites, each part tracked by DVC at its site."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
import yaml
from rich.console import Console

from hybridtrain.errors import HybridtrainError, Problem, SpecError
from hybridtrain.workspace import Workspace

console = Console()
err_console = Console(stderr=True, soft_wrap=True)  # error lines stay whole in a pipe or a log


def ensure_site_data(ws: Workspace, site_names: list[str], rows: int, seed: int) -> list[dict[str, str]]:
    """Generate the sample data split over ``site_names`` (non-IID; ``sample_sites``), track each part
    with DVC and push it to its own site's store. Returns the ``dataset`` parts, in site order."""
    from hybridtrain import stages
    from hybridtrain.datasets.sample_sites import write_site_csvs

    sites = ws.load_sites()
    problems = [Problem(f"--sites[{i}]", f"unknown site {s!r}; known: {', '.join(sites.names)}")
                for i, s in enumerate(site_names) if s not in sites.names]
    if len(set(site_names)) != len(site_names):
        problems.append(Problem("--sites", "list each site once"))
    if problems:
        raise SpecError("command line", problems)
    rels = [f"data/raw/churn-{s}.csv" for s in site_names]
    write_site_csvs([ws.path(r) for r in rels], rows=rows, seed=seed)
    parts = []
    for site, rel in zip(site_names, rels, strict=True):
        repo = stages.workspace_repo(ws, sites, site)
        version = repo.add(rel, "raw", site)
        repo.push(version, remote=sites.get(site).dvc_remote)  # the part lives in its own site's store
        parts.append({"path": rel, "md5": version.md5, "site": site, "format": "csv"})
    return parts


def pin_parts(spec_file: Path, parts: list[dict[str, str]]) -> None:
    """Point ``spec_file``'s dataset at the parts (first at the top level, the rest in ``dataset.sites``).
    The file is rewritten from its YAML data: comments are not kept."""
    import os

    data = yaml.safe_load(spec_file.read_text())
    data["dataset"] = {**parts[0], "sites": parts[1:]}
    tmp = spec_file.with_suffix(spec_file.suffix + ".tmp")
    tmp.write_text(yaml.safe_dump(data, sort_keys=False))
    os.replace(tmp, spec_file)


def split_sites(
    sites: Annotated[str, typer.Option(help="Comma-separated data sites, e.g. onprem-dc1,onprem-dc2,onprem-dc3.")],
    rows: Annotated[int, typer.Option(help="Rows generated before the split.")] = 200_000,
    seed: Annotated[int, typer.Option(help="Generator seed; same seed, same bytes.")] = 20261121,
    pin: Annotated[Path | None, typer.Option(help="Job spec whose dataset to point at the parts.")] = None,
    home: Annotated[Path | None, typer.Option("--home", help="Workspace root.")] = None,
) -> None:
    """Split the sample data over SITES (non-IID: own regions, size and churn rate), each part tracked at its site."""
    ws = Workspace.resolve(home)
    try:
        parts = ensure_site_data(ws, [s.strip() for s in sites.split(",") if s.strip()], rows, seed)
        if pin is not None:
            pin_parts(pin if pin.is_absolute() else ws.root / pin, parts)
    except HybridtrainError as exc:
        err_console.print("error:", str(exc), style="red", highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(exc.exit_code) from None
    for p in parts:
        console.print(f"{p['site']}: {p['path']} md5 {p['md5']}", highlight=False)
    console.print(yaml.safe_dump({"dataset": {**parts[0], "sites": parts[1:]}}, sort_keys=False), highlight=False)


def register(data_app: typer.Typer) -> None:
    """Add ``data split-sites`` to the CLI."""
    data_app.command("split-sites")(split_sites)
