"""Two runs, one folder: the second refuses (naming the folder and the holder) or waits; a lock
left by a killed process never blocks. Holders are real processes."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tibnlp.folder_lock import LOCK_NAME, FolderBusy, hold_folder

HOLDER = """
import sys
from tibnlp.folder_lock import hold_folder
with hold_folder(sys.argv[1]):
    print("held", flush=True)
    sys.stdin.readline()
"""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path.cwd()), *sys.path])}


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """A process holding `tmp_path/work` until it reads a line (or is killed)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path / "work")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def test_second_process_refuses_naming_folder_and_holder(
    holder: subprocess.Popen[str], tmp_path: Path
) -> None:
    work = tmp_path / "work"
    with pytest.raises(FolderBusy) as err, hold_folder(work):
        pytest.fail("entered a held folder")
    assert str(work) in err.value.message
    assert f"process {holder.pid} on host {socket.gethostname()}" in err.value.message
    assert "--wait" in (err.value.hint or "")
    assert holder.poll() is None  # refusing did not disturb the holder
    assert json.loads((work / LOCK_NAME).read_text())["pid"] == holder.pid


def test_wait_starts_when_the_holder_is_done(holder: subprocess.Popen[str], tmp_path: Path) -> None:
    told: list[str] = []

    def release(line: str) -> None:  # called once we wait: now let the holder finish
        told.append(line)
        assert holder.stdin is not None
        holder.stdin.write("done\n")
        holder.stdin.flush()

    with hold_folder(tmp_path / "work", wait=True, poll_s=0.05, notify=release) as lock:
        assert json.loads(lock.read_text())["pid"] == os.getpid()
        assert holder.wait() == 0
    assert len(told) == 1 and f"process {holder.pid}" in told[0]
    assert not lock.exists()  # released with the block


@pytest.mark.parametrize("reaped", [True, False])
def test_lock_of_a_killed_process_does_not_block(
    holder: subprocess.Popen[str], tmp_path: Path, reaped: bool
) -> None:
    """SIGKILL leaves the lock file behind; the next process takes the folder (an unreaped
    killed process is a zombie: gone too)."""
    lock = tmp_path / "work" / LOCK_NAME
    os.kill(holder.pid, signal.SIGKILL)
    if reaped:
        holder.wait()
    else:  # until it has died, leaving it unreaped (a zombie)
        os.waitid(os.P_PID, holder.pid, os.WEXITED | os.WNOWAIT)
    assert lock.exists()
    with hold_folder(tmp_path / "work") as taken:
        assert json.loads(taken.read_text())["pid"] == os.getpid()
    assert not lock.exists()
    assert not [p.name for p in lock.parent.iterdir() if p.name != LOCK_NAME]  # nothing left


def _plant(folder: Path, **holder: object) -> Path:
    folder.mkdir(parents=True)
    lock = folder / LOCK_NAME
    lock.write_text(json.dumps({"since": 0, "command": "tibnlp pretrain", **holder}))
    return lock


def test_reused_pid_is_stale_and_other_hosts_are_not_guessed(tmp_path: Path) -> None:
    # this process runs, but started at another time than the lock's holder: a reused pid
    _plant(tmp_path / "reused", pid=os.getpid(), host=socket.gethostname(), start=1)
    if Path("/proc/self/stat").exists():
        with hold_folder(tmp_path / "reused"):
            pass
    lock = _plant(tmp_path / "remote", pid=os.getpid(), host="node-elsewhere", start=1)
    with pytest.raises(FolderBusy) as err, hold_folder(tmp_path / "remote"):
        pass
    assert "on host node-elsewhere" in err.value.message
    assert str(lock) in (err.value.hint or "")  # what to delete once that process is gone


def test_a_run_stopped_before_writing_leaves_no_folder_behind(tmp_path: Path) -> None:
    """Nothing half-written: a run refused inside the lock (a config error) leaves no empty
    OUTPUT, nor the parents the lock made for it; a folder that was there before, or one the
    run wrote into, stays."""
    made = tmp_path / "runs" / "pretrain"
    with pytest.raises(RuntimeError), hold_folder(made):
        raise RuntimeError("config error")
    assert not (tmp_path / "runs").exists()

    there = tmp_path / "there"
    there.mkdir()
    with pytest.raises(RuntimeError), hold_folder(there):
        raise RuntimeError("config error")
    assert there.is_dir()

    written = tmp_path / "written"
    with pytest.raises(RuntimeError), hold_folder(written):
        (written / "config.yaml").write_text("x")
        raise RuntimeError("failed later")
    assert sorted(p.name for p in written.iterdir()) == ["config.yaml"]


RUN_PIPELINE = """
import os, sys, time
from pathlib import Path
from tibnlp.pipeline.registry import register_stage

def gated(ctx):
    \"\"\"Records its call, then waits for the test's gate file before writing its output.\"\"\"
    root = Path(os.environ["GATE_DIR"])
    (root / f"call-{ctx.name}-{os.getpid()}").touch()
    while not (root / "open").exists():
        time.sleep(0.02)
    out = ctx.output / "out.txt"
    for i in range(50):  # written in pieces: a second writer would interleave
        with out.open("a") as fh:
            fh.write(f"{os.getpid()} {i}\\n")
    return out

register_stage("t_gated", gated, ())
from tibnlp.cli.main import main
sys.argv = ["tibnlp", "pipeline", "run", *sys.argv[1:]]
main()
"""

TWO_STAGES = """
name: twice
experiment: twice
workdir: {work}
config: {{tracking: {{enabled: false}}}}
stages:
  one: {{kind: t_gated, inputs: ["data:corpora/toy.txt"]}}
  two: {{kind: t_gated, inputs: ["${{stages.one.output}}"]}}
"""


@pytest.mark.slow
def test_two_pipeline_runs_leave_one_consistent_cache(
    tmp_path: Path,
) -> None:
    """Run A holds the work dir inside its first stage; run B refuses at once naming A; run C
    (--wait) waits, then finds A's outputs cached. One call per stage, one published output
    each, nothing partial."""
    import time

    (tmp_path / "data" / "corpora").mkdir(parents=True)
    (tmp_path / "data" / "corpora" / "toy.txt").write_text("ཀ་ཁ།\n", encoding="utf-8")
    gate = tmp_path / "gate"
    gate.mkdir()
    work = tmp_path / "work"
    spec = tmp_path / "twice.yaml"
    spec.write_text(TWO_STAGES.format(work=work), encoding="utf-8")
    script = tmp_path / "run_pipeline.py"
    script.write_text(RUN_PIPELINE, encoding="utf-8")
    env = {**_env(), "GATE_DIR": str(gate), "TIBNLP_DATA": str(tmp_path / "data")}

    def start(*args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, str(script), str(spec), *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    procs: list[subprocess.Popen[str]] = []
    try:
        a = start()
        procs.append(a)
        deadline = time.monotonic() + 300
        while not list(gate.glob("call-one-*")):
            assert a.poll() is None, a.stdout.read() if a.stdout else ""
            assert time.monotonic() < deadline, "run A never reached its first stage"
            time.sleep(0.05)

        b = start()
        procs.append(b)
        said = " ".join(b.communicate(timeout=300)[0].split())  # as one line, unwrapped
        assert b.returncode == FolderBusy.exit_code, said
        assert str(work) in said and f"process {a.pid}" in said, said

        c = start("--wait")
        procs.append(c)
        assert c.stdout is not None
        line = c.stdout.readline()
        while line and "waiting for" not in line:
            line = c.stdout.readline()
        assert f"process {a.pid}" in line, line
        (gate / "open").touch()
        assert a.wait(timeout=300) == 0, a.stdout.read() if a.stdout else ""
        rest = c.communicate(timeout=300)[0]
        assert c.returncode == 0 and "everything is cached" in rest, rest
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()

    assert sorted(p.name for p in gate.glob("call-*")) == [
        f"call-one-{a.pid}",
        f"call-two-{a.pid}",
    ]
    for stage in ("one", "two"):
        entries = sorted(p.name for p in (work / stage).iterdir())
        assert len(entries) == 2 and entries[0].startswith(".last-"), entries
        published = work / stage / entries[1]
        assert not entries[1].endswith(".partial")
        manifest = json.loads((published / ".tibnlp-stage.json").read_text())
        assert entries[1].endswith(manifest["key"][:12])
        lines = (published / "out.txt").read_text().splitlines()
        assert lines == [f"{a.pid} {i}" for i in range(50)]
    assert not (work / LOCK_NAME).exists()
