"""Policy: the placement rules as code — which sites and capacity a job may use, at what price and budget.

The policy is ``deployments/policy.yaml`` (``kind: PlacementPolicy``), validated like every
other file here, so changing where data may go needs no Python. It is evaluated for every
candidate — a (site, capacity class) pair: on-prem ``fixed``, cloud on-demand ``burst``, cloud
spot ``opportunistic`` — and every rejection names the rule that made it and the numbers.

Checks, in the order they are applied (the first that fails is reported):

1. the job spec's own limits: ``placement.site`` pin, ``resources.gpus`` (the site must have that
   many GPUs, times ``resources.nodes``), ``resources.nodes`` (enough SSH hosts: ``node_fit``), ``resources.gpu_type``, ``data_policy.residency`` (site jurisdiction);
2. the job class's allowed capacity classes (``job_classes.<class>.capacity_classes``);
3. ``rules[i]`` in file order, each applying to the requests its ``when`` matches: allowed sites,
   jurisdictions, site kinds, "data stays at its site", GPU types, capacity classes, price cap;
4. once a cost estimate exists: each rule's egress and cost caps, the spec's ``budget_usd``,
   ``budgets.per_job_usd`` and the team's remaining budget (``budgets.teams``; spend passed in).

Example: a confidential, approved dataset in the EU; rule ``rules[1] (confidential data only in
EU)`` rejects ``cloud-us`` with "site cloud-us is in jurisdiction US; allowed: EU", while
``cloud-eu`` passes and is then priced.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, FiniteFloat

from hybridtrain.errors import Problem, SpecError
from hybridtrain.placement.node_fit import node_shortfall
from hybridtrain.placement.request import DataTier, ResourceRequest
from hybridtrain.placement.strategy import STRATEGIES
from hybridtrain.specs.config_file import load_model, validate_data
from hybridtrain.specs.job import Sensitivity
from hybridtrain.specs.sites import NAME_RE, CapacityClass, Site, SiteKind, SitesCatalog

if TYPE_CHECKING:
    from hybridtrain.placement.cost_model import Estimate
    from hybridtrain.placement.strategy import Strategy


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


#: A rule's lists of what it allows: ``None`` (left out) allows all, an empty list nothing.
ALLOW_LISTS = ("sites", "jurisdictions", "site_kinds", "gpu_types", "capacity_classes")


def _bad_name(what: str, name: str, spec_field: str, example: str) -> str:
    return (f"{name!r} is not a {what} name, so no spec's {spec_field} can name it: use lowercase letters, digits "
            f"and '-', e.g. {example}")


def _lookalike(value: str) -> str:
    """``value`` with case, separators and the letters most often typed for digits (O, I, l) ironed out."""
    return re.sub(r"[\s_.-]", "", value.upper()).translate(str.maketrans("OIL", "011"))


def _catalog_problems(path: str, listed: Sequence[str] | None, known: Sequence[str], what: str, *,
                      allow_list: bool) -> list[Problem]:
    """Entries of a rule's list that the sites catalog cannot mean.

    An entry no site has is fine on its own (a policy may name a jurisdiction or GPU type before a
    site with it is added: ``gpu_types: [A100, H100]`` with only A100 sites), unless it is a
    lookalike of one the catalog has (``A1OO`` for ``A100``, ``eu`` for ``EU``). An allow-list that
    names nothing any site has would refuse every candidate the rule applies to: refused too.
    """
    if not listed:
        return []
    catalog = sorted(set(known))
    shown = ", ".join(catalog) or "none"
    out = []
    for j, value in enumerate(listed):
        if value in catalog:
            continue
        near = [k for k in catalog if _lookalike(k) == _lookalike(value)]
        if near:
            out.append(Problem(f"{path}[{j}]", f"no site has {what} {value!r}; did you mean {near[0]!r}? "
                                               f"(the sites catalog has: {shown})"))
    if allow_list and not out and not any(v in catalog for v in listed):
        out.append(Problem(path, f"no site has {what} {', '.join(listed)} (the sites catalog has: {shown}), so "
                                 "this rule would refuse every candidate it applies to: list one the catalog has, "
                                 "or fix the catalog"))
    return out


def capacity_options(site: Site) -> tuple[CapacityClass, ...]:
    """The capacity classes a site offers: its own class, plus spot where it has a spot price."""
    if site.spot_price_per_gpu_hour is not None and site.capacity_class is not CapacityClass.opportunistic:
        return (site.capacity_class, CapacityClass.opportunistic)
    return (site.capacity_class,)


def option_price(site: Site, klass: CapacityClass) -> float:
    """Price per GPU-hour of one capacity class at a site."""
    if klass is CapacityClass.opportunistic and site.spot_price_per_gpu_hour is not None:
        return site.spot_price_per_gpu_hour
    return site.gpu_hour_price


class Match(Strict):
    """Which requests a rule applies to: every listed field must match; an empty list matches all."""

    sensitivity: tuple[Sensitivity, ...] = Field((), description="Data sensitivity levels.")
    tier: tuple[DataTier, ...] = Field((), description="Tier of the data that would move: raw, curated, approved.")
    teams: tuple[str, ...] = Field((), description="Teams (spec metadata.team).")
    job_classes: tuple[str, ...] = Field((), description="Job classes (spec placement.job_class).")
    gpu_types: tuple[str, ...] = Field((), description="Requested GPU types (spec resources.gpu_type).")

    def matches(self, request: ResourceRequest, job_class: str) -> bool:
        return (
            (not self.sensitivity or request.sensitivity in self.sensitivity)
            and (not self.tier or request.tier in self.tier)
            and (not self.teams or request.team in self.teams)
            and (not self.job_classes or job_class in self.job_classes)
            and (not self.gpu_types or request.gpu_type in self.gpu_types)
        )


class Rule(Strict):
    """One rule: for the requests ``when`` matches, the candidates it allows and the caps it sets."""

    name: str = Field(min_length=1, description="The rule in a few words; quoted in every rejection it makes.")
    when: Match = Field(default_factory=Match, description="Requests the rule applies to (default: all).")
    sites: tuple[str, ...] | None = Field(None, description="Only these sites.")
    jurisdictions: tuple[str, ...] | None = Field(None, description="Only sites in these jurisdictions, e.g. [EU].")
    site_kinds: tuple[SiteKind, ...] | None = Field(None, description="Only these kinds of site: onprem, cloud.")
    stay_at_data_site: bool = Field(False, description="The data may not leave the site that holds it.")
    gpu_types: tuple[str, ...] | None = Field(None, description="Only sites with these GPU types.")
    capacity_classes: tuple[CapacityClass, ...] | None = Field(
        None, description="Only these capacity classes: fixed, burst, opportunistic."
    )
    max_price_per_gpu_hour: FiniteFloat | None = Field(
        None, gt=0, description="USD cap on the candidate's GPU-hour price.")
    max_egress_gb: FiniteFloat | None = Field(None, ge=0, description="Cap on GB moved between sites for one job.")
    max_egress_usd: FiniteFloat | None = Field(None, ge=0, description="Cap on the job's data-movement cost.")
    max_cost_usd: FiniteFloat | None = Field(None, gt=0, description="Cap on the job's estimated total cost.")

    @property
    def static_fields(self) -> bool:
        return any(
            v is not None and v is not False
            for v in (self.sites, self.jurisdictions, self.site_kinds, self.stay_at_data_site or None,
                      self.gpu_types, self.capacity_classes, self.max_price_per_gpu_hour)
        )

    @property
    def cost_fields(self) -> bool:
        return any(v is not None for v in (self.max_egress_gb, self.max_egress_usd, self.max_cost_usd))

    def static_reason(self, request: ResourceRequest, site: Site, klass: CapacityClass) -> str | None:
        """Why this rule rejects the candidate before any cost is known (None: it does not)."""
        if self.sites is not None and site.name not in self.sites:
            return f"site {site.name} is not one of the allowed sites ({', '.join(self.sites)})"
        if self.jurisdictions is not None and site.jurisdiction not in self.jurisdictions:
            return f"site {site.name} is in jurisdiction {site.jurisdiction}; allowed: {', '.join(self.jurisdictions)}"
        if self.site_kinds is not None and site.kind not in self.site_kinds:
            return f"site {site.name} is {site.kind.value}; allowed: {', '.join(k.value for k in self.site_kinds)}"
        if self.stay_at_data_site and site.name != request.data_site:
            return f"the {request.tier.value} data may not leave {request.data_site}"
        if self.gpu_types is not None and site.gpu_type not in self.gpu_types:
            return f"site {site.name} has {site.gpu_type or 'no GPU'}; allowed: {', '.join(self.gpu_types)}"
        if self.capacity_classes is not None and klass not in self.capacity_classes:
            allowed = ", ".join(c.value for c in self.capacity_classes)
            return f"{klass.value} capacity is not allowed; allowed: {allowed}"
        if self.max_price_per_gpu_hour is not None:
            price = option_price(site, klass)
            if price > self.max_price_per_gpu_hour:
                return f"${price:.4f}/GPU-h exceeds the cap ${self.max_price_per_gpu_hour:.4f}/GPU-h"
        return None

    def cost_reason(self, egress_gb: float, egress_usd: float, total_usd: float) -> str | None:
        """Why this rule rejects the candidate once it is priced (None: it does not)."""
        if self.max_egress_gb is not None and egress_gb > self.max_egress_gb:
            return f"moves {egress_gb:.1f} GB; the cap is {self.max_egress_gb:g} GB"
        if self.max_egress_usd is not None and egress_usd > self.max_egress_usd:
            return f"data movement costs ${egress_usd:.2f}; the cap is ${self.max_egress_usd:.2f}"
        if self.max_cost_usd is not None and total_usd > self.max_cost_usd:
            return f"estimated ${total_usd:.2f}; the cap is ${self.max_cost_usd:.2f}"
        return None


class JobClass(Strict):
    """A class of jobs and the capacity it may use (e.g. only opportunistic jobs may use spot)."""

    capacity_classes: tuple[CapacityClass, ...] = Field(
        min_length=1, description="Capacity classes this class may use: fixed, burst, opportunistic."
    )
    strategy: str | None = Field(None, description="Placement strategy for this class (default: default_strategy).")
    description: str = ""


def _team_cap(cap: float) -> float:
    if cap < 0:
        raise ValueError(f"{cap:g} is not a budget: give the USD the team may spend this period, >= 0 (0 stops its "
                         "jobs), or leave the team out for no cap")
    return cap


class Budgets(Strict):
    """Spend caps: per job, and per team for the current budget period (spend so far is an input)."""

    per_job_usd: FiniteFloat | None = Field(None, gt=0, description="No single job may be estimated above this.")
    teams: dict[str, Annotated[FiniteFloat, AfterValidator(_team_cap)]] = Field(
        default_factory=dict, description="Team → USD it may spend in the current period (>= 0; 0: nothing)."
    )


@dataclass(frozen=True, slots=True)
class Verdict:
    """The policy's answer for one candidate: allowed, or the rule that rejected it and why."""

    site: str
    capacity_class: CapacityClass
    allowed: bool
    rule: str | None = None
    reason: str | None = None

    def __str__(self) -> str:
        head = f"{self.site} ({self.capacity_class.value})"
        return f"{head}: allowed" if self.allowed else f"{head}: rejected by {self.rule}: {self.reason}"


ALLOWED = "allowed"


class Policy(Strict):
    """Placement policy (``kind: PlacementPolicy``): job classes, budgets, rules and the default strategy."""

    apiVersion: Literal["hybridtrain/v1"] = Field(description="Policy format version.")
    kind: Literal["PlacementPolicy"] = "PlacementPolicy"
    default_strategy: str = Field("onprem_first", description="Strategy used when a job class or spec names none.")
    wait_slo_hours: FiniteFloat = Field(
        4.0, gt=0, description="For jobs without a deadline: the longest they should wait before starting."
    )
    default_job_class: str = Field("standard", pattern=NAME_RE, description="Class of jobs whose spec names none.")
    job_classes: dict[str, JobClass] = Field(
        default_factory=lambda: {"standard": JobClass(capacity_classes=(CapacityClass.fixed, CapacityClass.burst))},
        description="Job class name → the capacity it may use.",
    )
    strategy_options: dict[str, dict[str, float]] = Field(
        default_factory=dict, description="Strategy name → its parameters, e.g. deadline_spot: {max_onprem_wait_hours: 1}."
    )
    budgets: Budgets = Field(default_factory=Budgets)
    rules: tuple[Rule, ...] = Field((), description="Applied in order to every candidate; first rejection wins.")

    # --- loading -------------------------------------------------------------------------

    @classmethod
    def load(cls, path: Path | str, sites: SitesCatalog | None = None) -> Policy:
        """Load ``path`` and check it (against ``sites`` when given); one ``SpecError`` lists every problem."""
        return load_model(cls, path, semantic=lambda p: p.check(sites))

    @classmethod
    def parse(cls, data: object, source: str = "placement policy", sites: SitesCatalog | None = None) -> Policy:
        return validate_data(cls, data, source=source, semantic=lambda p: p.check(sites))

    def check(self, sites: SitesCatalog | None = None) -> list[Problem]:
        """Cross-field rules the field types cannot express."""

        p: list[Problem] = []
        if self.default_strategy not in STRATEGIES:
            p.append(Problem("default_strategy", STRATEGIES.unknown_message(self.default_strategy)))
        if self.default_job_class not in self.job_classes:
            p.append(Problem("default_job_class", f"{self.default_job_class!r} is not in job_classes "
                                                  f"({', '.join(sorted(self.job_classes))})"))
        for name, options in self.strategy_options.items():
            if name not in STRATEGIES:
                p.append(Problem(f"strategy_options.{name}", STRATEGIES.unknown_message(name)))
                continue
            try:
                STRATEGIES.create(name, **options)
            except SpecError as err:
                p.extend(err.problems)
            except (TypeError, ValueError) as err:
                p.append(Problem(f"strategy_options.{name}", str(err)))
        for name, jc in self.job_classes.items():
            if jc.strategy is not None and jc.strategy not in STRATEGIES:
                p.append(Problem(f"job_classes.{name}.strategy", STRATEGIES.unknown_message(jc.strategy)))
            if CapacityClass.opportunistic in jc.capacity_classes and CapacityClass.burst not in jc.capacity_classes:
                p.append(Problem(f"job_classes.{name}.capacity_classes",
                                 "opportunistic (spot) needs burst too: spot runs fall back to on-demand "
                                 "to meet their deadline"))
        for i, rule in enumerate(self.rules):
            if not rule.static_fields and not rule.cost_fields:
                p.append(Problem(f"rules[{i}]", "this rule constrains nothing: give sites, jurisdictions, "
                                                "site_kinds, stay_at_data_site, gpu_types, capacity_classes or a cap"))
            for j, jc_name in enumerate(rule.when.job_classes):
                if jc_name not in self.job_classes:
                    p.append(Problem(f"rules[{i}].when.job_classes[{j}]",
                                     f"unknown job class {jc_name!r}; known: {', '.join(sorted(self.job_classes))}"))
            for field in ALLOW_LISTS:
                if getattr(rule, field) == ():
                    p.append(Problem(f"rules[{i}].{field}",
                                     f"an empty list allows nothing, so this rule would refuse every candidate it "
                                     f"applies to: list the {field.replace('_', ' ')} to allow, or leave {field} out "
                                     "to allow all"))
            for j, team in enumerate(rule.when.teams):
                if not re.match(NAME_RE, team):
                    p.append(Problem(f"rules[{i}].when.teams[{j}]", _bad_name("team", team, "metadata.team", "growth")))
            if sites is not None and rule.sites is not None:
                for j, s in enumerate(rule.sites):
                    if s not in sites.names:
                        p.append(Problem(f"rules[{i}].sites[{j}]",
                                         f"unknown site {s!r}; known: {', '.join(sites.names)}"))
            if sites is not None:
                jurisdictions = [s.jurisdiction for s in sites.sites]
                gpu_types = [s.gpu_type for s in sites.sites if s.gpu_type]
                p += _catalog_problems(f"rules[{i}].jurisdictions", rule.jurisdictions, jurisdictions, "jurisdiction",
                                       allow_list=True)
                p += _catalog_problems(f"rules[{i}].gpu_types", rule.gpu_types, gpu_types, "GPU type",
                                       allow_list=True)
                p += _catalog_problems(f"rules[{i}].when.gpu_types", rule.when.gpu_types, gpu_types, "GPU type",
                                       allow_list=False)
        for name in self.job_classes:
            if not re.match(NAME_RE, name):
                p.append(Problem(f"job_classes.{name}",
                                 _bad_name("job class", name, "placement.job_class", "batch-gpu")))
        for team in self.budgets.teams:
            if not re.match(NAME_RE, team):
                p.append(Problem(f"budgets.teams.{team}", _bad_name("team", team, "metadata.team", "growth")))
        return p

    # --- evaluation ----------------------------------------------------------------------

    def job_class_of(self, request: ResourceRequest) -> str:
        """The request's job class (the policy default when it names none); unknown names are a spec error."""
        name = request.job_class or self.default_job_class
        if name not in self.job_classes:
            raise SpecError(
                f"job {request.job}",
                [Problem("placement.job_class",
                         f"unknown job class {name!r}; the policy knows: {', '.join(sorted(self.job_classes))}")],
            )
        return name

    def strategy_for(self, request: ResourceRequest) -> str:
        """Strategy name: the spec's, else the job class's, else the policy default."""
        if request.strategy:
            return request.strategy
        return self.job_classes[self.job_class_of(request)].strategy or self.default_strategy

    def strategy(self, name: str | None = None) -> Strategy:
        """The named strategy (default: ``default_strategy``) with this policy's options for it."""

        name = name or self.default_strategy
        return STRATEGIES.create(name, **self.strategy_options.get(name, {}))

    def matching_rules(self, request: ResourceRequest) -> list[tuple[int, Rule]]:
        job_class = self.job_class_of(request)
        return [(i, r) for i, r in enumerate(self.rules) if r.when.matches(request, job_class)]

    def static_verdict(
        self, request: ResourceRequest, site: Site, klass: CapacityClass,
        rules: Sequence[tuple[int, Rule]] | None = None,
    ) -> Verdict:
        """Checks 1–3 (everything that needs no cost estimate)."""
        def no(rule: str, reason: str) -> Verdict:
            return Verdict(site.name, klass, False, rule, reason)

        if request.pinned_site is not None and site.name != request.pinned_site:
            return no("spec placement.site", f"the job is pinned to {request.pinned_site}")
        if site.gpu_count < request.gpus:
            need = (f"{request.gpus} ({request.nodes} nodes × {request.gpus_per_node})" if request.nodes > 1
                    else f"{request.gpus}")
            return no("spec resources.gpus", f"site {site.name} has {site.gpu_count} GPUs; the job needs {need}")
        nodes = node_shortfall(site, request.nodes, request.gpus_per_node)
        if nodes is not None:
            return no("spec resources.nodes", nodes)
        if request.gpu_type is not None and site.gpu_type != request.gpu_type:
            return no("spec resources.gpu_type",
                      f"site {site.name} has {site.gpu_type or 'no GPU'}; the job needs {request.gpu_type}")
        if request.residency and site.jurisdiction not in request.residency:
            return no("spec data_policy.residency",
                      f"site {site.name} is in {site.jurisdiction}; the data may only be processed in "
                      f"{', '.join(request.residency)}")
        job_class = self.job_class_of(request)
        allowed = self.job_classes[job_class].capacity_classes
        if klass not in allowed:
            return no(f"job_classes.{job_class}.capacity_classes",
                      f"{klass.value} capacity is not allowed for job class {job_class} "
                      f"(allowed: {', '.join(c.value for c in allowed)})")
        for i, rule in rules if rules is not None else self.matching_rules(request):
            reason = rule.static_reason(request, site, klass)
            if reason is not None:
                return no(f"rules[{i}] ({rule.name})", reason)
        return Verdict(site.name, klass, True)

    def cost_verdict(
        self,
        request: ResourceRequest,
        site: str,
        klass: CapacityClass,
        *,
        egress_gb: float,
        egress_usd: float,
        total_usd: float,
        team_spent_usd: float = 0.0,
        rules: Sequence[tuple[int, Rule]] | None = None,
    ) -> Verdict:
        """Check 4 (caps on the estimate) for a candidate that passed checks 1–3."""
        def no(rule: str, reason: str) -> Verdict:
            return Verdict(site, klass, False, rule, reason)

        for i, rule in rules if rules is not None else self.matching_rules(request):
            if rule.cost_fields:
                reason = rule.cost_reason(egress_gb, egress_usd, total_usd)
                if reason is not None:
                    return no(f"rules[{i}] ({rule.name})", reason)
        if request.budget_usd is not None and total_usd > request.budget_usd:
            return no("spec budget_usd", f"estimated ${total_usd:.2f} exceeds the job budget ${request.budget_usd:.2f}")
        if self.budgets.per_job_usd is not None and total_usd > self.budgets.per_job_usd:
            return no("budgets.per_job_usd",
                      f"estimated ${total_usd:.2f} exceeds the per-job cap ${self.budgets.per_job_usd:.2f}")
        team_cap = self.budgets.teams.get(request.team)
        if team_cap is not None and total_usd > team_cap - team_spent_usd:
            return no(f"budgets.teams.{request.team}",
                      f"estimated ${total_usd:.2f} exceeds the team's remaining "
                      f"${max(team_cap - team_spent_usd, 0):.2f} (${team_spent_usd:.2f} of ${team_cap:.2f} spent)")
        return Verdict(site, klass, True)

    def evaluate(
        self,
        request: ResourceRequest,
        site: Site,
        capacity_class: CapacityClass | None = None,
        *,
        estimate: Estimate | None = None,
        team_spend: Mapping[str, float] | None = None,
    ) -> Verdict:
        """The verdict for one candidate; caps on cost are checked only when ``estimate`` is given."""
        klass = capacity_class or site.capacity_class
        rules = self.matching_rules(request)
        verdict = self.static_verdict(request, site, klass, rules)
        if not verdict.allowed or estimate is None:
            return verdict
        return self.cost_verdict(
            request, site.name, klass,
            egress_gb=estimate.egress_gb, egress_usd=estimate.egress_usd, total_usd=estimate.total_usd,
            team_spent_usd=(team_spend or {}).get(request.team, 0.0), rules=rules,
        )

    def evaluate_all(
        self,
        request: ResourceRequest,
        sites: Iterable[Site] | SitesCatalog,
        *,
        estimates: Mapping[tuple[str, CapacityClass], Estimate] | None = None,
        team_spend: Mapping[str, float] | None = None,
    ) -> list[Verdict]:
        """One verdict per candidate (site × capacity class it offers), in catalog order."""
        site_list = sites.sites if isinstance(sites, SitesCatalog) else tuple(sites)
        out = []
        for site in site_list:
            for klass in capacity_options(site):
                est = (estimates or {}).get((site.name, klass))
                out.append(self.evaluate(request, site, klass, estimate=est, team_spend=team_spend))
        return out
