"""UI-tier fixtures: the served stack with a deployed workspace, and Chromium driven by Playwright."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.workspaces import ROOT, build_workspace, spec_writer
from tests.ui.served_stack import CHROMIUM, CHROMIUM_ARGS, ServedStack, chromium_missing

#: Where screenshots go: failures always (to the test's tmp dir), the README's when this is set.
SCREENSHOTS_ENV = "HYBRIDTRAIN_SCREENSHOTS"
VIEWPORT = {"width": 1440, "height": 900}


def require_browser() -> None:
    """Skip where Chromium cannot run; under CI (``CI=true``) fail instead, with the install command."""
    why = chromium_missing()
    if why is None:
        return
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(why, pytrace=False)
    pytest.skip(why)


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[ServedStack]:
    """Prefect and MLflow servers, the workspace deployed with ``hybridtrain deploy``, an on-prem worker.

    The job is small (3,000 rows, 2 epochs) so the lifecycle finishes in about a minute.
    """
    require_browser()
    base = tmp_path_factory.mktemp("ui")
    root = build_workspace(base / "ws", rows=3000)
    for pkg in ("flows", "tasks", "blocks", "workers"):
        (root / pkg).symlink_to(ROOT / pkg, target_is_directory=True)
    # Small and quick; thresholds a 2-epoch model on 3,000 rows meets (the demo spec asks accuracy 0.75).
    spec_writer(root)("ui", model__epochs=2, evaluation__thresholds={"auc": 0.7})
    served = ServedStack(base=base, workspace=root)
    try:
        served.start_servers()
        served.deploy()
        served.start_worker("onprem")
        yield served
    except BaseException:
        print(served.logs())
        raise
    finally:
        served.stop()


@pytest.fixture
def page(request, tmp_path: Path):
    """A Chromium page at 1440×900; on failure its screenshot is saved and its path printed."""
    require_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        context = browser.new_context(viewport=VIEWPORT)
        page = context.new_page()
        page.set_default_timeout(60_000)  # a loaded 2-core machine renders the UI slowly
        from playwright.sync_api import expect

        expect.set_options(timeout=60_000)
        try:
            yield page
        finally:
            report = getattr(request.node, "rep_call", None)
            if report is not None and report.failed:
                shot = tmp_path / "failure.png"
                page.screenshot(path=str(shot), full_page=True)
                print(f"screenshot of the page at the failure: {shot} ({page.url})")
            context.close()
            browser.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.rep_call = report


def screenshot_dir() -> Path | None:
    """``docs/screenshots`` when ``HYBRIDTRAIN_SCREENSHOTS=1`` asks for the README's pictures, else None."""
    return ROOT / "docs" / "screenshots" if os.environ.get(SCREENSHOTS_ENV) == "1" else None
