"""The docker files parse and every `tibnlp ...` command they run exists in the CLI.

There is no docker engine here, so this is what keeps them from rotting: a renamed command or
option fails this test instead of a GPU node's start."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import typer.main
import yaml

from tibnlp.cli.main import app

DOCKER = Path(__file__).resolve().parents[1] / "docker"


def _check_cli(argv: list[str]) -> None:
    """Walk the click tree along argv; every option must exist on the command reached."""
    command: Any = typer.main.get_command(app)  # typer vendors click: test groups by shape
    path = ["tibnlp"]
    rest = list(argv)
    while hasattr(command, "commands") and rest and not rest[0].startswith("-"):
        name = rest.pop(0)
        assert name in command.commands, f"{' '.join(path)} has no subcommand {name!r}"
        command = command.commands[name]
        path.append(name)
    if hasattr(command, "commands"):
        assert rest in (["--help"], []), f"{' '.join(path)} needs a subcommand, got {rest}"
        return
    options = {o for p in command.params for o in (*p.opts, *p.secondary_opts)} | {"--help"}
    for token in rest:
        if token.startswith("--"):
            assert token.split("=")[0] in options, f"{' '.join(path)} has no option {token}"


def _dockerfile() -> list[str]:
    text = (DOCKER / "Dockerfile").read_text(encoding="utf-8")
    return [ln for ln in text.replace("\\\n", " ").splitlines() if ln and not ln.startswith("#")]


def test_dockerfile_builds_a_cuda_image_with_deepspeed_and_tibnlp() -> None:
    lines = _dockerfile()
    args = {
        ln.split()[1].split("=")[0]: ln.split("=", 1)[1] for ln in lines if ln.startswith("ARG ")
    }
    assert "nvidia/cuda" in args["CUDA_IMAGE"] and "devel" in args["CUDA_IMAGE"]
    assert any(ln.startswith("FROM ${CUDA_IMAGE}") for ln in lines)
    runs = " ".join(ln for ln in lines if ln.startswith("RUN "))
    assert "download.pytorch.org/whl/cu" in args["TORCH_INDEX"] and "torch==" in runs
    assert "deepspeed" in runs and 'pip install -e ".[postgres]"' in runs
    entry = next(ln for ln in lines if ln.startswith("ENTRYPOINT"))
    assert json.loads(entry.split(None, 1)[1]) == ["tibnlp"]
    cmd = json.loads(next(ln for ln in lines if ln.startswith("CMD")).split(None, 1)[1])
    _check_cli(cmd)
    for match in re.finditer(r"(?:^|&&\s*|;\s*)tibnlp\s+([^&;|>]*)", runs):
        _check_cli(shlex.split(match.group(1)))


def test_compose_services_and_trainer_command() -> None:
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text(encoding="utf-8"))
    services = compose["services"]
    assert set(services) == {"postgres", "mlflow", "trainer"}
    assert services["postgres"]["image"].startswith("postgres:")
    mlflow = services["mlflow"]
    command = mlflow["command"]
    assert command[0] == "server"
    store = command[command.index("--backend-store-uri") + 1]
    assert store.startswith("postgresql+psycopg2://") and "@postgres:5432/" in store
    artifacts = command[command.index("--artifacts-destination") + 1]
    assert any(v.endswith(":" + artifacts) for v in mlflow["volumes"])
    assert all(p.startswith("127.0.0.1:") for p in mlflow["ports"])  # loopback unless changed
    trainer = services["trainer"]
    assert trainer["build"]["dockerfile"] == "docker/Dockerfile"
    assert trainer["environment"]["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
    assert trainer["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    assert trainer.get("entrypoint") is None  # the image's ENTRYPOINT is tibnlp
    _check_cli(trainer["command"])
    pipeline = trainer["command"][trainer["command"].index("run") + 1]
    assert (DOCKER.parent / pipeline).is_file()
    for name in compose["volumes"]:
        assert any(name in str(v) for s in services.values() for v in s.get("volumes", []))


def test_cli_check_catches_unknown_commands() -> None:
    import pytest

    with pytest.raises(AssertionError, match="no subcommand"):
        _check_cli(["pipeline", "walk"])
    with pytest.raises(AssertionError, match="no option"):
        _check_cli(["runs", "compare", "--experimentt", "x"])


def test_dockerfile_torch_matches_the_readme_pin_and_the_cuda_image() -> None:
    """The image builds the torch the README pins (its CUDA build), and the wheel index's CUDA
    is the base image's: DeepSpeed JIT-compiles its ops with the image's nvcc, and refuses a
    CUDA major that differs from torch's."""
    readme = (DOCKER.parent / "README.md").read_text(encoding="utf-8")
    pins = set(re.findall(r"torch==(\d+\.\d+\.\d+)", readme))
    assert len(pins) == 1, pins
    args = {
        ln.split()[1].split("=")[0]: ln.split("=", 1)[1]
        for ln in _dockerfile()
        if ln.startswith("ARG ")
    }
    assert args["TORCH_VERSION"] == pins.pop()
    cuda = re.search(r"nvidia/cuda:(\d+)\.(\d+)\.\d+-", args["CUDA_IMAGE"])
    index = re.search(r"/whl/cu(\d+)$", args["TORCH_INDEX"])
    assert cuda and index
    assert index.group(1) == cuda.group(1) + cuda.group(2)
