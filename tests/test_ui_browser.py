"""`tibnlp ui` as a user sees it, in headless Chromium: a finished pipeline's experiment opens
on its runs (not MLflow 3's GenAI overview), says what it is, lists the pipeline run with its
nested stage runs, and a run's metrics, metric chart and confusion-matrix image load.
Screenshots are kept under $TIBNLP_TEST_ARTIFACTS (default .test-artifacts/) as the test's
record. Skipped, with the reason, where Chromium or playwright is absent."""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.test_tracking_ui import _start_ui
from tibnlp.pipeline.runner import run_pipeline
from tibnlp.pipeline.spec import load_pipeline
from tibnlp.tracking.server import free_port
from tibnlp.tracking.testing import sqlite_store

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _why_not() -> str:
    if CHROMIUM is None:
        return "Chromium absent: apt-get install chromium"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright absent: pip install -e '.[dev]'"
    return ""


pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(_why_not()), reason=_why_not())]
WAIT_MS = 90_000  # the UI's first load on a loaded 2-core CI machine


def _artifacts() -> Path:
    out = Path(os.environ.get("TIBNLP_TEST_ARTIFACTS", ROOT / ".test-artifacts")) / "ui"
    out.mkdir(parents=True, exist_ok=True)
    return out


@pytest.fixture
def finished_pipeline(
    corpus_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[str, str]:
    """The smoke pipeline on a tiny slice, logged to a local store: (store URI, experiment)."""
    monkeypatch.chdir(tmp_path)  # the store's artifacts (./mlruns) stay in the test's folder
    store = sqlite_store(tmp_path)
    overrides = ["vars.docs=150", "vars.steps=6", "engine.threads=1"]
    spec = load_pipeline(ROOT / "pipelines" / "smoke.yaml", overrides)
    said: list[str] = []
    run_pipeline(spec, tracking_uri=store, echo=said.append, workdir=tmp_path / "work")
    assert "test macro-F1" in "\n".join(said)  # it ends with its result table
    return store, spec.experiment


@pytest.fixture
def browser() -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield b
        finally:
            b.close()


def test_ui_shows_a_finished_pipeline(
    finished_pipeline: tuple[str, str], browser: object, tmp_path: Path
) -> None:
    store, experiment = finished_pipeline
    client = MlflowClient(store)
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None
    runs = {r.info.run_name: r for r in client.search_runs([exp.experiment_id])}
    seed_id, pretrain_id = runs["seed 1"].info.run_id, runs["pretrain"].info.run_id
    shots = _artifacts()
    port = free_port()
    proc, url = _start_ui(store, port, tmp_path / "ui.log")
    try:
        page = browser.new_page(viewport={"width": 1400, "height": 900})  # type: ignore[attr-defined]
        base = f"{url}/#/experiments/{exp.experiment_id}"

        # the experiment: its description and the pipeline run, expanded to its stage runs
        page.goto(f"{base}/runs")
        page.get_by_text("Training runs").first.wait_for(timeout=WAIT_MS)  # not GenAI's page
        page.get_by_text("tibnlp pipeline smoke").first.wait_for(timeout=WAIT_MS)
        client_note = runs["smoke"].data.tags["mlflow.note.content"]
        assert "test macro-F1" in client_note  # the pipeline run's description: its table
        page.get_by_role("link", name="smoke", exact=True).wait_for(timeout=WAIT_MS)
        page.locator("button[data-component-id*='runnamecellrenderer']").first.click()
        for stage in ("slice", "prepare", "vocab", "pretrain", "finetune"):
            page.get_by_role("link", name=stage, exact=True).wait_for(timeout=WAIT_MS)
        page.screenshot(path=str(shots / "experiment.png"))

        # a seed run: its scores are listed
        page.goto(f"{base}/runs/{seed_id}")
        page.get_by_text("test_macro_f1", exact=True).first.wait_for(timeout=WAIT_MS)
        page.screenshot(path=str(shots / "run.png"))

        # pretraining's metric charts: the held-out loss curve is drawn
        page.goto(f"{base}/runs/{pretrain_id}/model-metrics")
        page.get_by_text("pretrain (eval/loss)").first.wait_for(timeout=WAIT_MS)
        page.locator("canvas, svg.main-svg").first.wait_for(timeout=WAIT_MS)
        page.screenshot(path=str(shots / "metrics.png"))

        # the confusion matrix image loads (decoded, not a broken image)
        page.goto(f"{base}/runs/{seed_id}/artifacts/confusion/confusion_test.png")
        image = page.locator("img[src*='confusion_test.png'], img[src^='blob:']").first
        image.wait_for(timeout=WAIT_MS)
        decoded = "img => img.complete && img.naturalWidth > 100"
        page.wait_for_function(decoded, arg=image.element_handle())
        page.screenshot(path=str(shots / "confusion.png"))
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
