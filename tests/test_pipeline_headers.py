"""Every shipped pipeline file plans, and the commands its header comment tells users to run
are today's: each `tibnlp pipeline run` line plans in dry-run with its `--set`s and `--until`s
(a model folder it names by a placeholder is stood in for), and every other `tibnlp` line
names a command and options that exist."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner

from tibnlp.cli.main import app

REPO = Path(__file__).resolve().parents[1]
PIPELINES = sorted((REPO / "pipelines").glob("*.yaml"))
# the placeholders the headers write for a model folder a user brings
PLACEHOLDER = re.compile(r"^(?:path/to/.*|.*out-XXXX.*|[A-Z][A-Z_]*)$")


def header_commands(path: Path) -> list[list[str]]:
    """The `tibnlp ...` lines of the file's leading comment, continuations joined, as argv
    (without the `tibnlp`); a quoted value may run on over comment lines."""
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        lines.append(line[1:].strip())
    commands, pending = [], ""
    for line in lines:
        if pending:
            line = f"{pending} {line}"
        elif not line.startswith("tibnlp "):
            continue
        if line.endswith("\\"):
            pending = line[:-1].rstrip()
            continue
        try:
            argv = shlex.split(line, comments=True)
        except ValueError:  # a quote still open: the value goes on on the next line
            pending = line
            continue
        pending = ""
        commands.append(argv[1:])
    assert not pending, f"{path.name}: an unfinished command in the header: {pending}"
    return commands


def check_options(argv: list[str]) -> None:
    """The subcommand path exists and every option on it is one of the command's."""
    command: Any = typer.main.get_command(app)
    rest = list(argv)
    while hasattr(command, "commands") and rest and not rest[0].startswith("-"):
        assert rest[0] in command.commands, f"no command {rest[0]!r} in {argv}"
        command = command.commands[rest.pop(0)]
    options = {o for p in command.params for o in (*p.opts, *p.secondary_opts)} | {"--help"}
    for token in rest:
        if token.startswith("-") and len(token) > 1:
            assert token.split("=")[0] in options, f"no option {token} in {argv}"


def test_every_pipeline_file_has_usage_lines() -> None:
    assert len(PIPELINES) >= 10
    for path in PIPELINES:
        runs = [c for c in header_commands(path) if c[:2] == ["pipeline", "run"]]
        assert runs, f"{path.name}: no `tibnlp pipeline run` line in its header"


@pytest.mark.parametrize("path", PIPELINES, ids=lambda p: p.stem)
def test_header_commands_are_valid(path: Path, corpus_dir: Path, tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.yaml").write_text("{}\n", "utf-8")
    (model / "model.safetensors").write_bytes(b"weights")
    for n, argv in enumerate(header_commands(path)):
        check_options(argv)
        if argv[:2] != ["pipeline", "run"]:
            continue
        assert (REPO / argv[2]).is_file(), f"{path.name}: no file {argv[2]}"
        args = []
        for token in argv:
            key, _, value = token.partition("=")
            if key.startswith("vars.") and PLACEHOLDER.match(value):
                token = f"{key}={model}"
            args.append(token)
        if "--workdir" in args:  # a header's own work dir: planned under tmp_path instead
            i = args.index("--workdir")
            del args[i : i + 2]
        args[2] = str(REPO / args[2])
        dry = [*args, "--dry-run", "--workdir", str(tmp_path / f"work{n}")]
        result = CliRunner().invoke(app, dry)
        why = f"{result.output}{result.exception!r}"
        assert result.exit_code == 0, f"{path.name}: tibnlp {shlex.join(argv)}\n{why}"
