"""A user in Chromium: open the lifecycle deployment, fill the custom-run form, submit, follow the run to
the end, read its progress lines and artifacts, then find the ``champion`` alias on MLflow's model page.

Everything is real: a served Prefect (UI, API, services), an MLflow server, ``hybridtrain deploy`` and a
process worker (``tests/ui/conftest.py``). Playwright drives Debian's Chromium (its own browser
download cannot work here). With ``HYBRIDTRAIN_SCREENSHOTS=1`` the README's screenshots are rewritten.
"""

from __future__ import annotations

import re
import time

import pytest

from tests.ui.conftest import screenshot_dir
from tests.ui.served_stack import get_json

pytestmark = pytest.mark.slow

DEPLOYMENT = "training-lifecycle/churn-nightly-cloud-eu"
RUN_TIMEOUT_S = 900  # a small job; the worker starts a fresh Python process for the run
MODEL = "churn-classifier"
#: Submits of the form when the server answers 503 (SQLite busy: a retryable error), and the pause before the
#: next one, doubling each time (2, 4, 8, 16, 32 s: about a minute in all, as a patient user would retry).
SUBMIT_TRIES = 6
FIRST_PAUSE_S = 2.0


def wait_for_final_state(api: str, run_id: str, timeout_s: float = RUN_TIMEOUT_S) -> dict:
    """Poll the API (as the UI does) until the flow run is in a final state."""
    deadline = time.monotonic() + timeout_s
    while True:
        run = get_json(f"{api}/flow_runs/{run_id}")
        if run["state"]["type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
            return run
        if time.monotonic() > deadline:
            raise AssertionError(f"flow run {run_id} still {run['state']['name']} after {timeout_s:.0f} s")
        time.sleep(2)


def shoot(page, name: str) -> None:
    where = screenshot_dir()
    if where is not None:
        where.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(where / f"{name}.png"))


def test_a_user_runs_the_lifecycle_from_the_prefect_ui_and_finds_the_champion_in_mlflow(stack, page):
    from playwright.sync_api import expect

    deployment = get_json(f"{stack.api}/deployments/name/{DEPLOYMENT}")

    # The deployment page, then Run -> Custom run: the form lists the parameters with their descriptions.
    page.goto(f"{stack.ui}/deployments/deployment/{deployment['id']}")
    expect(page.locator("body")).to_contain_text("churn-nightly-cloud-eu")
    page.get_by_role("button", name="Run", exact=True).first.click()
    page.get_by_text("Custom run").click()
    expect(page).to_have_url(re.compile(r"/deployments/deployment/.+/run"))
    expect(page.get_by_text("Job spec file, relative to the workspace").first).to_be_visible()
    page.locator(".schema-form-property").filter(has=page.get_by_text("spec_path (Optional)", exact=True)) \
        .locator("textarea").fill("jobs/ui.yaml")
    dispatch = page.locator(".schema-form-property").filter(has=page.get_by_text("dispatch (Optional)", exact=True)) \
        .locator("button.p-select-button__control")
    dispatch.focus()
    dispatch.press("ArrowDown")  # opens the options (a plain click toggles it open and shut)
    page.locator(".p-select-option").filter(has_text=re.compile(r"^\s*inline\s*$")).click()
    expect(dispatch).to_have_text("inline")  # every stage in the run's own process: quick
    for attempt in range(SUBMIT_TRIES):
        with page.expect_response(lambda r: r.url.endswith("/create_flow_run")) as created:
            page.get_by_role("button", name="Submit").click()
        if created.value.status != 503 or attempt == SUBMIT_TRIES - 1:
            break
        # The server said "retry" (SQLite busy under load: a write committed while this one read, which no
        # busy timeout waits out): the UI shows an error toast, and a user submits again a moment later.
        expect(page.get_by_text("Something went wrong").first).to_be_visible()
        page.wait_for_timeout(FIRST_PAUSE_S * 1000 * 2 ** attempt)
    assert created.value.ok, (created.value.status, created.value.text(), stack.logs())
    run = created.value.json()

    # The deployment's runs list shows the new run; open it and follow it until it ends.
    page.get_by_role("link", name=run["name"]).first.click()
    expect(page).to_have_url(re.compile(f"/runs/flow-run/{run['id']}"))
    run_id = run["id"]
    final = wait_for_final_state(stack.api, run_id)
    assert final["state"]["type"] == "COMPLETED", (final["state"], stack.logs())
    assert final["parameters"]["spec_path"] == "jobs/ui.yaml" and final["parameters"]["dispatch"] == "inline"

    # The run's log holds the progress lines: stage start/end, placement, sync, epochs, verdicts.
    page.reload()
    logs = page.locator("body")
    for line in ("preprocess finished at onprem-dc1", "placement: cloud-eu", "sync finished:",
                 "train epoch 2/2 at cloud-eu: loss", "evaluate verdict at cloud-eu", "promote gates for",
                 "0 failed; champion -> v1"):
        expect(logs).to_contain_text(line, timeout=60_000)
    shoot(page, "run-page")

    # Training's progress artifact, kept by the worker's flow-run process in the background, ends at 100 %.
    children = get_json(f"{stack.api}/flow_runs/filter", {"flow_runs": {"parent_flow_run_id": {"any_": [run_id]}}})
    runs = {run_id, *(c["id"] for c in children)}
    trained = [a for a in get_json(f"{stack.api}/artifacts/filter", {"artifacts": {"key": {"any_": ["train-progress"]}}})
               if a["flow_run_id"] in runs]
    assert [a["data"] for a in trained] == [100.0], trained

    # The summary artifact: stages, gates and the two pictures, shown (decoded) by the browser.
    summary = next(a for a in get_json(f"{stack.api}/artifacts/filter", {"artifacts": {"key": {"any_": ["lifecycle-churn"]}}})
                   if a["flow_run_id"] == run_id)
    page.goto(f"{stack.ui}/artifacts/artifact/{summary['id']}")
    expect(page.get_by_text("Lifecycle of").first).to_be_visible()
    expect(page.get_by_text("Promotion gates").first).to_be_visible()
    pictures = page.locator("img[alt='Learning curves'], img[alt='Cost breakdown']")
    expect(pictures).to_have_count(2)
    for i in range(2):
        assert pictures.nth(i).evaluate("img => img.complete && img.naturalWidth") == 720
    shoot(page, "summary-artifact")

    placement = next(a for a in get_json(f"{stack.api}/artifacts/filter",
                                         {"artifacts": {"key": {"any_": ["placement-churn"]}}})
                     if a["flow_run_id"] == run_id)
    page.goto(f"{stack.ui}/artifacts/artifact/{placement['id']}")
    expect(page.get_by_text("Every candidate").first).to_be_visible()
    expect(page.get_by_text("the job is pinned to cloud-eu").first).to_be_visible()

    # MLflow's model page: the first version of the model is the champion (its alias tag, not a tag value).
    page.goto(f"{stack.mlflow}/#/models/{MODEL}")
    expect(page.locator("body")).to_contain_text(re.compile(r"@\s*champion"))
    shoot(page, "model-page")
