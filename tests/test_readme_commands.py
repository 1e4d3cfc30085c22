"""The README's stage commands, run as written, in order, on tiny synthetic data.

The block under "## The stages" is what a user copies first, so it is read from the README
itself: a renamed flag, a moved output folder or a command that no longer exists fails here.
The only changes are the placeholders a user fills in (`a.txt b.txt.xz`, `texts.jsonl`,
`SYSTEM`, `EXPERIMENT`: files and names this test makes) and settings appended at the end of
a line to keep the shapes tiny (a later `--set` wins over an earlier one, as for a user).
"""

from __future__ import annotations

import json
import lzma
import os
import random
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from ft_fixtures import make_data_dir
from tibetan_fixtures import sentence, syllable

README = Path(__file__).resolve().parents[1] / "README.md"

# appended to the lines that train: tiny shapes, a few steps, one epoch
TINY_PRETRAIN = [
    "model.embedding_size=16",
    "model.hidden_size=32",
    "model.num_layers=2",
    "model.ffn_size=64",
    "model.max_len=64",
    "model.heads.small=2",
    "model.heads.large=2",
    "pretrain.seq_len=48",
    "pretrain.batch_size=8",
    "pretrain.max_steps=4",
    "pretrain.eval_every=2",
    "pretrain.eval_batches=1",
    "pretrain.checkpoint_every=2",
    "engine.threads=1",
]
TINY_FINETUNE = ["finetune.epochs=1", "finetune.batch_size=8", "engine.threads=1"]
EXPERIMENT = "tibnlp-curve"  # the fine-tunings' experiment: what `runs plot -e` names


def stage_commands(readme: Path = README) -> list[str]:
    """The commands of the first bash block after "## The stages", continuation lines joined
    and comments dropped."""
    text = readme.read_text("utf-8")
    section = text.split("## The stages", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "README: no bash block under '## The stages'"
    joined = block.group(1).replace("\\\n", " ")
    commands = []
    for line in joined.splitlines():
        line = " ".join(line.split(" #", 1)[0].split())
        if line and not line.startswith("#"):
            commands.append(line)
    return commands


def _make_shared(root: Path) -> None:
    """`../shared` as the README means it: datasets under data/, raw text under corpora/."""
    data = make_data_dir(root / "data")
    tusa = data / "tusa"  # a two-class set in the generic layout, from the synthetic titles
    tusa.mkdir()
    (tusa / "labels.json").write_text(json.dumps({"labels": ["Politics", "Economics"]}))
    for split in ("train", "validation", "test"):
        rows = [
            json.loads(line)
            for line in (data / "tncc" / f"tncc_title_{split}.jsonl").read_text("utf-8").split("\n")
            if line
        ]
        kept = [r for r in rows if r["label_id"] < 2]
        (tusa / f"tusa_{split}.jsonl").write_text(
            "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in kept), "utf-8"
        )
    (root / "corpora").mkdir()
    (root / "corpora" / "README.txt").write_text("raw text would be here\n")


def _write_inputs(work: Path) -> None:
    """`a.txt`, `b.txt.xz` (raw Tibetan text) and `texts.jsonl` (texts to classify)."""
    rng = random.Random(0)
    words = ["་".join(syllable(rng) for _ in range(rng.choice([1, 2]))) for _ in range(300)]
    docs = ["\n".join(sentence(rng, words) for _ in range(6)) for _ in range(160)]
    (work / "a.txt").write_text("\n\n".join(docs[:80]) + "\n", "utf-8")
    (work / "b.txt.xz").write_bytes(lzma.compress(("\n\n".join(docs[80:]) + "\n").encode()))
    titles = ["རྒྱལ ཁབ སྲིད བློན", "དཔལ འབྱོར ཚོང དངུལ།", "སློབ་གྲྭ་དགེ་རྒན"]
    (work / "texts.jsonl").write_text(
        "".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in titles), "utf-8"
    )


def _prepare(command: str, work: Path) -> list[str]:
    """Placeholders filled in and the tiny settings appended; the command itself unchanged."""
    argv = shlex.split(command)
    assert argv[0] == "tibnlp", f"README stage command does not start with tibnlp: {command}"
    argv = argv[1:]
    if "SYSTEM" in command:
        systems = sorted(p.name for p in (work / "runs/finetune/tncc-title").iterdir())
        argv = [a.replace("SYSTEM", systems[0]) for a in argv]
    argv = [EXPERIMENT if a == "EXPERIMENT" else a for a in argv]
    extra: list[str] = []
    if argv[0] == "pretrain":
        extra = TINY_PRETRAIN
    elif argv[0] == "finetune" and argv[1] in ("tncc", "classify"):
        extra = TINY_FINETUNE + (["tracking.experiment=" + EXPERIMENT] if argv[1] == "tncc" else [])
    for setting in extra:
        argv += ["-s", setting]
    return argv


@pytest.mark.timeout(900)
def test_readme_stage_commands_run_as_written(tmp_path: Path) -> None:
    pytest.importorskip("transformers", reason="the README exports to transformers (tibnlp[hf])")
    commands = stage_commands()
    assert len(commands) >= 10, commands
    _make_shared(tmp_path / "shared")
    work = tmp_path / "work"
    work.mkdir()
    _write_inputs(work)
    env = {
        **os.environ,
        "TIBNLP_DATA": str(tmp_path / "datadir"),
        "MLFLOW_TRACKING_URI": "",  # the README's default: ./mlflow.db
        "PYTHONUNBUFFERED": "1",
    }
    for command in commands:
        argv = _prepare(command, work)
        done = subprocess.run(
            [sys.executable, "-m", "tibnlp.cli.main", *argv],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, (
            f"README command failed: {command}\nran: {shlex.join(argv)}\n"
            f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"
        )
    # what the commands said they would make
    assert (tmp_path / "datadir" / "tncc").is_symlink()
    assert (work / "work/corpus").is_dir() and (work / "work/vocab").is_dir()
    assert (work / "work/pretrain/model/model.safetensors").is_file()
    assert len(list((work / "runs/finetune/tncc-title").glob("*/seed-[123]"))) == 6  # + twin
    assert list((work / "runs/finetune").glob("tusa/*/seed-1"))
    predictions = [json.loads(x) for x in (work / "out.jsonl").read_text("utf-8").splitlines()]
    assert len(predictions) == 3 and all(p.get("prediction") for p in predictions)
    assert (work / "work/hf/config.json").is_file()
    assert (work / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_stage_commands_are_read_from_the_readme(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(
        "# x\n## The stages\ntext\n```bash\ntibnlp a --x 1   # says a\n"
        "tibnlp b -s k=v \\\n  -s j=w    # continued\n# only a comment\n```\n"
        "```bash\ntibnlp not-this\n```\n"
    )
    assert stage_commands(readme) == ["tibnlp a --x 1", "tibnlp b -s k=v -s j=w"]
