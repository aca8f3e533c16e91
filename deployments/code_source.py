"""CodeSource: where each work pool's workers get the project code for a flow run.

By default (``hybridtrain deploy``) every deployment's pull step enters the deploying checkout
(``set_working_directory``): workers share this host's files. For sites on separate hosts,
``hybridtrain deploy --code-repo [POOL=]URL`` gives a pool's deployments this pull step instead, run
by the worker at its site when a flow run starts::

    - prefect.deployments.steps.git_clone:
        repository: URL                       # as that site reaches the repository
        commit_sha: <the deployer's commit>   # every site runs the deployed code

The process worker starts each flow run in a fresh temporary directory; the step clones the commit
there and the flow imports the project from that clone. The workspace (configs, data, state) is the
worker's own site root, ``HYBRIDTRAIN_HOME`` in its environment: the deployments lose the deployer's
value from their job environment. (A pull step's ``{{ $VAR }}`` is filled in by ``prefect deploy``
from the deployer's environment, so the site root cannot be named in the step itself.)
"""

from __future__ import annotations

import copy
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hybridtrain.errors import Problem, SpecError


@dataclass(frozen=True)
class CodeSource:
    """Git repository per pool (as that pool's workers reach it) and the commit they all check out."""

    repositories: dict[str, str]
    commit: str

    @classmethod
    def parse(cls, specs: list[str], pools: list[str], root: Path, ref: str = "HEAD") -> CodeSource | None:
        """``URL`` (every pool) or ``POOL=URL`` items, checked against the catalog's pools; the commit is
        ``ref`` of the deploying checkout at ``root``. None when no item is given."""
        if not specs:
            return None
        repos: dict[str, str] = {}
        problems: list[Problem] = []
        for item in specs:
            pool, sep, url = item.partition("=")
            if not sep or "://" in pool or pool.startswith(("git@", "/")):  # a bare URL: every pool
                pool, url = "", item
            url = url.strip()
            if not url:
                problems.append(Problem("--code-repo", f"{item!r} has no repository URL; give URL or POOL=URL"))
                continue
            if pool and pool not in pools:
                problems.append(Problem("--code-repo", f"pool {pool!r} is not in the sites catalog (pools: "
                                                       f"{', '.join(pools)}); give one of them or no POOL= at all"))
                continue
            for p in ([pool] if pool else pools):
                repos[p] = url
        if problems:
            raise SpecError("hybridtrain deploy", problems)
        return cls(repositories=repos, commit=deployed_commit(root, ref))

    def pull_steps(self, pool: str) -> list[dict[str, Any]] | None:
        """The pull steps of ``pool``'s deployments; None for a pool that keeps the shared checkout."""
        url = self.repositories.get(pool)
        if url is None:
            return None
        return [{"prefect.deployments.steps.git_clone": {"repository": url, "commit_sha": self.commit}}]

    def apply(self, config: dict[str, Any]) -> dict[str, Any]:
        """``deployments/prefect.yaml`` (loaded, anchors expanded) with the pull steps of each deployment's pool."""
        out = copy.deepcopy(config)
        deployments = []
        for dep in out.get("deployments") or []:
            dep = copy.deepcopy(dep)  # anchors made the pools' job variables one shared object
            pool = (dep.get("work_pool") or {}).get("name")
            steps = self.pull_steps(pool)
            if steps is not None:
                dep["pull"] = steps
                env = ((dep["work_pool"].get("job_variables") or {}).get("env")) or {}
                env.pop("HYBRIDTRAIN_HOME", None)  # each worker's own site root applies
            deployments.append(dep)
        out["deployments"] = deployments
        return out


def deployed_commit(root: Path, ref: str) -> str:
    """The full commit id of ``ref`` in the checkout at ``root``."""
    proc = subprocess.run(["git", "-C", str(root), "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
                          check=False, capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise SpecError("hybridtrain deploy", [Problem(
            "--code-ref", f"{ref!r} is not a commit of a git checkout at {root}; deploy from a clone of the "
                          "repository the workers fetch, with the commit pushed there")])
    return proc.stdout.strip()
