"""pyproject's torch floor is no lower than the newest torch API that tibnlp calls.

Each entry: the API, the first torch release that has it (read from the released wheels), and a
source file that calls it, so that the table goes stale loudly when a call moves or goes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

NEWEST_TORCH_APIS = {
    # cpu_has_bf16 (engine.precision=bf16 on a CPU); absent from 2.10.0, present in 2.11.0
    "torch.cpu.get_capabilities": ((2, 11), "tibnlp/training/engine.py"),
    # the DeepSpeed checkpoint loader's allowlist (context manager; add_safe_globals is 2.4)
    "torch.serialization.safe_globals": ((2, 5), "tibnlp/training/engine.py"),
}


def _torch_floor() -> tuple[int, ...]:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    match = re.search(r'"torch>=(\d+(?:\.\d+)*)"', text)
    assert match, "pyproject.toml has no torch>= requirement"
    return tuple(int(p) for p in match.group(1).split("."))


def test_torch_floor_covers_the_newest_api_used() -> None:
    for api, (since, source) in NEWEST_TORCH_APIS.items():
        assert api in (ROOT / source).read_text(encoding="utf-8"), f"{source} no longer calls {api}"
        assert _torch_floor() >= since, f"{api} needs torch>={'.'.join(map(str, since))}"


def test_every_package_folder_is_in_the_wheel() -> None:
    """pyproject lists the packages by hand: tibnlp.models.long_documents was missing, so a
    plain (non-editable) install failed on import while `pip install -e` hid it."""
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in Python 3.11+")
    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["tool"]["setuptools"][
            "packages"
        ]
    )
    found = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for init in (ROOT / "tibnlp").rglob("__init__.py")
    }
    assert found - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
    assert listed - found == {"tibnlp.manifests"}  # the corpora/ manifests, mapped by package-dir
