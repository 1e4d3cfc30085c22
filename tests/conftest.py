"""Shared fixtures. Real data comes from the data directory ($TIBNLP_DATA); tests that need a
dataset skip with the reason when it is absent (e.g. on a user's machine without the data)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("MLFLOW_TRACKING_URI", "")  # never reach a user's server from tests
# tables and messages are checked as text: a developer's FORCE_COLOR (or rich's TTY_*) made
# rich draw them as for a terminal, 80 columns wide and with colour codes between the digits
for _name in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
    os.environ.pop(_name, None)


def _require_data(relative: str) -> Path:
    from tibnlp.data.datadir import data_dir

    path = data_dir() / relative
    if not path.exists():
        pytest.skip(
            f"needs {relative} in the data directory ({path} is absent); "
            "run `tibnlp data link SOURCE_DIR` or set $TIBNLP_DATA"
        )
    return path


@pytest.fixture
def require_data():
    """`require_data("tncc/tncc_title_train.jsonl")` -> path, or skip with the reason."""
    return _require_data


@pytest.fixture
def built(monkeypatch) -> list:
    """(model, optimizer) of every optimizer `engine.build_optimizer` builds, in order."""
    from tibnlp.training import engine

    built: list = []
    real = engine.build_optimizer

    def spy(model, cfg, lr_by_prefix=None):
        built.append((model, real(model, cfg, lr_by_prefix)))
        return built[-1][1]

    monkeypatch.setattr(engine, "build_optimizer", spy)
    return built


@pytest.fixture
def corpus_dir() -> Path:
    return _require_data("corpora")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`gpu`-marked tests skip, saying why, where torch sees no CUDA device."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _signals_as_they_were():
    """A test that runs the CLI's `main()` in this process installs `tibnlp.stopping`'s
    handlers and wakeup fd: put pytest's back, so later tests (and their forked workers)
    see the defaults."""
    import signal

    from tibnlp import stopping

    saved = {sig: signal.getsignal(sig) for sig in (*stopping.SIGNALS, signal.SIGINT)}
    wakeup = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(wakeup)
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)
    signal.set_wakeup_fd(wakeup)
    stopping._received = None
    stopping._generation += 1  # (the watcher forgets a stop a test made)
    stopping._taken.clear()
