"""A throwaway PostgreSQL server on 127.0.0.1 for tests (Debian's `postgresql` binaries).

As root, the server runs as the `postgres` user (PostgreSQL refuses to run as root). It is
stopped and its folder removed however the test ends.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path


def pg_bin() -> Path | None:
    """The folder holding initdb and pg_ctl, or None where PostgreSQL is not installed."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(found).resolve().parent
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    return versions[-1].parent if versions else None


def why_not() -> str:
    """Empty when a test server can start here; otherwise the reason to skip."""
    if pg_bin() is None:
        return "PostgreSQL binaries (initdb, pg_ctl) absent: apt-get install postgresql"
    try:
        import psycopg2  # noqa: F401
    except ImportError:
        return "psycopg2 absent: pip install -e '.[postgres]'"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root without a 'postgres' user to run the server as"
    return ""


@contextlib.contextmanager
def postgres(port: int, database: str = "mlflow") -> Iterator[str]:
    """Start a server with trust auth on 127.0.0.1:`port`; yield its SQLAlchemy URI."""
    import psycopg2

    binaries = pg_bin()
    assert binaries is not None, why_not()
    root = Path(tempfile.mkdtemp(prefix="tibnlp-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:
        pw = pwd.getpwnam("postgres")
        os.chown(root, pw.pw_uid, pw.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    data, log = root / "data", root / "server.log"
    pg_ctl = [*as_user, str(binaries / "pg_ctl"), "-D", str(data)]
    options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off"
    initdb = [str(binaries / "initdb"), "-D", str(data), "-U", "tibnlp", "--auth=trust"]
    try:
        subprocess.run(
            [*as_user, *initdb, "-E", "UTF8", "--no-sync"],
            check=True,
            capture_output=True,
            cwd=root,
        )
        subprocess.run(
            [*pg_ctl, "-l", str(log), "-w", "-o", options, "start"],
            check=True,
            capture_output=True,
            cwd=root,
        )
        conn = psycopg2.connect(host="127.0.0.1", port=port, user="tibnlp", dbname="postgres")
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE {database}")
        conn.close()
        yield f"postgresql+psycopg2://tibnlp@127.0.0.1:{port}/{database}"
    finally:
        subprocess.run(
            [*pg_ctl, "-m", "immediate", "-w", "stop"], check=False, capture_output=True, cwd=root
        )
        shutil.rmtree(root, ignore_errors=True)
