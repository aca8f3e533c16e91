"""PlacementCommands: the ``hybridtrain plan`` and ``hybridtrain simulate`` commands, mounted by ``register(app)``.

``plan`` shows, with no side effects, where a job spec would train now: the chosen site and
capacity, the estimated cost with its breakdown, every candidate with its verdict (rejected
ones with the rule), and the reasons. ``simulate`` replays the shared traces through the same
engine and prints the comparison table (and writes JSON, CSV and a PNG plot).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from hybridtrain.cli.options import OptionValueError
from hybridtrain.errors import HybridtrainError, Problem, SpecError
from hybridtrain.placement.cost_model import clock, hhmm
from hybridtrain.placement.engine import Placement
from hybridtrain.placement.policy import Policy
from hybridtrain.placement.queue_state import QueueState
from hybridtrain.placement.request import request_from_spec, to_epoch
from hybridtrain.placement.spot_market import SpotOutlook
from hybridtrain.specs.sites import CapacityClass, Site, SitesCatalog
from hybridtrain.validation import load_job

console = Console()
err_console = Console(stderr=True, soft_wrap=True)  # error lines stay whole in a pipe or a log


def wide() -> Console:
    """A console at least 150 columns wide, so the comparison table is not squeezed (e.g. in CI logs)."""
    return Console(width=max(console.width, 150))


#: Bounds of a ``--queue`` snapshot: one run of at most a year, at most a million runs, and at most ten
#: years of work ahead of a new run (the times a plan prints stay dates a calendar has).
QUEUE_MAX_RUN_HOURS = 24 * 365
QUEUE_MAX_RUNS = 1_000_000
QUEUE_MAX_BACKLOG_HOURS = 10 * 24 * 365
#: Most preemptions per hour a ``--spot`` outlook may give (one a minute: no training progresses faster).
SPOT_MAX_PREEMPTIONS_PER_HOUR = 60.0
QUEUE_FORMAT = "expected SITE=RUNNING/QUEUED[@HOURS], e.g. onprem-dc1=8/3@2"
SPOT_FORMAT = "expected SITE=AVAILABILITY[/PREEMPTIONS_PER_HOUR], availability in (0, 1], e.g. cloud-eu=0.7/0.2"


def option_site(option: str, text: str, name: str, sites: SitesCatalog) -> Site:
    """The catalog's site ``name``, or an ``OptionValueError`` naming ``option`` and the known sites."""
    if name not in sites.names:
        raise OptionValueError(option, text, f"no site named {name!r} in the sites catalog; known sites: "
                                        f"{', '.join(sites.names)}")
    return sites.get(name)


def parse_queue(text: str, sites: SitesCatalog) -> QueueState:
    """``SITE=RUNNING/QUEUED[@HOURS]``: runs running and queued in the site's pool (one GPU each,
    ``HOURS`` each, default 1)."""
    try:
        name, counts = text.split("=", 1)
        h = None
        if "@" in counts:
            counts, h = counts.split("@", 1)
        running, queued = (int(x) for x in counts.split("/", 1))
        hours = 1.0 if h is None else float(h)
    except ValueError:
        raise OptionValueError("--queue", text, f"{QUEUE_FORMAT}; RUNNING and QUEUED whole numbers >= 0") from None
    if not (math.isfinite(hours) and 0 < hours <= QUEUE_MAX_RUN_HOURS):
        raise OptionValueError("--queue", text, f"HOURS ({h}) is each run's hours: give a finite number > 0 and at most "
                                           f"{QUEUE_MAX_RUN_HOURS} (a year), e.g. onprem-dc1=8/3@2")
    if not (0 <= running <= QUEUE_MAX_RUNS and 0 <= queued <= QUEUE_MAX_RUNS):
        raise OptionValueError("--queue", text, f"RUNNING and QUEUED count runs in the site's pool: give whole numbers "
                                           f"from 0 to {QUEUE_MAX_RUNS:,}, e.g. onprem-dc1=8/3@2")
    site = option_site("--queue", text, name, sites)
    backlog_h = (running / 2 + queued) * hours / max(site.gpu_count, 1)
    if backlog_h > QUEUE_MAX_BACKLOG_HOURS:
        raise OptionValueError("--queue", text, f"that is {backlog_h:,.0f} hours of work ahead of a new run on the site's "
                                           f"{site.gpu_count} GPUs, more than ten years: give the runs its pool holds "
                                           "now and their hours")
    return QueueState(site.name, site.gpu_count, min(running, site.gpu_count), scheduled=queued, running=running,
                      default_run_hours=hours)


def parse_spot(text: str, sites: SitesCatalog) -> tuple[str, SpotOutlook]:
    """``SITE=AVAILABILITY[/PREEMPTIONS_PER_HOUR]``, e.g. ``cloud-eu=0.7/0.2``."""
    try:
        name, rest = text.split("=", 1)
        parts = rest.split("/")
        if len(parts) > 2:
            raise OptionValueError("--spot", text, f"{len(parts)} fields given, two at most; {SPOT_FORMAT}")
        availability = float(parts[0])
        preemptions = float(parts[1]) if len(parts) > 1 else 0.05
    except ValueError:
        raise OptionValueError("--spot", text, SPOT_FORMAT) from None
    if not (math.isfinite(availability) and 0 < availability <= 1):
        raise OptionValueError("--spot", text, f"AVAILABILITY ({parts[0]}) is the share of time spot capacity can be "
                                          f"had: give availability in (0, 1], e.g. cloud-eu=0.7/0.2")
    if not (math.isfinite(preemptions) and 0 <= preemptions <= SPOT_MAX_PREEMPTIONS_PER_HOUR):
        raise OptionValueError("--spot", text, f"PREEMPTIONS_PER_HOUR ({parts[1]}) is how often spot capacity is taken "
                                          f"back: give a finite number from 0 to {SPOT_MAX_PREEMPTIONS_PER_HOUR:g}, "
                                          "e.g. cloud-eu=0.7/0.2")
    site = option_site("--spot", text, name, sites)
    if site.spot_price_per_gpu_hour is None and site.capacity_class is not CapacityClass.opportunistic:
        spot_sites = [s.name for s in sites.sites
                      if s.spot_price_per_gpu_hour is not None or s.capacity_class is CapacityClass.opportunistic]
        fix = (f"give a site that does ({', '.join(spot_sites)}) or leave this --spot out" if spot_sites
               else "no site of the catalog has spot capacity: leave --spot out")
        raise OptionValueError("--spot", text, f"site {site.name} offers no spot capacity (it has no "
                                          f"spot_price_per_gpu_hour in the sites catalog): {fix}")
    return site.name, SpotOutlook(availability=availability, preemptions_per_hour=preemptions)


def fail(exc: HybridtrainError) -> typer.Exit:
    """Print a user error without a traceback; the exit status says which kind it was."""
    err_console.print("error:", str(exc), style="red", highlight=False, markup=False, soft_wrap=True)
    return typer.Exit(exc.exit_code)


def print_federated(job: str, mode, as_json: bool) -> None:
    """The plan of a federated job: why federated, where each part trains, where updates go."""
    if as_json:
        console.print_json(json.dumps({"mode": mode.mode, "data_sites": list(mode.data_sites),
                                       "aggregation_site": mode.aggregation_site, "reasons": mode.reasons,
                                       "centralized_rejections": mode.centralized_rejections}))
        return
    console.print(f"[bold]{job}[/bold] → [bold green]federated[/bold green] across {', '.join(mode.data_sites)}; "
                  f"aggregation at [bold]{mode.aggregation_site}[/bold]")
    console.print("\n[bold]Why[/bold]")
    for reason in mode.reasons:
        console.print(f"  • {reason}", highlight=False, markup=False)
    if mode.centralized_rejections:
        console.print("\n[bold]Centralized training refused[/bold] (every site, the rule that refused it)")
        for site, why in mode.centralized_rejections.items():
            console.print(f"  • {site}: {why}", highlight=False, markup=False)
    console.print("\nEach data site prepares and trains on its own part in its own work pool; only model weights "
                  "and feature statistics leave a site.", highlight=False)
    console.print("[dim]Nothing was submitted: plan has no side effects.[/dim]")


#: ``plan --dataset-bytes`` at most (10 PB), and the years ``--now`` may name (finish times stay dates).
MAX_DATASET_BYTES = 10**16
NOW_YEARS = (1970, 9000)


def plan(
    spec: Annotated[Path, typer.Argument(help="Job spec (YAML).")],
    sites_path: Annotated[Path, typer.Option("--sites", help="Sites catalog.")] = Path("deployments/sites.yaml"),
    policy_path: Annotated[Path, typer.Option("--policy", help="Placement policy.")] = Path("deployments/policy.yaml"),
    strategy: Annotated[str | None, typer.Option(help="Strategy name (default: spec, job class, policy).")] = None,
    dataset_bytes: Annotated[int, typer.Option(help="Size of the dataset sync would send.")] = 0,
    run_hours: Annotated[float | None, typer.Option(help="Estimated run hours (default: spec resources.max_hours).")] = None,
    queue: Annotated[list[str] | None, typer.Option(help="SITE=RUNNING/QUEUED[@HOURS]; repeatable.")] = None,
    spot: Annotated[list[str] | None, typer.Option(help="SITE=AVAILABILITY[/PREEMPTIONS_PER_HOUR]; repeatable.")] = None,
    now: Annotated[str | None, typer.Option(help="Decide as of this ISO time (default: now).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the decision as JSON.")] = False,
) -> None:
    """Where SPEC would train now, at what estimated cost, and why — without running anything."""
    if run_hours is not None and not (math.isfinite(run_hours) and run_hours > 0):
        raise bad_option("--run-hours", f"{run_hours} is not a run time; give the hours the run takes, a finite "
                                        "number > 0 (e.g. --run-hours 2.5), or leave it out for the spec's max_hours")
    if not 0 <= dataset_bytes <= MAX_DATASET_BYTES:
        raise bad_option("--dataset-bytes", f"{dataset_bytes} is not a size; give the bytes sync would send, from 0 "
                                            f"to {MAX_DATASET_BYTES:.0e} (10 PB)")
    if now is not None:
        try:
            at = datetime.fromisoformat(now.replace("Z", "+00:00"))
        except ValueError:
            raise bad_option("--now", f"{now!r} is not an ISO time; give e.g. 2026-11-28T09:00:00Z") from None
        if at.tzinfo is None:
            raise bad_option("--now", f"{now!r} has no timezone; add Z (UTC) or an offset, e.g. {now}Z")
        if not NOW_YEARS[0] <= at.year <= NOW_YEARS[1]:
            raise bad_option("--now", f"{now!r} is outside the years {NOW_YEARS[0]}-{NOW_YEARS[1]} a plan can "
                                      "reckon with (deadlines and finish times are dates after it)")
    try:
        sites = SitesCatalog.load(sites_path)
        policy = Policy.load(policy_path, sites)
        job = load_job(spec, sites, policy)
        t = to_epoch(datetime.fromisoformat(now.replace("Z", "+00:00"))) if now else datetime.now(UTC).timestamp()
        queues = {q.site: q for q in (parse_queue(x, sites) for x in queue or [])}
        outlooks = dict(parse_spot(x, sites) for x in spot or [])
        mode = None
        if len(job.site_datasets()) > 1 or job.training.mode == "federated":
            from hybridtrain.federated.planning import decide_mode

            mode = decide_mode(job, sites, policy, t)
        if mode is not None and mode.federated:
            print_federated(job.name, mode, as_json)
            return
        request = request_from_spec(job, dataset_bytes=dataset_bytes, now=t, run_hours=run_hours)
        decision = Placement(sites, policy).decide(request, now=t, queues=queues, spot=outlooks, strategy=strategy)
    except HybridtrainError as exc:
        raise fail(exc) from None
    except ValueError as exc:  # e.g. a malformed --now
        raise fail(SpecError("command line", [Problem("", str(exc))])) from None
    if as_json:
        console.print_json(json.dumps({"tags": decision.to_tags(), "candidates": decision.to_table(),
                                       "breakdown": decision.estimate.lines()}))
        return
    flag = "meets" if decision.meets_deadline else "[red]MISSES[/red]"
    due = f"the deadline {clock(request.deadline)}" if request.deadline is not None else \
        f"the {policy.wait_slo_hours:g} h wait SLO"
    console.print(f"[bold]{job.name}[/bold] → [bold green]{decision.site}[/bold green] "
                  f"({decision.capacity_class.value}), estimated ${decision.cost_usd:.2f}, finish "
                  f"{clock(decision.finish_at)} — {flag} {due}  [dim](strategy {decision.strategy})[/dim]")
    console.print("\n[bold]Why[/bold]")
    for reason in decision.reasons:
        console.print(f"  • {reason}", highlight=False, markup=False)
    console.print("\n[bold]Cost and time[/bold] (chosen candidate)")
    for line in decision.estimate.lines():
        console.print(f"  {line}", highlight=False, markup=False)
    table = Table(title="Candidates (cost and finish as estimated now)")
    for col in ("site", "capacity", "verdict", "cost $", "finish (UTC)", "meets", "queue wait"):
        table.add_column(col, justify="right" if col in ("cost $", "queue wait") else "left")
    for c in decision.candidates:
        table.add_row(
            c.site, c.capacity_class.value, "chosen" if c.chosen else ("allowed" if c.allowed else "rejected"),
            "" if c.cost_usd is None else f"{c.cost_usd:.2f}",
            "" if c.finish_at is None else datetime.fromtimestamp(c.finish_at, UTC).strftime("%m-%d %H:%M"),
            "" if c.meets_deadline is None else ("yes" if c.meets_deadline else "no"),
            "" if c.queue_wait_s is None or math.isinf(c.queue_wait_s) else hhmm(c.queue_wait_s),
            style="green" if c.chosen else ("" if c.allowed else "dim"),
        )
    console.print(table)
    rejected = [c for c in decision.candidates if not c.allowed]
    if rejected:
        console.print("[bold]Rejected[/bold]")
        for c in rejected:
            console.print(f"  • {c.site} ({c.capacity_class.value}): {c.rule} — {c.reason}", highlight=False,
                          markup=False)
    console.print("[dim]Nothing was submitted: plan has no side effects.[/dim]")


def bad_option(option: str, message: str) -> typer.Exit:
    """One line naming the option and the fix; exit status 2 (a usage error), no traceback."""
    err_console.print(f"error: {option}: {message}", style="red", highlight=False, markup=False, soft_wrap=True)
    return typer.Exit(2)


def writable_dir(option: str, path: Path) -> None:
    """Refuse an output directory that cannot be created or written, before any work is done."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".probe-"):
            pass
    except OSError as exc:
        raise bad_option(option, f"{path} is not a writable directory ({exc.strerror or exc}); "
                                 "give one you can write to") from None


def simulate(
    capacity: Annotated[list[int] | None, typer.Option(help="On-prem GPUs (≥ 1); repeat for several loads.")] = None,
    load: Annotated[list[float] | None, typer.Option(
        help="Demand ÷ on-prem GPUs (> 0, finite; the capacity follows); repeat for several loads. Default 1.1 "
             "when neither --capacity nor --load is given.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the workload draws (the first, with --seeds).")] = 2024,
    seeds: Annotated[int, typer.Option(help="Replay with this many seeds (seed, seed+1, …); report mean and worst.")] = 1,
    deadlines: Annotated[list[str] | None, typer.Option(
        help="loose (slack × declared hours) or tight (1.2–3× true hours); repeat for both. Default loose.")] = None,
    out: Annotated[Path, typer.Option(help="Directory for comparison.json/.csv/.png.")] = Path("benchmarks/out/simulate"),
    pods: Annotated[Path | None, typer.Option(help="Pod trace CSV (default: data/traces copy).")] = None,
    jobs: Annotated[Path | None, typer.Option(
        "--jobs", help="Job CSV instead of the pod trace (columns id, arrival_s, gpus, true_hours, …).")] = None,
    spot_traces: Annotated[Path | None, typer.Option(
        "--spot-traces", help="Directory of SkyPilot spot traces (default: data/traces/skypilot-spot-traces).")] = None,
    policy_path: Annotated[Path | None, typer.Option("--policy", help="Placement policy of the simulation.")] = None,
    relaxed_policy: Annotated[Path | None, typer.Option(
        "--relaxed-policy", help="Also replay under this policy (one rule relaxed, e.g. "
                                 "data/traces/simulation-policy-spot-allowed.yaml) and show what the rule costs.")] = None,
    plot: Annotated[Path | None, typer.Option(help="Write PNG plots here (also logged to MLflow if configured).")] = None,
    mlflow_uri: Annotated[str | None, typer.Option(
        "--mlflow-uri", help="MLflow tracking URI for the plots and summary (default: $MLFLOW_TRACKING_URI).")] = None,
) -> None:
    """Replay the pod trace through the placement engine and compare policies (tuned on the first half)."""
    from hybridtrain.simulation.comparison import SIM_POLICY, run_comparison, write_outputs
    from hybridtrain.simulation.traces import SPOT_DIR

    for c in capacity or []:
        if c < 1:
            raise bad_option("--capacity", f"{c} is not a GPU count; give a whole number ≥ 1 (e.g. --capacity 8)")
    for x in load or []:
        if not (math.isfinite(x) and x > 0):
            raise bad_option("--load", f"{x} is not a load; give demand ÷ on-prem GPUs as a finite number > 0 "
                                       "(e.g. --load 1.1)")
    if seed < 0:
        raise bad_option("--seed", f"{seed} is negative; give a whole number ≥ 0")
    if not 1 <= seeds <= 100:
        raise bad_option("--seeds", f"{seeds} is not a number of seeds; give 1 to 100")
    regimes = deadlines or ["loose"]
    for d in regimes:
        if d not in ("loose", "tight"):
            raise bad_option("--deadlines", f"{d!r}; choose loose or tight")
    for option, path in (("--pods", pods), ("--jobs", jobs), ("--policy", policy_path),
                         ("--relaxed-policy", relaxed_policy)):
        if path is not None and not path.is_file():
            raise bad_option(option, f"{path} is not a file")
    if spot_traces is not None and not spot_traces.is_dir():
        raise bad_option("--spot-traces", f"{spot_traces} is not a directory of SkyPilot spot traces")
    writable_dir("--out", out)
    if plot is not None:
        writable_dir("--plot", plot)
    tracking = mlflow_uri or os.environ.get("MLFLOW_TRACKING_URI")
    ablations = []
    try:
        runs = [(c, None) for c in capacity or []] + [(None, x) for x in load or []]
        combos = [{"capacity": c, "load": x, "seed": seed + k, "pods": pods, "jobs_file": jobs, "deadlines": d,
                   "spot_dir": spot_traces or SPOT_DIR, "policy_path": policy_path or SIM_POLICY}
                  for d in regimes for c, x in runs or [(None, 1.1)] for k in range(seeds)]
        if relaxed_policy is None:
            reports = [run_comparison(**kw) for kw in combos]
        else:
            from hybridtrain.simulation.ablation import run_ablation

            ablations = [run_ablation(relaxed_policy, **kw) for kw in combos]
            reports = [a.strict for a in ablations]
    except HybridtrainError as exc:
        raise fail(exc) from None
    for r in reports:
        if r.seed != seed:
            continue  # the full table for the first seed; the rest are in the summary
        wide().print(report_table(r))
        if r.spend:
            wide().print(spend_table(r))
        t, tu = r.targets, r.tuning
        at_gpus = f" at {tu.capacity} GPUs (the same load)" if tu.capacity and tu.capacity != r.capacity else ""
        worth = f", a deadline worth ${tu.miss_above_usd:g}" if tu.miss_above_usd is not None else ""
        console.print(
            f"spot traces: {', '.join(f'{k} ← {Path(v).name}' for k, v in r.spot_traces.items())}; "
            f"tuned on the first half{at_gpus}: duration quantile {tu.quantile} for the run itself, "
            f"{tu.queue_quantile or tu.quantile} for the runs behind it{worth}\n"
            f"at our {t['misses']} misses, threshold burst costs ${t['reference_usd']:,.0f} ({t['reference_basis']}): "
            f"cost ×{t['cost_ratio']:.2f} (≤ {t['cost_target']:.2f}: {_ok(t['cost_ok'])}; ×{t['best_family_ratio']:.2f} "
            f"the cheapest family, {t['best_family']}), cloud ×{t['cloud_ratio']:.2f} "
            f"(≤ 0.50: {_ok(t['cloud_ok'])}), misses {t['misses']} vs {t['misses_first_queued']} at the first queued "
            f"job ({_ok(t['misses_ok'])}), ×{t['bound_ratio']:.2f} the capacity-aware bound (≤ 1.30: "
            f"{_ok(t['bound_ok'])}); {r.seconds:.1f} s",
            highlight=False,
        )
    if seeds > 1 or len(regimes) > 1:
        wide().print(summary_table(reports))
    if ablations:
        wide().print(ablation_table(ablations))
    paths = write_outputs(reports, out)
    if ablations:
        from hybridtrain.simulation.ablation import ablation_rows

        paths.append(out / "rule_ablation.json")
        paths[-1].write_text(json.dumps({"rows": ablation_rows(ablations),
                                         "relaxed": [a.relaxed.to_json() for a in ablations]}, indent=2, default=str))
    if plot is not None:
        from hybridtrain.simulation.plots import log_to_mlflow, write_plots

        pngs = write_plots(reports, plot)
        paths += pngs
        if tracking:
            run_id = log_to_mlflow(reports, [*pngs, paths[0]], tracking)
            console.print(f"logged to MLflow at {tracking}: run {run_id}", highlight=False)
    console.print(f"wrote {', '.join(str(p) for p in paths)}")


def summary_table(reports) -> Table:  # reports: list[comparison.Report]
    """Per regime and load: mean and worst over seeds of each target, and how many seeds met it."""
    from hybridtrain.simulation.plots import summary_metrics

    table = Table(title="Targets over seeds (mean / worst)")
    for col in ("deadlines", "demand", "seeds", "cost ×ref", "target", "cloud ×ref", "×bound", "misses ≤ first-queued"):
        table.add_column(col, justify="left" if col == "deadlines" else "right")
    groups: dict = {}
    for r in reports:
        groups.setdefault((r.deadlines, round(r.demand_ratio, 2)), []).append(r)
    summary = summary_metrics(reports)
    for (regime, ld), rs in groups.items():
        k = f"{regime}_{ld:.2f}x_"
        table.add_row(regime, f"{ld:.2f}×", str(len(rs)),
                      f"{summary[k + 'cost_ratio_mean']:.3f} / {summary[k + 'cost_ratio_worst']:.3f}",
                      f"≤ {rs[0].targets['cost_target']:.2f}",
                      f"{summary[k + 'cloud_ratio_mean']:.3f} / {summary[k + 'cloud_ratio_worst']:.3f}",
                      f"{summary[k + 'bound_ratio_mean']:.3f} / {summary[k + 'bound_ratio_worst']:.3f}",
                      f"{sum(r.targets['misses_ok'] for r in rs)}/{len(rs)}")
    return table


def ablation_table(ablations) -> Table:  # ablations: list[ablation.Ablation]
    """With the rule and without it, per regime and load: our ratios and what the rule costs (mean / worst)."""
    from hybridtrain.simulation.ablation import ablation_rows

    rows = ablation_rows(ablations)
    table = Table(title=f"What the rule costs ({', '.join(rows[0]['classes']) or 'no class'} changed; "
                        "every contender under each side's policy; mean / worst over seeds)")
    for col in ("deadlines", "demand", "rule", "cost ×ref", "cloud ×ref", "×bound", "misses", "ours $",
                "spot GPU-h", "rule costs $"):
        table.add_column(col, justify="left" if col in ("deadlines", "rule") else "right")
    for r in rows:
        def mw(k: str, r: dict = r) -> str:
            return f"{r[k][0]:.3f} / {r[k][1]:.3f}"
        table.add_row(r["deadlines"], f"{r['demand_ratio']:.2f}×", f"{r['rule']} ({Path(r['policy']).name})",
                      mw("cost_ratio"), mw("cloud_ratio"), mw("bound_ratio"), f"{r['misses']:.0f}",
                      f"{r['ours_usd']:,.0f}", f"{r['spot_gpu_hours']:,.0f}",
                      f"{r['rule_usd'][0]:+,.0f} / {r['rule_usd'][1]:+,.0f}" if r["rule"] == "with" else "")
    return table


def _ok(flag: bool) -> str:
    return "[green]met[/green]" if flag else "[red]not met[/red]"


def report_table(r) -> Table:  # r: comparison.Report
    table = Table(title=f"{r.capacity} on-prem GPUs, demand {r.demand_ratio:.2f}× (report half of the trace)")
    for col in ("policy", "total $", "cloud $", "egress $", "missed", "miss %", "mean h", "p95 h", "on-prem util",
                "preempt", "evict", "lost GPU-h", "cloud jobs"):
        table.add_column(col, justify="right" if col != "policy" else "left")
    for m in r.rows:
        def f(v: float, fmt: str) -> str:
            return "—" if v != v else format(v, fmt)
        table.add_row(m.name, f(m.total_usd, ",.0f"), f(m.cloud_usd, ",.0f"), f(m.egress_usd, ",.0f"),
                      str(m.misses) if m.name != "lower_bound" else "—", f(100 * m.miss_rate, ".2f"),
                      f(m.mean_completion_h, ".2f"), f(m.p95_completion_h, ".2f"), f(m.onprem_utilization, ".2f"),
                      str(m.preemptions) if m.name != "lower_bound" else "—",
                      str(m.evictions) if m.name != "lower_bound" else "—", f(m.lost_gpu_hours, ".1f"),
                      str(m.cloud_jobs) if m.name != "lower_bound" else "—",
                      style="bold" if m.name == "ours" else None)
    return table


def spend_table(r) -> Table:  # r: comparison.Report
    """Where our policy's dollars went, per job class: on-prem, cloud at arrival, cloud after waiting on-prem."""
    total = sum(x["usd"] for x in r.spend) or 1.0
    table = Table(title=f"Where ours spent ${total:,.0f} (lower bound ${r.bound.get('usd', float('nan')):,.0f})")
    for col in ("job class", "where", "jobs", "$", "share", "on-prem GPU-h", "spot GPU-h", "on-demand GPU-h",
                "restart GPU-h"):
        table.add_column(col, justify="left" if col in ("job class", "where") else "right")
    for x in r.spend:
        table.add_row(x["job_class"], x["where"], str(x["jobs"]), f"{x['usd']:,.0f}", f"{x['usd'] / total:.0%}",
                      f"{x['onprem_gpu_hours']:,.0f}", f"{x['spot_gpu_hours']:,.0f}", f"{x['od_gpu_hours']:,.0f}",
                      f"{x['overhead_gpu_hours']:,.1f}")
    return table


def register(app: typer.Typer) -> None:
    """Add ``plan`` and ``simulate`` to the main CLI."""
    app.command("plan")(plan)
    app.command("simulate")(simulate)
