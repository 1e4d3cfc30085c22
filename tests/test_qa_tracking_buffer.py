"""The offline buffer and `tibnlp runs sync` as a demanding user meets them: a damaged
`ids.json`, a replay whose answer was lost, a run whose creator is gone, a store that does not
answer, a last line cut short, a record holding U+2028, an empty folder."""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from tibnlp.cli.main import app
from tibnlp.errors import DataError, TibnlpError
from tibnlp.tracking import Tracker
from tibnlp.tracking.buffer import TAG_LOCAL_ID, Buffer, IdMap, read_records
from tibnlp.tracking.replay import Applier
from tibnlp.tracking.testing import sqlite_store


def _sync(*args: str) -> tuple[int, str, BaseException | None]:
    result = CliRunner().invoke(app, ["runs", "sync", *args])
    code = result.exception.exit_code if isinstance(result.exception, TibnlpError) else None
    return code or result.exit_code, " ".join(result.output.split()), result.exception


def _down(self: Applier, rec: dict) -> None:
    raise ConnectionError("store down")


def _offline_pipeline(buf: Path, uri: str, monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """A pipeline run and its stage, both created while the store was away: two buffer files
    (the parent's first)."""
    real = Applier.apply
    monkeypatch.setattr(Applier, "apply", _down)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        parent = Tracker("pipe", "parent", uri=uri, buffer_dir=buf, retry_seconds=3600)
        parent.log_params({"a": 1})
        stage = parent.child("stage")
        stage.log_metrics({"acc": 0.5}, step=1)
        stage.end()
        parent.end()
    monkeypatch.setattr(Applier, "apply", real)
    files = sorted(buf.glob("*.jsonl"))
    assert len(files) == 2
    return files


def _runs(uri: str) -> dict[str, object]:
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("pipe")
    if exp is None:
        return {}
    runs = client.search_runs([exp.experiment_id])
    assert len({r.info.run_name for r in runs}) == len(runs), "a run was created twice"
    return {r.info.run_name: r for r in runs}


def test_a_damaged_ids_json_stops_sync_naming_it_and_nothing_is_sent_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: a damaged ids.json was read as empty; the stage's buffer then waited forever
    ("parent not replayed yet", exit 1), and the next replay overwrote the file. Now: exit 2
    naming the file and the run it is needed for, nothing sent, every file as it was; once
    repaired, the stage lands under its parent, no run made twice."""
    uri, buf = sqlite_store(tmp_path), tmp_path / "buf"
    parent_file, stage_file = _offline_pipeline(buf, uri, monkeypatch)
    assert _sync(str(parent_file))[0] == 0
    ids = buf / "ids.json"
    good = ids.read_text(encoding="utf-8")
    (local,) = json.loads(good)
    ids.write_text(good[:20], encoding="utf-8")  # cut short
    stage_text = stage_file.read_text(encoding="utf-8")

    code, said, exc = _sync(str(buf))
    assert code == 2 and isinstance(exc, DataError), said
    assert f"{ids} is damaged" in str(exc) and local in str(exc)
    assert "repair it" in str(exc.hint) and "move it away" in str(exc.hint)
    assert ids.read_text(encoding="utf-8") == good[:20]
    assert stage_file.read_text(encoding="utf-8") == stage_text
    assert set(_runs(uri)) == {"parent"}

    ids.write_text(good, encoding="utf-8")  # repaired
    code, said, _ = _sync(str(buf))
    assert code == 0, said
    runs = _runs(uri)
    assert runs["stage"].data.tags["mlflow.parentRunId"] == runs["parent"].info.run_id
    assert runs["stage"].data.metrics == {"acc": 0.5}
    stage = runs["stage"]
    assert json.loads(ids.read_text(encoding="utf-8")) == {
        local: runs["parent"].info.run_id,
        stage.data.tags[TAG_LOCAL_ID]: stage.info.run_id,
    }


def test_a_damaged_ids_json_moved_away_is_rebuilt_from_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hint's other way out: without ids.json the parent is found by its local-id tag."""
    uri, buf = sqlite_store(tmp_path), tmp_path / "buf"
    parent_file, _ = _offline_pipeline(buf, uri, monkeypatch)
    assert _sync(str(parent_file))[0] == 0
    (buf / "ids.json").rename(tmp_path / "ids.json.damaged")
    code, said, _ = _sync(str(buf))
    assert code == 0, said
    runs = _runs(uri)
    assert runs["stage"].data.tags["mlflow.parentRunId"] == runs["parent"].info.run_id


def test_a_run_whose_creator_is_gone_is_named_not_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The parent's buffer replayed elsewhere (or deleted) and no ids.json: before, exit 1
    "run this again later" forever. Now exit 2 naming the run and ids.json, the file kept."""
    uri, buf = sqlite_store(tmp_path), tmp_path / "buf"
    parent_file, stage_file = _offline_pipeline(buf, uri, monkeypatch)
    local = json.loads(parent_file.read_text(encoding="utf-8").splitlines()[1])["local_id"]
    parent_file.unlink()
    text = stage_file.read_text(encoding="utf-8")
    code, said, exc = _sync(str(buf))
    assert code == 2 and isinstance(exc, DataError), said
    assert f"cannot be sent: {stage_file.name}: run {local}" in said
    assert str(buf / "ids.json") in said and "ids.json" in str(exc.hint)
    assert stage_file.read_text(encoding="utf-8") == text and _runs(uri) == {}


def test_a_stage_file_before_its_parent_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Synced by name, the stage's file says which file creates its parent; in a folder where
    it sorts first, it is replayed again once that file is."""
    uri, buf = sqlite_store(tmp_path), tmp_path / "buf"
    parent_file, stage_file = _offline_pipeline(buf, uri, monkeypatch)
    code, said, _ = _sync(str(stage_file))
    assert code == 1, said
    assert f"is created in {parent_file.name}, not replayed yet" in said
    stage_file.rename(buf / ("0-" + stage_file.name))  # sorts before the parent's file now
    code, said, _ = _sync(str(buf))
    assert code == 0 and "replayed 6 buffered tracking calls" in said, said
    runs = _runs(uri)
    assert runs["stage"].data.tags["mlflow.parentRunId"] == runs["parent"].info.run_id


def test_ids_json_keeps_the_entries_of_another_process(tmp_path: Path) -> None:
    """Two trackers of one buffer folder (a pipeline and its launched stage) each wrote the
    map they had read at start: the other's entry was lost, its calls then waited forever."""
    one, two = IdMap(tmp_path), IdMap(tmp_path)
    a, b = "offline-" + "a" * 32, "offline-" + "b" * 32
    one.add(a, "A", persist=True)
    two.add(b, "B", persist=True)
    assert json.loads((tmp_path / "ids.json").read_text(encoding="utf-8")) == {a: "A", b: "B"}
    assert not [p.name for p in tmp_path.iterdir() if p.name != "ids.json"]  # no temp left


def test_a_live_tracker_keeps_its_calls_while_ids_json_is_damaged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A tracker that reconnects does not create its run (its id could not be kept): the
    calls stay in its buffer, the reason is logged, and a sync after the repair sends them."""
    uri, buf = sqlite_store(tmp_path), tmp_path / "buf"
    buf.mkdir()
    ids = buf / "ids.json"
    ids.write_text("{oops", encoding="utf-8")
    real = Applier.apply
    monkeypatch.setattr(Applier, "apply", _down)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = Tracker("pipe", "parent", uri=uri, buffer_dir=buf, retry_seconds=3600)
    monkeypatch.setattr(Applier, "apply", real)
    run.log_metrics({"m": 1.0}, step=0)
    with caplog.at_level(logging.WARNING, logger="tibnlp.tracking"):
        run.end()  # the store answers: the replay stops at the damaged map
    assert f"{ids} is damaged" in caplog.text
    assert len(run.buffer) == 3 and not list(buf.glob("*.unsent")) and _runs(uri) == {}
    assert ids.read_text(encoding="utf-8") == "{oops"
    ids.unlink()
    assert _sync(str(buf))[0] == 0
    assert _runs(uri)["parent"].data.metrics == {"m": 1.0}


def test_a_create_run_whose_answer_was_lost_is_not_made_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store made the run but its answer was lost (a timeout): the call stayed buffered,
    and the next sync made a second, empty run that stayed RUNNING. A second sync of a sent
    buffer sends nothing."""
    uri, buf = sqlite_store(tmp_path), tmp_path / "buf"
    _offline_pipeline(buf, uri, monkeypatch)
    real = MlflowClient.create_run

    def lost(self: MlflowClient, *args: object, **kwargs: object) -> object:
        real(self, *args, **kwargs)
        raise ConnectionError("read timed out")

    monkeypatch.setattr(MlflowClient, "create_run", lost)
    assert _sync(str(buf))[0] == 1
    monkeypatch.setattr(MlflowClient, "create_run", real)
    code, said, _ = _sync(str(buf))
    assert code == 0, said
    runs = _runs(uri)  # one run each
    assert set(runs) == {"parent", "stage"} and runs["parent"].info.status == "FINISHED"
    assert runs["stage"].data.tags["mlflow.parentRunId"] == runs["parent"].info.run_id
    code, said, _ = _sync(str(buf))
    assert code == 0 and "replayed 0 buffered tracking calls" in said and len(_runs(uri)) == 2


def test_an_unreachable_store_keeps_every_file_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each file waited for the store's retries in turn, and the second was said to wait for
    its parent; the reason was cut before "Connection refused". Now the store is tried once."""
    from tibnlp.tracking import sync
    from tibnlp.tracking.server import free_port

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    uri, buf = sqlite_store(tmp_path), tmp_path / "buf"
    files = _offline_pipeline(buf, uri, monkeypatch)
    away = f"http://127.0.0.1:{free_port()}"
    texts = [f.read_text(encoding="utf-8") for f in files]
    tried: list[Path] = []

    def counted(path: Path, applier: Applier) -> object:
        tried.append(path)
        return real(path, applier)

    real = sync.replay
    monkeypatch.setattr(sync, "replay", counted)
    code, said, _ = _sync(str(buf), "--tracking-uri", away)
    assert code == 1, said
    assert "2 buffer files left" in said and tried == files[:1]
    for f in files:
        assert f"{f.name}: the store {away} did not answer" in said
    assert "Connection refused" in said
    assert [f.read_text(encoding="utf-8") for f in files] == texts


def test_a_last_line_cut_short_is_kept_and_the_next_record_stands_alone(tmp_path: Path) -> None:
    """A write cut short (disk full) followed by an append glued the new record to the torn
    line: both lost. Now the torn line is reported and kept, the record sent."""
    uri = sqlite_store(tmp_path)
    path = tmp_path / "buf" / "1-a.jsonl"
    local = "offline-" + "c" * 32
    buffer = Buffer(path, uri)
    buffer.append({"op": "create_run", "local_id": local, "experiment": "pipe", "run_name": "r"})
    with path.open("a", encoding="utf-8") as fh:
        fh.write('{"op": "log_batch", "ru')  # the writer stopped mid-line
    buffer.append(
        {"op": "log_batch", "run": local, "metrics": [], "params": [["p", "1"]], "tags": []}
    )
    assert [r["op"] for r in read_records(path)] == ["header", "create_run", "log_batch"]
    code, said, _ = _sync(str(path))
    assert code == 2 and "line 3 is no tracking record" in said, said
    assert _runs(uri)["r"].data.params == {"p": "1"}
    (kept,) = path.parent.glob("*.unsent")
    assert kept.read_text(encoding="utf-8").splitlines()[1] == '{"op": "log_batch", "ru'


def test_a_record_holding_a_line_separator_is_one_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A param value with U+2028 (or U+0085) split its record in two damaged lines: the call
    was lost, and its kept copy lost the character."""
    uri, buf = sqlite_store(tmp_path), tmp_path / "buf"
    real = Applier.apply
    monkeypatch.setattr(Applier, "apply", _down)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = Tracker("pipe", "r", uri=uri, buffer_dir=buf, retry_seconds=3600)
        run.log_params({"note": "a\u2028b\u0085c"})
    monkeypatch.setattr(Applier, "apply", real)
    run.end()
    assert not list(buf.glob("*.unsent"))
    assert _runs(uri)["r"].data.params == {"note": "a\u2028b\u0085c"}


def test_an_empty_or_absent_folder_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing to send is success, said as such; a *.jsonl there that is no buffer is named
    rather than passed over in silence."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TIBNLP_TRACKING_BUFFER", raising=False)
    code, said, _ = _sync()
    assert code == 0 and "no buffer files in .tibnlp/tracking-buffer (no such folder" in said
    folder = tmp_path / "buf"
    folder.mkdir()
    (folder / "torn.jsonl").write_text('{"op": "hea', encoding="utf-8")
    code, said, _ = _sync(str(folder))
    assert code == 0 and f"no buffer files in {folder}" in said, said
    assert f"skipped {folder / 'torn.jsonl'}: not a tracking buffer" in said
    assert not (tmp_path / "mlflow.db").exists()


def test_an_artifact_sent_before_a_replay_was_killed_is_not_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replay killed after an upload (its staged copy then removed) but before the buffer
    was rewritten: the next sync refused the upload as "no longer exists" (exit 2)."""
    uri, buf = sqlite_store(tmp_path), tmp_path / "buf"
    real = Applier.apply
    monkeypatch.setattr(Applier, "apply", _down)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = Tracker("pipe", "r", uri=uri, buffer_dir=buf, retry_seconds=3600)
        run.log_text("hello", "reports/r.txt")
        run.end()
    monkeypatch.setattr(Applier, "apply", real)
    (path,) = buf.glob("*.jsonl")
    text = path.read_text(encoding="utf-8")
    assert _sync(str(buf))[0] == 0
    path.write_text(text, encoding="utf-8")  # as the killed replay left it
    code, said, _ = _sync(str(buf))
    assert code == 0 and not list(buf.glob("*.unsent")), said
    run_id = _runs(uri)["r"].info.run_id
    assert [a.path for a in MlflowClient(uri).list_artifacts(run_id, "reports")] == [
        "reports/r.txt"
    ]


def test_the_parser_knows_every_operation_the_replay_applies() -> None:
    """buffer.OPS (what a line may name) and Applier's handlers are one list in two places:
    an operation added to one only would be refused as damaged, or never parsed."""
    from tibnlp.tracking.buffer import OPS
    from tibnlp.tracking.replay import Applier

    handlers = {n.removeprefix("_op_") for n in vars(Applier) if n.startswith("_op_")}
    assert handlers == set(OPS) | {"header"}


def _offline_artifacts(buf: Path, uri: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A run whose text and file artifacts were buffered (staged copies) while the store was
    away: its buffer file."""
    real = Applier.apply
    monkeypatch.setattr(Applier, "apply", _down)
    source = buf.parent / "results.json"
    source.write_text("{}", encoding="utf-8")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = Tracker("pipe", "r", uri=uri, buffer_dir=buf, retry_seconds=3600)
        run.log_text("hello", "reports/r.txt")
        run.log_artifact(source)
        run.end()
    monkeypatch.setattr(Applier, "apply", real)
    source.unlink()  # (its copy is what is uploaded)
    (path,) = buf.glob("*.jsonl")
    return path


def _artifacts(uri: str) -> list[str]:
    client, run_id = MlflowClient(uri), _runs(uri)["r"].info.run_id
    return sorted(a.path for a in client.list_artifacts(run_id) if not a.is_dir) + [
        a.path for a in client.list_artifacts(run_id, "reports")
    ]


def test_a_buffer_folder_carried_elsewhere_sends_its_artifacts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The offline workflow: train where the store is away, carry the buffer folder to a
    machine that reaches it, sync. The staged copies were buffered by their absolute paths,
    so every artifact was dropped ("the store refused it: ... no longer exists", exit 2)."""
    uri, buf = sqlite_store(tmp_path), tmp_path / "buf"
    _offline_artifacts(buf, uri, monkeypatch)
    carried = buf.rename(tmp_path / "carried")
    code, said, _ = _sync(str(carried))
    assert code == 0 and not list(carried.glob("*.unsent")), said
    assert _artifacts(uri) == ["results.json", "reports/r.txt"]


def test_a_buffer_written_with_absolute_paths_and_moved_still_sends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A buffer written before staged paths were kept relative: moved, its copies are found
    in its own `files/` folder."""
    uri, buf = sqlite_store(tmp_path), tmp_path / "buf"
    path = _offline_artifacts(buf, uri, monkeypatch)
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        rec = json.loads(line)
        if rec.get("staged"):  # as an older tibnlp wrote it
            rec["path"] = str((buf / rec["path"]).resolve())
        lines.append(json.dumps(rec))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    carried = buf.rename(tmp_path / "carried")
    code, said, _ = _sync(str(carried))
    assert code == 0, said
    assert _artifacts(uri) == ["results.json", "reports/r.txt"]


def test_a_buffered_artifact_whose_file_is_gone_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its staged copy deleted: said to be missing (not "the store refused it"), kept."""
    uri, buf = sqlite_store(tmp_path), tmp_path / "buf"
    _offline_artifacts(buf, uri, monkeypatch)
    for staged in (buf / "files").glob("staged-*/results.json"):
        staged.unlink()
    code, said, exc = _sync(str(buf))
    assert code == 2 and isinstance(exc, DataError), said
    assert "not sent, its file is missing:" in said and "results.json" in said, said
    assert "the store refused it" not in said
    assert len(list(buf.glob("*.unsent"))) == 1
    assert _artifacts(uri) == ["reports/r.txt"]


@pytest.mark.parametrize("uptime", [5.0, 1e6])
def test_the_last_try_at_the_end_replays_on_a_machine_just_booted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, uptime: float
) -> None:
    """`time.monotonic()` counts from boot. "Never tried" was 0.0, so on a machine up for less
    than `retry_seconds` (a fresh CI box, 3600 s here) the end's "one last try now" was
    skipped and the calls stayed buffered though the store answered."""
    uri, buf = sqlite_store(tmp_path), tmp_path / "buf"
    real = Applier.apply
    monkeypatch.setattr("tibnlp.tracking.outbox.time.monotonic", lambda: uptime)
    monkeypatch.setattr(Applier, "apply", _down)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = Tracker("pipe", "parent", uri=uri, buffer_dir=buf, retry_seconds=3600)
    monkeypatch.setattr(Applier, "apply", real)
    run.log_metrics({"m": 1.0}, step=0)  # tried within the interval: kept
    assert len(run.buffer) > 0
    run.end()  # the store answers: the last try sends everything
    assert not run.buffer.pending()
    assert _runs(uri)["parent"].data.metrics == {"m": 1.0}
