"""A standalone fine-tuning holds its output folder: a second run on it refuses (or waits),
and one killed outright has its MLflow runs ended KILLED by the next run there
(tibnlp.training.held_output)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.test_finetune import _cfg, cfg_flags, env  # noqa: F401  (the fixture)
from tibnlp.folder_lock import FolderBusy, hold_folder
from tibnlp.tracking.orphans import LEDGER
from tibnlp.training.finetune import run_finetune

ROOT = Path(__file__).resolve().parents[1]

# the same fine-tuning in a process of its own, killed with SIGKILL in its first seed's
# training: its parent and seed runs are open, its note is in the output folder's ledger
KILLED = """
import os, signal, sys
from types import SimpleNamespace
from pathlib import Path
from tests.test_finetune import _cfg
from tibnlp.training import finetune

def die(*_args, **_kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

finetune.train_one_seed = die
env = SimpleNamespace(tmp=Path(sys.argv[1]), vocab=Path(sys.argv[2]))
finetune.run_finetune(_cfg(env, *sys.argv[3:]), "tncc")
"""


def _tracked(env) -> list[str]:  # noqa: F811
    uri = f"sqlite:///{env.tmp / 'mlflow.db'}"
    return [
        "finetune.seeds=[1]",
        "finetune.epochs=1",
        f"tracking.uri={uri}",
        "tracking.enabled=true",
    ]


def test_a_second_run_on_a_held_output_folder_refuses_naming_the_holder(env) -> None:  # noqa: F811
    result = run_finetune(_cfg(env, "finetune.seeds=[1]", "finetune.epochs=1"), "tncc")
    assert not (result.output / ".tibnlp.lock").exists()  # let go when the run ended
    with hold_folder(result.output), pytest.raises(FolderBusy) as busy:
        run_finetune(_cfg(env, "finetune.seeds=[1]", "finetune.epochs=1"), "tncc")
    assert str(result.output) in busy.value.message and "--wait" in (busy.value.hint or "")


def test_a_finetuning_killed_outright_has_its_runs_ended_by_the_next(env) -> None:  # noqa: F811
    settings = _tracked(env)
    pypath = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    died = subprocess.run(
        [sys.executable, "-c", KILLED, str(env.tmp), str(env.vocab), *settings],
        env={**os.environ, "PYTHONPATH": pypath},
        cwd=env.tmp,
    )
    assert died.returncode == -signal.SIGKILL
    client = MlflowClient(settings[2].split("=", 1)[1])
    exp = client.get_experiment_by_name("tibnlp").experiment_id
    before = client.search_runs([exp])
    assert sorted(r.info.status for r in before) == ["RUNNING", "RUNNING"]  # parent and seed
    (ledger,) = (env.tmp / "runs").glob(f"*/*/{LEDGER}")

    result = run_finetune(_cfg(env, *settings), "tncc")
    status = {r.info.run_id: r.info.status for r in client.search_runs([exp])}
    assert all(status[r.info.run_id] == "KILLED" for r in before)
    assert [status[s.run_id] for s in result.seeds] == ["FINISHED"]
    assert ledger.parent == result.output and not ledger.exists()


def test_a_pipeline_stages_finetuning_notes_no_run(env, monkeypatch) -> None:  # noqa: F811
    """In a stage the pipeline ends its own killed runs: the folder is held, nothing noted
    (a standalone run notes its parent, the control)."""
    from tibnlp.training import held_output

    noted: list[str] = []
    monkeypatch.setattr(held_output, "open_run", lambda _folder, run_id, _uri: noted.append(run_id))
    uri = _tracked(env)[2].split("=", 1)[1]
    run_finetune(_cfg(env, *_tracked(env)), "tncc")
    assert len(noted) == 1
    client = MlflowClient(uri)
    stage_run = client.create_run(client.create_experiment("stage")).info.run_id
    cfg = _cfg(env, *_tracked(env), f"tracking.run_id={stage_run}", "tracking.experiment=stage")
    run_finetune(cfg, "tncc")
    assert len(noted) == 1


@pytest.mark.slow
def test_a_data_parallel_finetuning_waits_for_its_folder_on_every_rank(env) -> None:  # noqa: F811
    """Under torchrun with --wait, rank 0 waits for the folder; rank 1 waits for rank 0 (on
    the store, not in a collective that times out after minutes: not waited out here), and
    both train once it is free, the wait said once."""
    import time

    from tibnlp.tracking.server import free_port

    flags = ["finetune.seeds=[1]", "finetune.epochs=1"]
    first = run_finetune(_cfg(env, *flags), "tncc")  # (the folder's name)
    sets = [arg for item in cfg_flags(env, flags[1]) for arg in ("--set", item)]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    cmd += ["--master_port", str(free_port()), "-m", "tibnlp.cli.main"]
    cmd += ["finetune", "tncc", "--seeds", "2", "--wait", *sets]
    keep = {"RANK", "WORLD_SIZE", "LOCAL_RANK"}
    child_env = {k: v for k, v in os.environ.items() if k not in keep}
    with hold_folder(first.output):
        proc = subprocess.Popen(
            cmd, env=child_env, cwd=env.tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        time.sleep(20)  # both ranks started and are waiting
        assert proc.poll() is None
        assert not (first.output / "seed-2").exists()
    out = proc.communicate(timeout=300)[0].decode(errors="replace")
    assert proc.returncode == 0, out[-3000:]
    assert (
        out.count("waiting for") == 1 and (first.output / "seed-2" / "seed_result.json").is_file()
    )
