"""A launched worker that left its process group ends without interpreter finalization, where
gloo's threads could abort it (SIGABRT) after its work is done; everything before
finalization still happens."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from tibnlp.training import worker_exit


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120
    )


def test_a_process_that_never_left_a_group_exits_as_usual() -> None:
    worker_exit.end(3)  # returns: this (pytest) process never joined a group of several


def test_a_worker_that_left_its_group_runs_everything_before_finalization(
    tmp_path: Path,
) -> None:
    done = _python(
        f"""
        import atexit, sys, threading, time
        from pathlib import Path
        from tibnlp.training import worker_exit

        out = Path({str(tmp_path)!r})
        atexit.register(lambda: (out / "atexit").write_text("ran"))

        def late():
            time.sleep(0.2)
            (out / "thread").write_text("joined")

        threading.Thread(target=late).start()  # non-daemon: Python joins it before exiting

        class Finalized:
            def __del__(self):
                (out / "finalized").write_text("ran")

        keep = Finalized()  # a module global: collected only by finalization
        sys.stdout.write("unflushed")
        worker_exit.left_group()
        worker_exit.end(5)
        (out / "after").write_text("reached")
        """
    )
    assert done.returncode == 5, done.stderr
    assert done.stdout == "unflushed"
    assert (tmp_path / "atexit").read_text() == "ran"
    assert (tmp_path / "thread").read_text() == "joined"
    assert not (tmp_path / "after").exists()
    assert not (tmp_path / "finalized").exists()  # finalization skipped: the point


def test_exit_codes_follow_sys_exit() -> None:
    for code, status, stderr in [(None, 0, ""), ("bye", 1, "bye\n"), (7, 7, "")]:
        done = _python(
            f"""
            from tibnlp.training import worker_exit
            worker_exit.left_group()
            worker_exit.end({code!r})
            """
        )
        assert (done.returncode, done.stderr) == (status, stderr)


def test_the_cli_ends_a_worker_that_left_its_group_with_the_command_status(
    tmp_path: Path,
) -> None:
    # a user error (status 2, message printed) and a success (--help, status 0)
    for argv, status, says in [
        (["model", "describe", "--config", str(tmp_path / "absent.yaml")], 2, "error:"),
        (["model", "--help"], 0, "Usage"),
    ]:
        done = _python(
            f"""
            import atexit, sys
            from pathlib import Path
            from tibnlp.training import worker_exit
            from tibnlp.cli.main import main

            atexit.register(lambda: Path({str(tmp_path / "atexit")!r}).write_text("ran"))
            worker_exit.left_group()
            sys.argv = ["tibnlp", *{argv!r}]
            main()
            """
        )
        assert done.returncode == status, done.stdout + done.stderr
        assert says in done.stdout + done.stderr
        assert (tmp_path / "atexit").read_text() == "ran"
        (tmp_path / "atexit").unlink()
