"""FederatedCommands: ``hybridtrain split-sites`` — the sample data split over N sites, each part tracked by DVC at its site.

Also the checks the sample-data commands (``split-sites`` here, ``data generate`` in ``cli.main``) make
before they create anything: ``--rows``/``--seed``/``--sites`` in range (with the workspace and ``--pin``
checks of ``cli.options``) — each refused in one line naming the option and the fix (``OptionError``,
exit status 2), so a mistaken command leaves no data, commit or directory behind.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Annotated

import typer
import yaml
from rich.console import Console

from hybridtrain.cli.options import OptionError, checked_workspace, job_spec_target
from hybridtrain.errors import HybridtrainError, Problem, SpecError
from hybridtrain.workspace import Workspace

console = Console()
err_console = Console(stderr=True, soft_wrap=True)  # error lines stay whole in a pipe or a log


def site_list(sites: str) -> list[str]:
    """The names in ``--sites`` (comma-separated, blanks dropped); ``OptionError`` for none or too many."""
    from hybridtrain.datasets.sample_sites import MAX_SITES

    names = [s.strip() for s in sites.split(",") if s.strip()]
    if not names:
        raise OptionError("--sites", "give at least one site, comma-separated, e.g. "
                                     "--sites onprem-dc1,onprem-dc2,onprem-dc3")
    if len(names) > MAX_SITES:
        raise OptionError("--sites", f"at most {MAX_SITES} sites (each gets at least one of the sample's {MAX_SITES} "
                                     f"regions), got {len(names)}")
    return names


def check_rows(rows: int, minimum: int, why_minimum: str) -> None:
    """``--rows`` between ``minimum`` (``why_minimum`` says why) and ``sample_data.MAX_ROWS``, or ``OptionError``."""
    from hybridtrain.datasets.sample_data import MAX_ROWS, rows_problem

    problem = rows_problem(rows, minimum)
    if problem:
        why = ("every row is held in memory while it is generated, about 1 GB per million"
               if isinstance(rows, int) and rows > MAX_ROWS else why_minimum)
        raise OptionError("--rows", f"{problem} ({why})")


def check_site_options(site_names: list[str], rows: int, seed: int) -> None:
    """``--sites``, ``--rows`` and ``--seed`` of ``split-sites`` in range, or ``OptionError``; nothing is created."""
    from hybridtrain.datasets.sample_data import MIN_ROWS, seed_problem
    from hybridtrain.datasets.sample_sites import MAX_SITES, expected_shares, min_rows

    n = len(site_names)
    if not 1 <= n <= MAX_SITES:
        raise OptionError("--sites", f"give 1 to {MAX_SITES} sites, got {n}")
    shares = expected_shares(n)
    smallest = shares.index(min(shares))
    check_rows(rows, min_rows(n),
               f"fewer than {MIN_ROWS} cannot fill 10 % validation and test splits of 10 rows each" if n == 1 else
               f"{n} sites: each site's part needs at least {MIN_ROWS} rows, for 10 % validation and test splits of "
               f"10 rows; the smallest, {site_names[smallest]}, gets about {shares[smallest]:.0%} of them")
    problem = seed_problem(seed)
    if problem:
        raise OptionError("--seed", problem)


def ensure_site_data(ws: Workspace, site_names: list[str], rows: int, seed: int) -> list[dict[str, str]]:
    """Generate the sample data split over ``site_names`` (non-IID; ``sample_sites``), track each part
    with DVC and push it to its own site's store. Returns the ``dataset`` parts, in site order.

    The options, the sites and every part's size are checked before anything is written."""
    from hybridtrain import stages
    from hybridtrain.datasets.sample_data import MIN_ROWS
    from hybridtrain.datasets.sample_sites import site_parts, write_parts

    check_site_options(site_names, rows, seed)
    sites = ws.load_sites()
    problems = [Problem(f"--sites[{i}]", f"unknown site {s!r}; known: {', '.join(sites.names)}")
                for i, s in enumerate(site_names) if s not in sites.names]
    if len(set(site_names)) != len(site_names):
        problems.append(Problem("--sites", "list each site once"))
    if problems:
        raise SpecError("command line", problems)
    frames = site_parts(rows, len(site_names), seed)  # in memory: a part too small is refused before any write
    short = min(range(len(frames)), key=lambda i: len(frames[i]))
    if len(frames[short]) < MIN_ROWS:
        enough = math.ceil(rows * MIN_ROWS * 1.25 / max(len(frames[short]), 1) / 100) * 100  # a quarter to spare
        raise OptionError("--rows", f"{rows:,} rows leave {site_names[short]} only {len(frames[short])} rows; each "
                                    f"site's part needs at least {MIN_ROWS}: use --rows {enough:,} or more")
    rels = [f"data/raw/churn-{s}.csv" for s in site_names]
    write_parts([ws.path(r) for r in rels], frames)
    parts = []
    for site, rel in zip(site_names, rels, strict=True):
        repo = stages.workspace_repo(ws, sites, site)
        version = repo.add(rel, "raw", site)
        repo.push(version, remote=sites.get(site).dvc_remote)  # the part lives in its own site's store
        parts.append({"path": rel, "md5": version.md5, "site": site, "format": "csv"})
    return parts


def pin_parts(spec_file: Path, parts: list[dict[str, str]]) -> None:
    """Point ``spec_file``'s dataset at the parts (first at the top level, the rest in ``dataset.sites``).
    The file is rewritten from its YAML data: comments are not kept. Check it with ``job_spec_target`` first."""
    import shutil

    data = yaml.safe_load(spec_file.read_text())
    data["dataset"] = {**parts[0], "sites": parts[1:]}
    tmp = spec_file.with_suffix(spec_file.suffix + ".tmp")
    tmp.write_text(yaml.safe_dump(data, sort_keys=False))
    shutil.copymode(spec_file, tmp)
    os.replace(tmp, spec_file)


def split_sites(
    sites: Annotated[str, typer.Option(help="Comma-separated data sites (1 to 12, each listed once), e.g. "
                                            "onprem-dc1,onprem-dc2,onprem-dc3.")],
    rows: Annotated[int, typer.Option(help="Rows generated before the split, at most 10,000,000 and enough for "
                                           "every site's part to get at least 100 (800 for 3 sites, 6,600 for "
                                           "12).")] = 200_000,
    seed: Annotated[int, typer.Option(help="Generator seed (a whole number >= 0); same seed, same bytes.")] = 20261121,
    pin: Annotated[Path | None, typer.Option(
        help="Job spec (kind: TrainingJob; relative to the workspace root) whose dataset to point at the parts. "
             "It is rewritten from its YAML data (comments are not kept); any other file is refused before "
             "anything is generated.")] = None,
    home: Annotated[Path | None, typer.Option("--home", help="Workspace root.")] = None,
) -> None:
    """Split the sample data over SITES (non-IID: own regions, size and churn rate), each part tracked at its site.

    Options, sites and the --pin target are checked first: a mistake is one line, exit 2, nothing written or pushed."""
    try:
        names = site_list(sites)
        check_site_options(names, rows, seed)
        ws = checked_workspace(home)
        target = job_spec_target(ws, pin)[0] if pin is not None else None
        parts = ensure_site_data(ws, names, rows, seed)
        if target is not None:
            pin_parts(target, parts)
    except HybridtrainError as exc:
        err_console.print("error:", str(exc), style="red", highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(exc.exit_code) from None
    for p in parts:
        console.print(f"{p['site']}: {p['path']} md5 {p['md5']}", highlight=False)
    console.print(yaml.safe_dump({"dataset": {**parts[0], "sites": parts[1:]}}, sort_keys=False), highlight=False)
    if target is not None:
        console.print(f"pinned {pin}: dataset -> these {len(parts)} part(s)", highlight=False)


def register(app: typer.Typer) -> None:
    """Add ``split-sites`` to the CLI (a top-level command: ``hybridtrain split-sites``)."""
    app.command("split-sites")(split_sites)
