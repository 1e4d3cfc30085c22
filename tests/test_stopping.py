"""Stopping as users stop commands: SIGTERM and SIGHUP take Ctrl-C's clean-up (runs end KILLED,
exit 128 + the signal), and no launched process outlives the pipeline that started it, however
the pipeline ended (tibnlp.stopping, tibnlp.pipeline.launch)."""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from subprocess import Popen

import pytest
from mlflow.tracking import MlflowClient

from tibnlp import stopping
from tibnlp.tracking.testing import sqlite_store

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent


@pytest.fixture
def handlers() -> Iterator[None]:
    """(conftest puts the handlers back after every test)"""
    yield


def test_sigterm_raises_a_keyboard_interrupt_once(handlers: None) -> None:
    for sig in stopping.SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    stopping.stop_on_signals()
    with pytest.raises(KeyboardInterrupt) as stop:  # every `except KeyboardInterrupt` sees it
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)  # (delivered between bytecodes)
    assert isinstance(stop.value, stopping.Stopped) and stop.value.signum == signal.SIGTERM
    assert str(stop.value) == "SIGTERM"
    assert pickle.loads(pickle.dumps(stop.value)).signum == signal.SIGTERM  # (a pool ships it)
    assert stopping.exit_status(stop.value) == 143 and stopping.stopped_by_signal() == 15
    assert stopping.exit_status(KeyboardInterrupt()) == 143  # (what this process received)
    stopping._received = None
    assert stopping.exit_status(KeyboardInterrupt()) == 130  # Ctrl-C


def test_a_signal_started_ignored_stays_ignored(handlers: None) -> None:
    """`nohup CMD` keeps CMD past logout by ignoring SIGHUP: that choice stands."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    stopping.stop_on_signals()
    assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL


# a process that stops on signals, then does WHAT (argv[1]); its clean-up writes argv[2]
STOPPING = """
import hashlib, multiprocessing, signal, sys, time
from pathlib import Path
from tibnlp import stopping
stopping.stop_on_signals()
what, done = sys.argv[1], Path(sys.argv[2])
if what == "other-handler":  # another's handler, with a graceful shutdown of its own
    def graceful(signum, frame):
        time.sleep(stopping.TAKE_S + 2)
        done.write_text("cleaned up")
        sys.exit(0)
    signal.signal(signal.SIGTERM, graceful)
for round in range(2 if what == "twice" else 1):
    try:
        print("ready", flush=True)
        if what == "c-call":  # one long call in C: no Python handler runs until it returns
            hashlib.pbkdf2_hmac("sha256", b"x", b"y", 2**31 - 1)
        elif what == "c-call-logged":  # the same with fd 2 piped, as SentencePiece's log is
            from tibnlp.text.spm_log import c_stderr
            with c_stderr(lambda line: line):
                hashlib.pbkdf2_hmac("sha256", b"x", b"y", 2**31 - 1)
        elif what == "c-call-staged":  # the same while a folder and a file are written
            from tibnlp import fsutil
            with fsutil.staged_dir(done.parent / "out") as d, fsutil.atomic_file(done) as f:
                (d / "part").write_text("x")
                f.write_text("x")
                hashlib.pbkdf2_hmac("sha256", b"x", b"y", 2**31 - 1)
        elif what == "pools":  # pools whose idle workers are SIGTERMed at the end of `with`
            for _ in range(8):
                with multiprocessing.get_context("fork").Pool(2) as pool:
                    pool.map(abs, range(4))
            print("pools done", flush=True)
        else:
            time.sleep(120)
    except KeyboardInterrupt as stop:
        if what == "hanging-clean-up":
            time.sleep(120)
        if what == "busy-clean-up":  # one C call holding the GIL for seconds, checking no
            time.sleep(0.05)  # signals: the watcher runs again only after it
            sum(range(10**8))
        time.sleep(1.5)  # a clean-up that takes a moment
        done.write_text("cleaned up")
        if what == "twice" and round == 0:
            stopping.stop_on_signals()  # as a second command in this process would
            continue
        sys.exit(stopping.exit_status(stop))
"""


@pytest.fixture
def stopping_child(tmp_path: Path) -> Iterator[Callable[[str], subprocess.Popen[str]]]:
    """Start the STOPPING process doing WHAT; killed after the test, whatever happened."""
    started: list[subprocess.Popen[str]] = []

    def start(what: str) -> subprocess.Popen[str]:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = subprocess.Popen(
            [sys.executable, "-c", STOPPING, what, str(tmp_path / "done")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,  # (its group: a straggler it forked is ended with it)
        )
        started.append(proc)
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        return proc

    yield start
    for proc in started:
        _end_group(proc)
        proc.communicate(timeout=30)


def _end_group(proc: subprocess.Popen[str]) -> None:
    """SIGKILL to the child's process group: a process it forked that outlives it holds the
    output pipes open, and reading them to the end would wait for good."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.parametrize("what", ["c-call", "c-call-logged", "c-call-staged"])
def test_a_stop_during_a_long_c_call_exits_within_the_take_time(
    tmp_path: Path, stopping_child: Callable[[str], subprocess.Popen[str]], what: str
) -> None:
    """SentencePiece training or a collective cannot run Python's handler: the process exits
    as SIGTERM would have (it ignored the signal until the call returned), and says so on
    the user's stderr also while fd 2 is piped into SentencePiece's log reader (the line went
    into the pipe, whose reader dies with the process: an exit without a word). What it was
    writing is not left half-written: its temporaries beside the outputs are removed."""
    proc = stopping_child(what)
    time.sleep(0.5)
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143 and "not taken within" in err, err
    assert time.monotonic() - started < stopping.TAKE_S + 10
    assert not list(tmp_path.iterdir())  # no "done", no staged temporaries


def test_sigterm_then_sighup_at_once_is_one_stop(
    tmp_path: Path, stopping_child: Callable[[str], subprocess.Popen[str]]
) -> None:
    """systemd sends both together: the clean-up runs to its end (it was cut short)."""
    proc = stopping_child("sleep")
    proc.send_signal(signal.SIGTERM)
    proc.send_signal(signal.SIGHUP)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode in (129, 143), err  # (pending signals are taken lowest first)
    assert (tmp_path / "done").read_text() == "cleaned up"


def test_a_stop_signal_sent_again_ends_a_hanging_clean_up(
    stopping_child: Callable[[str], subprocess.Popen[str]],
) -> None:
    proc = stopping_child("hanging-clean-up")
    proc.send_signal(signal.SIGTERM)
    time.sleep(stopping.REPEAT_S + 1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 143 and "sent again" in err, err


def test_forked_pool_workers_end_quietly(
    stopping_child: Callable[[str], subprocess.Popen[str]],
) -> None:
    """A pool's idle workers are SIGTERMed when it closes: inheriting the handler, they
    printed a `Stopped` traceback now and then; a forked child gets the default back."""
    proc = stopping_child("pools")
    # CPython's Pool may fork a replacement worker as it terminates (its worker-handler
    # thread racing `terminate`), which then waits on a lock held at the fork, unknown to the
    # pool: the command has ended, the straggler is ended with its group (seen once in about
    # ten runs on a loaded 2-core machine)
    proc.wait(timeout=120)
    _end_group(proc)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "pools done" in out, err
    assert "Stopped" not in err and "Traceback" not in err, err


def test_a_ctrl_c_held_while_workers_start_comes_as_the_block_ends(handlers: None) -> None:
    """`ctrl_c_held` keeps a Ctrl-C from a pool's start-up (its forks), not from the command:
    the block runs on, then the handler the Ctrl-C was meant for takes it, and a child forked
    in the block lives through a Ctrl-C of its own."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    reached = False
    with pytest.raises(KeyboardInterrupt), stopping.ctrl_c_held():
        signal.raise_signal(signal.SIGINT)
        pid = os.fork()
        if pid == 0:  # (a worker before its first act)
            signal.raise_signal(signal.SIGINT)
            os._exit(7)
        reached = True
    assert reached and os.waitpid(pid, 0)[1] == 7 << 8
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_busy_clean_up_is_not_taken_for_a_repeat(
    tmp_path: Path, stopping_child: Callable[[str], subprocess.Popen[str]]
) -> None:
    """SIGHUP 0.5 s after SIGTERM is the same stop, even when the clean-up holds the GIL for
    seconds (the watcher read the second byte late, or timed its look at the empty pipe late,
    and took it for a repeat)."""
    proc = stopping_child("busy-clean-up")
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)  # (within REPEAT_S, past the watcher's first empty look)
    proc.send_signal(signal.SIGHUP)
    _, err = proc.communicate(timeout=120)
    assert (tmp_path / "done").read_text() == "cleaned up", err
    assert proc.returncode == 143, err


def test_another_handlers_shutdown_is_not_cut_at_the_take_time(
    tmp_path: Path, stopping_child: Callable[[str], subprocess.Popen[str]]
) -> None:
    """A handler installed after stop_on_signals (a plugin's, a library's) took the signal:
    its graceful shutdown, longer than TAKE_S, runs to its end."""
    proc = stopping_child("other-handler")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and (tmp_path / "done").read_text() == "cleaned up", err


def test_a_second_stop_after_the_handlers_are_set_again_is_a_stop_of_its_own(
    tmp_path: Path, stopping_child: Callable[[str], subprocess.Popen[str]]
) -> None:
    proc = stopping_child("twice")
    proc.send_signal(signal.SIGTERM)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"  # round two
    (tmp_path / "done").unlink()
    time.sleep(stopping.REPEAT_S + 1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143 and (tmp_path / "done").read_text() == "cleaned up", err


def test_a_rank_on_another_host_does_not_watch_the_pipelines_pid() -> None:
    from tibnlp.folder_lock import this_process
    from tibnlp.pipeline.launch import pipeline_to_watch

    here = this_process()
    assert pipeline_to_watch(here) == (here["pid"], here["start"])
    assert pipeline_to_watch({**here, "host": "another-node"}) is None
    assert pipeline_to_watch({**here, "pid_ns": here["pid_ns"] + 1}) is None
    assert pipeline_to_watch({}) is None


def test_a_worker_stops_when_the_pipeline_above_it_is_gone() -> None:
    """Its launcher may die before the worker notes it as its parent: the pipeline's pid,
    from the stage's context file, is watched too."""
    code = (
        "import sys, time; from tibnlp import stopping; "
        "stopping.stop_when_orphaned((int(sys.argv[1]), None), poll_s=0.1); time.sleep(60)"
    )
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid no process has now
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    worker = subprocess.Popen([sys.executable, "-c", code, str(gone.pid)], env=env)
    assert worker.wait(timeout=60) == -signal.SIGTERM


def _gone(pid: int, within: float = 30.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        if Path(f"/proc/{pid}/stat").is_file():
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            if state == "Z":
                return True
        time.sleep(0.1)
    return False


# a middle process starts a grandchild the way tibnlp does, prints its pid, then sleeps; the
# test SIGKILLs the middle one and watches the grandchild
MIDDLE = """
import subprocess, sys, time
from tibnlp import stopping
how = sys.argv[1]
grandchild = "import time\\n"
if how == "orphan":
    grandchild = "from tibnlp import stopping\\nstopping.stop_when_orphaned(poll_s=0.1)\\n"
    grandchild += "import time\\n"
grandchild += "time.sleep(120)"
pre = stopping.die_with_parent() if how == "pdeathsig" else None
child = subprocess.Popen([sys.executable, "-c", grandchild], preexec_fn=pre)
print(child.pid, flush=True)
time.sleep(120)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("how", ["pdeathsig", "orphan"])
def test_a_child_stops_when_its_starter_is_killed_outright(how: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    middle = subprocess.Popen(
        [sys.executable, "-c", MIDDLE, how], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert middle.stdout is not None
        grandchild = int(middle.stdout.readline())
        time.sleep(0.5)  # the grandchild armed (its watch started)
        middle.kill()
        middle.wait()
        assert _gone(grandchild), f"process {grandchild} outlived its SIGKILLed starter"
    finally:
        middle.kill()


def test_nothing_started_this_way_is_stopped_while_its_starter_lives() -> None:
    """The control: the same grandchild runs on while the middle process lives."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    middle = subprocess.Popen(
        [sys.executable, "-c", MIDDLE, "orphan"], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert middle.stdout is not None
        grandchild = int(middle.stdout.readline())
        assert not _gone(grandchild, within=1.5)
        os.kill(grandchild, signal.SIGKILL)
    finally:
        middle.kill()
        middle.wait()


PIPELINE = """
name: stopx
experiment: stopx
workdir: {workdir}
config:
  tracking: {{uri: "{uri}"}}
stages:
  s:
    kind: s_sleep
    inputs: ["data:corpora/toy.txt"]
    launch: {python} -m torch.distributed.run --nproc_per_node 2 --master_port {port} -m
"""

# the CLI's entry point with the test's stage kind registered (a plugin would do the same);
# the launched workers import stop_stage themselves to find the kind
CLI = (
    "import sys, stop_stage; from tibnlp.cli.main import main; "
    "sys.argv = ['tibnlp', 'pipeline', 'run', sys.argv[1]]; main()"
)


def _start(tmp_path: Path) -> tuple[subprocess.Popen[bytes], str, list[int]]:
    """The pipeline, started; its tracking store and its two workers' pids (once both run)."""
    from tibnlp.tracking.server import free_port

    data = tmp_path / "data" / "corpora"
    data.mkdir(parents=True)
    (data / "toy.txt").write_text("ཀ་ཁ།\n", encoding="utf-8")
    uri = sqlite_store(tmp_path)
    spec = tmp_path / "p.yaml"
    spec.write_text(
        PIPELINE.format(
            workdir=tmp_path / "work", uri=uri, python=sys.executable, port=free_port()
        ),
        encoding="utf-8",
    )
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env |= {"TIBNLP_DATA": str(tmp_path / "data"), "PYTHONPATH": f"{HERE}{os.pathsep}{ROOT}"}
    proc = subprocess.Popen(
        [sys.executable, "-c", CLI, str(spec)],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own group, as a shell's job is
    )
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        pids = sorted((tmp_path / "work").glob("s/*.partial/pid-*"))
        if len(pids) == 2:
            time.sleep(0.3)  # (the files are written whole by then)
            return proc, uri, [int(p.read_text()) for p in pids]
        time.sleep(0.2)
    proc.kill()
    out = proc.communicate()[0].decode(errors="replace")
    raise AssertionError(f"the launched stage never ran both workers:\n{out[-3000:]}")


def _statuses(uri: str) -> dict[str, str]:
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("stopx")
    return {r.info.run_name: r.info.status for r in client.search_runs([exp.experiment_id])}


@pytest.mark.slow
@pytest.mark.parametrize("group", [False, True], ids=["the-pipeline", "its-group"])
def test_a_sigterm_stops_the_launched_stage_and_ends_its_runs_killed(
    tmp_path: Path, group: bool
) -> None:
    """`kill PID` (`docker stop`) reaches the pipeline alone; a scheduler signals the group.
    Either way the launcher and both workers stop, the runs read KILLED, and the exit status
    says SIGTERM. Before, the pipeline died on the spot, its runs stayed RUNNING and torchrun
    trained on."""
    proc, uri, workers = _start(tmp_path)
    if group:
        os.killpg(proc.pid, signal.SIGTERM)
    else:
        proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=180)[0].decode(errors="replace")
    assert proc.returncode == 128 + signal.SIGTERM, out[-3000:]
    assert "interrupted in stage s" in out
    assert all(_gone(pid) for pid in workers), out[-3000:]
    assert _statuses(uri) == {"stopx": "KILLED", "s": "KILLED"}


@pytest.mark.slow
@pytest.mark.parametrize("group", [False, True], ids=["the-pipeline", "its-group"])
def test_a_pipeline_killed_outright_takes_its_launched_stage_with_it(
    tmp_path: Path, group: bool
) -> None:
    """SIGKILL to the pipeline alone: torchrun is told (its parent-death signal) and stops its
    workers. To the pipeline's group: torchrun dies with it, and its workers (in a session of
    their own, which the signal does not reach) stop once orphaned."""
    proc, uri, workers = _start(tmp_path)
    if group:
        os.killpg(proc.pid, signal.SIGKILL)
    else:
        proc.kill()
    proc.communicate(timeout=60)
    assert all(_gone(pid) for pid in workers)
    assert _statuses(uri) == {"stopx": "RUNNING", "s": "RUNNING"}  # the next run ends them


# the CLI's entry point with one more command, `nap`: it notes its pid, waits to be stopped,
# and writes what its `finally` saw (a command stopped the Ctrl-C way gets to write it)
NAP = """
import os, sys, time
from pathlib import Path
from tibnlp.cli.main import app, main
out = Path(sys.argv[1])
@app.command("nap")
def nap() -> None:
    (out / f"pid-{os.environ.get('RANK', '0')}").write_text(str(os.getpid()))
    try:
        time.sleep(120)
    finally:
        (out / f"ended-{os.getpid()}").write_text("cleaned up")
sys.argv = ["tibnlp", "nap"]
main()
"""

# a middle process starts the `nap` command as a launcher would, prints its pid, then waits
NAP_MIDDLE = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]])
print(child.pid, flush=True)
time.sleep(120)
"""


@contextlib.contextmanager
def _nap_under_a_launcher(tmp_path: Path, launcher: str) -> Iterator[tuple[Popen, int]]:
    """The `nap` command started by a middle process standing in for a launcher (`launcher`:
    the environment variable it sets, torchrun's or DeepSpeed launch.py's; "": none);
    (the middle process, the command's pid), both ended afterwards."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for key in stopping.LAUNCHER_ENV:
        env.pop(key, None)
    if launcher:
        env[launcher] = "0"
    middle = subprocess.Popen(
        [sys.executable, "-c", NAP_MIDDLE, NAP, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    child = 0
    try:
        assert middle.stdout is not None
        child = int(middle.stdout.readline())
        yield middle, child
    finally:
        middle.kill()
        middle.wait()
        if child:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)


@pytest.mark.parametrize(
    "launcher",
    ["TORCHELASTIC_RUN_ID", "CROSS_RANK", ""],
    ids=["under-torchrun", "under-deepspeed-launch", "a-users-own"],
)
def test_a_command_stops_when_its_launcher_is_killed_outright(
    tmp_path: Path, launcher: str
) -> None:
    """A worker torchrun or DeepSpeed's launch.py started (its environment says so) stops the
    Ctrl-C way once its launcher is SIGKILLed. A command a user started, reparented at
    logout, runs on."""
    with _nap_under_a_launcher(tmp_path, launcher) as (middle, child):
        deadline = time.monotonic() + 60
        while not (tmp_path / "pid-0").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (tmp_path / "pid-0").exists(), "the command never started"
        middle.kill()
        middle.wait()
        if launcher:
            assert _gone(child), f"process {child} outlived its SIGKILLed launcher"
            assert (tmp_path / f"ended-{child}").read_text() == "cleaned up"
        else:
            assert not _gone(child, within=2.5)


def test_a_launcher_killed_while_the_worker_imports_the_cli_is_noticed(tmp_path: Path) -> None:
    """Importing the CLI takes seconds: a launcher killed then used to go unnoticed (the
    worker took its adoptive parent for its launcher and ran the whole command). The watch
    is armed before those imports."""
    with _nap_under_a_launcher(tmp_path, "TORCHELASTIC_RUN_ID") as (middle, child):
        time.sleep(1.0)  # the child is importing torch and the rest
        middle.kill()
        middle.wait()
        assert _gone(child, within=60), f"process {child} outlived its SIGKILLed launcher"


@pytest.mark.slow
def test_a_standalone_torchrun_whose_torchrun_is_killed_takes_its_workers_with_it(
    tmp_path: Path,
) -> None:
    """`torchrun ... tibnlp ...` outside a pipeline, torchrun SIGKILLed (an OOM killer):
    torch leaves its workers running, in a session of their own; each stops itself."""
    from tibnlp.tracking.server import free_port

    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONPATH"] = str(ROOT)
    script = tmp_path / "nap.py"
    script.write_text(NAP, encoding="utf-8")
    run = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    run += ["--master_port", str(free_port()), str(script), str(tmp_path)]
    proc = subprocess.Popen(run, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while len(list(tmp_path.glob("pid-*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(0.3)  # (the files are written whole by then)
        workers = [int(p.read_text()) for p in sorted(tmp_path.glob("pid-*"))]
        assert len(workers) == 2, "torchrun never ran both workers"
        proc.kill()
        proc.wait()
        assert all(_gone(pid) for pid in workers)
        assert all((tmp_path / f"ended-{pid}").is_file() for pid in workers)
    finally:
        proc.kill()
        for pid_file in tmp_path.glob("pid-*"):
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)


def test_a_ctrl_c_during_the_commands_imports_exits_without_a_traceback() -> None:
    """Importing the CLI takes seconds (torch, MLflow, scikit-learn): a Ctrl-C then printed
    the 30-line traceback of whatever import it stopped."""
    # `python -m tibnlp --help`, once the interpreter is up: a SIGINT before Python has set
    # its handler ends the process by the signal (-2), which a loaded machine showed at 0.5 s
    start = (
        "import runpy, sys; print('ready', flush=True); sys.argv = ['tibnlp', '--help']; "
        "runpy.run_module('tibnlp', run_name='__main__', alter_sys=True)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", start],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        # Python takes SIGINT as Ctrl-C only when it starts with the default action (a test
        # run in a shell's background would hand it down ignored)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    time.sleep(0.5)  # (well inside the imports)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in err, err
