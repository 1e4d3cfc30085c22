"""A labelled set of one's own: `finetune classify --dataset FOLDER` (tibnlp.data.folder_set)
fine-tunes on train/validation/test.jsonl in a folder, names the run by the folder, hashes its
files into the seeds' data hash and a pipeline stage's cache, and `predict` reads the result."""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from typer.testing import CliRunner

from tests.ft_fixtures import LABELS, make_vocab, tiny_textcnn, write_split
from tibnlp.cli.main import app
from tibnlp.config import load_config
from tibnlp.data.folder_set import is_folder_dataset
from tibnlp.data.tasks import load_classification
from tibnlp.errors import ConfigError, DataError
from tibnlp.training.finetune import run_finetune
from tibnlp.training.finetune_setup import prepare

ONE_EPOCH = ("finetune.epochs=1", "engine.threads=1")


@pytest.fixture(scope="module")
def vocab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_vocab(tmp_path_factory.mktemp("own") / "vocab")


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, vocab: Path) -> SimpleNamespace:
    """A folder set `mine` (with labels.json, in TNCC's non-alphabetical order) in the current
    directory, and an empty data directory: nothing is read from a manifest."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TIBNLP_DATA", str(tmp_path / "datadir"))
    return SimpleNamespace(tmp=tmp_path, vocab=vocab, folder=make_set(tmp_path / "mine"))


def make_set(folder: Path, labels_json: bool = True) -> Path:
    folder.mkdir(parents=True)
    for split, n, seed in (("train", 45, 1), ("validation", 12, 2), ("test", 12, 3)):
        write_split(folder / f"{split}.jsonl", n, seed, split)
    if labels_json:
        (folder / "labels.json").write_text(json.dumps(LABELS), "utf-8")
    return folder


def _cfg(env: SimpleNamespace, *extra: str):
    return load_config(None, tiny_textcnn(env.vocab, env.tmp / "runs", *ONE_EPOCH, *extra))


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text("utf-8").splitlines()]


def _write(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), "utf-8")


def test_the_rule_tells_a_folder_from_a_name(env) -> None:
    assert is_folder_dataset("mine") and is_folder_dataset("./not-there")
    assert is_folder_dataset("data/not-there")
    assert not is_folder_dataset("tusa") and not is_folder_dataset("not-there")


def test_a_folder_set_fine_tunes_end_to_end_and_predict_reads_it(env) -> None:
    """Through the CLI, tracked: the results and the MLflow run name the set by its folder and
    record its path and files' hash; `tibnlp predict` runs the classifier as it is."""
    from mlflow.tracking import MlflowClient

    from tibnlp.tracking.testing import sqlite_store

    uri = sqlite_store(env.tmp)
    settings = [*tiny_textcnn(env.vocab, env.tmp / "runs", *ONE_EPOCH), f"tracking.uri={uri}"]
    sets = [arg for s in [*settings, "tracking.enabled=true"] for arg in ("-s", s)]
    args = ["finetune", "classify", "--dataset", "mine", "--encoder", "none", *sets]
    done = CliRunner().invoke(app, args)
    assert done.exit_code == 0, done.output
    out = env.tmp / "runs" / "mine" / "textcnn-pieces(scratch)"
    saved = json.loads((out / "results.json").read_text("utf-8"))
    assert saved["dataset"] == "mine"
    assert saved["notes"]["dataset_folder"] == str(env.folder.resolve())
    assert "labels" not in saved["notes"]  # labels.json gave them
    classifier = yaml.safe_load((out / "seed-1" / "classifier.yaml").read_text("utf-8"))
    assert classifier["labels"] == LABELS and classifier["dataset"] == "mine"

    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("tibnlp").experiment_id])
    (parent,) = [r for r in runs if not r.data.tags.get("mlflow.parentRunId")]
    assert parent.data.tags["dataset"] == "mine"
    assert parent.data.tags["dataset_folder"] == str(env.folder.resolve())
    data = load_classification("mine")
    assert parent.data.tags["tibnlp.data_hash"] == data.files_sha256 != ""

    texts = env.tmp / "in.jsonl"
    _write(texts, [{"text": "རྒྱལ ཁབ སྲིད བློན"}, {"text": "སློབ་གྲྭ་དགེ་རྒན།"}])
    args = ["predict", "--model", str(out / "seed-1"), "--input", str(texts), "-o", "p.jsonl"]
    done = CliRunner().invoke(app, args)
    assert done.exit_code == 0, done.output
    predicted = _records(env.tmp / "p.jsonl")
    assert len(predicted) == 2 and all(p["prediction"] in LABELS for p in predicted)
    assert set(predicted[0]["probabilities"]) == set(LABELS)


def test_without_labels_json_the_classes_are_the_sorted_training_labels(env, capsys) -> None:
    (env.folder / "labels.json").unlink()
    result = run_finetune(_cfg(env), "./mine")
    err = capsys.readouterr().err
    assert err.count("no labels.json") == 1  # said once
    assert sorted(LABELS) == ["Economics", "Education", "Politics"]
    assert "Economics, Education, Politics" in result.notes["labels"]
    classifier = yaml.safe_load((result.seeds[0].directory / "classifier.yaml").read_text("utf-8"))
    assert classifier["labels"] == sorted(LABELS)
    data = load_classification("mine")
    first = _records(env.folder / "train.jsonl")[0]  # label ids follow the sorted list
    assert data.labels[data.splits["train"][0].label] == first["label"]


def test_dataset_yaml_renames_fields_and_files(env) -> None:
    own = env.tmp / "renamed"
    own.mkdir()
    for split, name in (("train", "a.jsonl"), ("validation", "dev.jsonl"), ("test", "b.jsonl")):
        rows = _records(env.folder / f"{split}.jsonl")
        # word-segmented text: a particle split off its syllable (removed spaces, not tsheg)
        _write(own / name, [{"sentence": r["text"] + " འི", "category": r["label"]} for r in rows])
    settings = {
        "text_field": "sentence",
        "label_field": "category",
        "text_form": "word_segmented",
        "max_len": 40,
        "splits": {"train": "a.jsonl", "validation": "dev.jsonl", "test": "b.jsonl"},
    }
    (own / "dataset.yaml").write_text(yaml.safe_dump(settings), "utf-8")
    data = load_classification(str(own))
    assert data.name == "renamed" and data.source_form == "word_segmented"
    assert [len(data.splits[s]) for s in ("train", "validation", "test")] == [45, 12, 12]
    assert data.texts("train")[0].endswith("འི")  # joined, as a word-segmented set is
    assert prepare(_cfg(env), data).meta.max_len == 40


def test_bad_folder_sets_are_clear_errors(env) -> None:
    folder = env.folder
    with pytest.raises(DataError) as err:  # neither a shipped set nor a folder
        load_classification("mnie")
    assert "no shipped set has that name" in err.value.message and "folder" in err.value.message
    assert "tusa" in (err.value.hint or "") and "./mnie" in (err.value.hint or "")
    with pytest.raises(DataError, match="does not exist"):
        load_classification("./gone")
    with pytest.raises(DataError, match="is a file, not a folder"):
        load_classification("mine/train.jsonl")

    (folder / "labels.json").write_text(json.dumps(LABELS[:2]), "utf-8")
    with pytest.raises(DataError, match=r"train.jsonl:3: label 'Education' is not in the label"):
        load_classification("mine")
    (folder / "labels.json").unlink()
    test = _records(folder / "test.jsonl")
    _write(folder / "test.jsonl", [*test[:4], {**test[4], "label": "Sports"}, *test[5:]])
    with pytest.raises(DataError, match=r"test.jsonl:5: label 'Sports' is in no training record"):
        load_classification("mine")
    _write(folder / "test.jsonl", test)

    (folder / "dataset.yaml").write_text("text_feild: sentence\n", "utf-8")
    with pytest.raises(ConfigError, match=r"dataset.yaml: config key 'text_feild' is unknown"):
        load_classification("mine")
    (folder / "dataset.yaml").write_text("splits: {dev: d.jsonl}\n", "utf-8")
    with pytest.raises(ConfigError, match=r"config key 'splits.dev' is unknown"):
        load_classification("mine")
    (folder / "dataset.yaml").write_text("splits: {train: ../train.jsonl}\n", "utf-8")
    with pytest.raises(ConfigError, match=r"'splits.train': must name a file inside"):
        load_classification("mine")
    (folder / "dataset.yaml").unlink()

    (folder / "validation.jsonl").unlink()
    (folder / "test.jsonl").unlink()
    with pytest.raises(DataError, match=r"lacks validation.jsonl, test.jsonl"):
        load_classification("mine")
    done = CliRunner().invoke(  # the command's exit and message, nothing written
        app, ["finetune", "classify", "--dataset", "mine", "--vocab", str(env.vocab)]
    )
    assert isinstance(done.exception, DataError) and "lacks" in done.exception.message
    assert not (env.tmp / "runs").exists()


def test_a_changed_file_retrains_the_seed(env, capsys) -> None:
    """An edit that leaves every text and label as it was (a record's id) still changes the
    seed's data hash: it is the files' content that is hashed, not only what is read."""
    first = run_finetune(_cfg(env), "mine").seeds[0]
    again = run_finetune(_cfg(env), "mine").seeds[0]
    assert "reported, not retrained" in capsys.readouterr().err
    assert again.data_sha256 == first.data_sha256 and again.record_id == first.record_id
    test = _records(env.folder / "test.jsonl")
    _write(env.folder / "test.jsonl", [{**test[0], "id": "renamed-0"}, *test[1:]])
    changed = run_finetune(_cfg(env), "mine").seeds[0]
    assert "training it again" in capsys.readouterr().err
    assert changed.data_sha256 != first.data_sha256 and changed.record_id != first.record_id


def test_a_folder_spelled_another_way_is_the_same_seed(env, capsys) -> None:
    """mine, ./mine and its absolute path are one folder and one output: the seeds' key held
    the spelling, so `classify --dataset ./mine` trained again what `--dataset mine` had."""
    first = run_finetune(_cfg(env, "finetune.dataset=mine"), "mine").seeds[0]
    capsys.readouterr()
    for spelling in ("./mine", str(env.folder)):
        again = run_finetune(_cfg(env, f"finetune.dataset={spelling}"), spelling).seeds[0]
        assert "reported, not retrained" in capsys.readouterr().err
        assert again.record_id == first.record_id


def test_another_set_of_the_same_name_does_not_replace_the_results(env) -> None:
    """Sets are named by their folder: b/mine writes where ./mine did. It is refused, and the
    first set's results stay; the same folder, and its own output, are fine."""
    first = run_finetune(_cfg(env), "mine")
    other = make_set(env.tmp / "b" / "mine")
    with pytest.raises(DataError, match=r"holds the results of the folder .*would replace them"):
        run_finetune(_cfg(env), "b/mine")
    assert (first.output / "results.json").is_file()
    assert run_finetune(_cfg(env), "./mine").output == first.output
    elsewhere = run_finetune(_cfg(env, f"finetune.output={env.tmp / 'b-runs'}"), str(other))
    assert elsewhere.output != first.output


def _stop_at_seed(monkeypatch: pytest.MonkeyPatch, stop: int) -> None:
    """Fine-tuning stopped (Ctrl-C) as seed `stop` starts: the seeds before it are finished,
    and no results.json is written."""
    from tibnlp.training import finetune

    run_seed = finetune._run_seed

    def stopping(setup, cfg, seed, *args, **kwargs):
        if seed == stop:
            raise KeyboardInterrupt
        return run_seed(setup, cfg, seed, *args, **kwargs)

    monkeypatch.setattr(finetune, "_run_seed", stopping)


def test_a_stopped_runs_finished_seeds_are_not_taken_by_another_set(
    env, monkeypatch, capsys
) -> None:
    """results.json is written last: a run stopped after its first seed left none, and b/mine
    passed the check and reported (or, other data, retrained over) mine's finished seed. The
    seed's own record names its set; the same set resumes from it."""
    make_set(env.tmp / "b" / "mine")
    two = _cfg(env, "finetune.seeds=[1,2]")
    output = env.tmp / "runs" / "mine" / "textcnn-pieces(scratch)"
    with monkeypatch.context() as patch:
        _stop_at_seed(patch, 2)
        with pytest.raises(KeyboardInterrupt):
            run_finetune(two, "mine")
    record = output / "seed-1" / "seed_result.json"
    assert record.is_file() and not (output / "results.json").exists()
    kept = record.read_bytes()
    with pytest.raises(DataError, match=r"holds the results of the folder .*/mine; this run "):
        run_finetune(two, "b/mine")
    assert record.read_bytes() == kept and not (output / "seed-2").exists()
    capsys.readouterr()
    resumed = run_finetune(two, "mine")  # the same set goes on: seed 1 reported, 2 trained
    err = capsys.readouterr().err
    assert "seed 1: finished earlier" in err and "seed 2: finished earlier" not in err
    assert [s.seed for s in resumed.seeds] == [1, 2] and (output / "results.json").is_file()
    assert json.loads(record.read_bytes())["record_id"] == json.loads(kept)["record_id"]
    assert json.loads(record.read_bytes())["dataset_folder"] == str(env.folder.resolve())


def test_a_pipeline_stage_on_a_folder_set_reruns_when_a_file_changes(env) -> None:
    from tibnlp.pipeline.runner import run_pipeline
    from tibnlp.pipeline.spec import load_pipeline

    finetune = {
        "dataset": "mine",  # relative: from the current directory, where the stage runs
        "vocab": str(env.vocab),
        "encoder": "none",
        "epochs": 1,
        "embedding_size": 16,
        "cnn_channels": 8,
    }
    spec = env.tmp / "p.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "name": "own",
                "workdir": str(env.tmp / "work"),
                "config": {
                    "tracking": {"enabled": False},
                    "engine": {"threads": 1},
                    "finetune": finetune,
                },
                "stages": {"finetune": {"kind": "finetune"}},
            }
        )
    )
    said: list[str] = []
    assert run_pipeline(load_pipeline(spec), echo=said.append).ran == ["finetune"]
    assert run_pipeline(load_pipeline(spec), echo=said.append).skipped == ["finetune"]
    (env.folder / "labels.json").write_text(json.dumps(LABELS[::-1]), "utf-8")
    said.clear()
    result = run_pipeline(load_pipeline(spec), echo=said.append)
    assert result.ran == ["finetune"], said
    assert any("data changed since it ran: mine/labels.json" in line for line in said), said
    assert result.results["finetune"]["dataset"] == "mine"


def test_a_shipped_name_is_the_shipped_set_and_dot_slash_the_folder(env, capsys) -> None:
    """The rule: a bare shipped name means the shipped set even with a folder of that name
    here (said once), `./tusa` the folder; being named "tusa" does not make it TU_SA (no
    AdvTS for it)."""
    make_set(env.tmp / "tusa")
    assert not is_folder_dataset("tusa") and is_folder_dataset("./tusa")
    with pytest.raises(DataError):  # the shipped TU_SA is not in this test's data directory
        load_classification("tusa")
    assert "dataset 'tusa' is the shipped set; for the folder" in capsys.readouterr().err
    data = load_classification("./tusa")
    assert data.name == "tusa" and data.folder == str((env.tmp / "tusa").resolve())
    with pytest.raises(DataError, match="AdvTS has no adversarial set for 'tusa' \\(your own"):
        run_finetune(_cfg(env, "finetune.eval_also=[advts]"), "./tusa")


def test_the_folder_hash_is_the_data_hash_a_pipeline_stage_tags() -> None:
    """A standalone run tags `files_sha256`, a pipeline stage `config_hash` of the same files
    (tibnlp.pipeline.stages): one folder must get one data hash either way."""
    from tibnlp.data.folder_set import ABSENT, files_sha256
    from tibnlp.tracking.conventions import config_hash

    files = {"mine/train.jsonl": "ab" * 32, "mine/labels.json": ABSENT, "mine/ä.jsonl": "0" * 64}
    assert files_sha256(files) == config_hash(files)
    assert files_sha256(files) != files_sha256({**files, "mine/labels.json": "c" * 64})


# --- sets as users write them (QA): labels, ids, labels.json and dataset.yaml of other tools


def _relabel(folder: Path, label_of, split: str = "train", keep_label_id: bool = False) -> None:
    """Rewrite one split's records with `label_of(record, line)` as the label (its label_id
    dropped, as a user relabelling would, unless `keep_label_id`)."""
    rows = _records(folder / f"{split}.jsonl")
    drop = set() if keep_label_id else {"label_id"}
    relabelled = [
        {**{k: v for k, v in r.items() if k not in drop}, "label": label_of(r, line)}
        for line, r in enumerate(rows, 1)
    ]
    _write(folder / f"{split}.jsonl", relabelled)


def test_numeric_and_boolean_labels_are_class_names(env) -> None:
    """A number is its digits, written as a string or a JSON number (1.0 from pandas too), and
    without labels.json numbers sort as numbers: 2 before 10."""
    number = {name: n for name, n in zip(LABELS, (10, 2, 0), strict=True)}
    for split, form in (("train", int), ("validation", str), ("test", float)):
        _relabel(env.folder, lambda r, _, form=form: form(number[r["label"]]), split)
    (env.folder / "labels.json").unlink()
    data = load_classification("mine")
    assert data.labels == ["0", "2", "10"]
    first = _records(env.folder / "test.jsonl")[0]
    assert data.labels[data.splits["test"][0].label] == str(int(first["label"]))
    for split in ("train", "validation", "test"):
        _relabel(env.folder, lambda r, _: r["label"] in (10, "10"), split)  # was: "True"/"False"
    assert load_classification("mine").labels == ["false", "true"]
    # a label with two dashes is a name, not a number: was a ValueError traceback from int()
    for split in ("train", "validation", "test"):
        _relabel(env.folder, lambda r, line: ("1", "--1", "-2")[line % 3], split)
    assert load_classification("mine").labels == ["--1", "-2", "1"]


@pytest.mark.parametrize(
    "label, said",
    [
        (None, "the 'label' field is null, not a class name"),  # was: a class "None"
        (["Politics"], "is a JSON list"),  # was: a class "['Politics']"
        (" ", "the 'label' field is blank"),
        ("Politics ", "'Politics ' has spaces at its ends"),  # was: a class beside Politics
        (1.5, "the number 1.5"),
    ],
)
def test_a_label_that_is_no_class_name_names_its_line(env, label, said: str) -> None:
    (env.folder / "labels.json").unlink()
    _relabel(env.folder, lambda r, line: label if line == 4 else r["label"])
    with pytest.raises(DataError) as err:
        load_classification("mine")
    assert err.value.message.startswith("mine/train.jsonl:4: ")
    assert said in err.value.message


def test_labels_json_is_read_as_records_are(env) -> None:
    """A byte-order mark (Notepad), whole numbers, and Tibetan names in another Unicode
    normalisation than the records' are the records' classes; a bad entry names its id."""
    tibetan = "\u0f40\u0f73"  # U+0F73: NFC writes it as two vowel signs
    names = [tibetan, "2", "Education"]
    number = {"Politics": unicodedata.normalize("NFC", tibetan), "Economics": 2}
    for split in ("train", "validation", "test"):
        _relabel(env.folder, lambda r, _: number.get(r["label"], r["label"]), split)
    text = json.dumps([tibetan, 2, "Education"], ensure_ascii=False)
    (env.folder / "labels.json").write_bytes(("\ufeff" + text).encode("utf-8"))  # was: refused
    data = load_classification("mine")
    assert data.labels == [unicodedata.normalize("NFC", n) for n in names]
    assert {e.label for e in data.splits["train"]} == {0, 1, 2}
    (env.folder / "labels.json").write_text('["Politics", null, "Education"]', "utf-8")
    with pytest.raises(DataError, match=r"labels.json: label id 1 is null, not a class name"):
        load_classification("mine")


def test_ids_missing_null_or_numbered_per_split(env) -> None:
    """No id (or a null one): the record is named by its file and line, by the split's name
    where two split files share a name (train/data.jsonl, dev/data.jsonl: was "id 'data-1' is
    in both"). Ids numbered per split are two records under one id: the advice is to prefix
    them or leave them out, and leaving them out loads."""
    own = env.tmp / "layout"
    for split, sub in (("train", "train"), ("validation", "dev"), ("test", "test")):
        rows = _records(env.folder / f"{split}.jsonl")
        (own / sub).mkdir(parents=True)
        _write(own / sub / "data.jsonl", [{**r, "id": None} for r in rows])
    splits = {
        "train": "train/data.jsonl",
        "validation": "dev/data.jsonl",
        "test": "test/data.jsonl",
    }
    (own / "dataset.yaml").write_text(yaml.safe_dump({"splits": splits}), "utf-8")
    (own / "labels.json").write_text(json.dumps(LABELS), "utf-8")
    data = load_classification(str(own))
    assert data.splits["validation"][0].id == "validation:data.jsonl:1"

    for split in ("train", "validation", "test"):
        rows = _records(env.folder / f"{split}.jsonl")
        _write(env.folder / f"{split}.jsonl", [{**r, "id": i} for i, r in enumerate(rows)])
    with pytest.raises(DataError) as err:
        load_classification("mine")
    assert "id '0' is in both" in err.value.message and "two different texts" in err.value.message
    assert "leave the ids out" in (err.value.hint or "")
    for split in ("train", "validation", "test"):  # the advice, followed
        rows = _records(env.folder / f"{split}.jsonl")
        _write(
            env.folder / f"{split}.jsonl", [{k: v for k, v in r.items() if k != "id"} for r in rows]
        )
    assert load_classification("mine").splits["test"][0].id == "test.jsonl:1"


def test_a_record_without_an_id_is_no_duplicate_of_a_numbered_one(env) -> None:
    """Ids numbered from 0 (train-0, train-1...) with one left out: the record without one was
    named "train-3" after its line, the id of the next record, and the error called it a
    duplicated record to delete. Its name now holds the file's, and a clash says which."""
    rows = _records(env.folder / "train.jsonl")
    _write(
        env.folder / "train.jsonl", [r if i != 2 else {**r, "id": None} for i, r in enumerate(rows)]
    )
    data = load_classification("mine")
    assert [e.id for e in data.splits["train"][1:4]] == ["train-1", "train.jsonl:3", "train-3"]
    rows[5]["id"] = "train.jsonl:3"  # a user's id of that very form
    _write(
        env.folder / "train.jsonl", [r if i != 2 else {**r, "id": None} for i, r in enumerate(rows)]
    )
    with pytest.raises(DataError) as err:
        load_classification("mine")
    assert "train.jsonl:6: id 'train.jsonl:3' is also the name given to line 3" in err.value.message
    assert "give line 3 an id of its own" in (err.value.hint or "")
    rows[5]["id"] = "train-5"
    rows[1]["id"] = "train.jsonl:6"  # the user's id first, the line without one after it
    _write(
        env.folder / "train.jsonl", [r if i != 5 else {**r, "id": None} for i, r in enumerate(rows)]
    )
    with pytest.raises(DataError) as err:
        load_classification("mine")
    assert err.value.message.endswith(
        "train.jsonl:6: this record has no id, and the name it gets, 'train.jsonl:6', is the id "
        "of line 2"
    )
    assert "give line 6 an id of its own" in (err.value.hint or "")


def test_settings_and_record_errors_say_what_to_do(env) -> None:
    folder = env.folder
    (folder / "dataset.yaml").write_text("splits: {validation: test.jsonl, test: ./test.jsonl}\n")
    with pytest.raises(ConfigError, match=r"each split needs a file of its own"):
        load_classification("mine")  # was: one file read as two splits, "id ... in both"
    (folder / "dataset.yaml").write_text("splits: {train: a\n", "utf-8")
    with pytest.raises(ConfigError) as err:
        load_classification("mine")
    assert "dataset.yaml:2: invalid YAML" in err.value.message
    assert "text_field, label_field" in (err.value.hint or "")  # was: no hint
    (folder / "dataset.yaml").unlink()

    for split in ("train", "validation", "test"):
        rows = _records(folder / f"{split}.jsonl")
        _write(
            folder / f"{split}.jsonl", [{"sentence": r["text"], "label": r["label"]} for r in rows]
        )
    with pytest.raises(DataError) as err:
        load_classification("mine")
    assert "train.jsonl:1: the record has no 'text' field" in err.value.message
    assert "name your fields in mine/dataset.yaml" in (err.value.hint or "")
    (folder / "dataset.yaml").write_text("text_field: sentence\n", "utf-8")  # the advice
    assert len(load_classification("mine").splits["test"]) == len(rows)

    (folder / "train.jsonl").write_text(json.dumps(rows, ensure_ascii=False, indent=2), "utf-8")
    with pytest.raises(DataError) as err:  # a pandas / json.dump export, not JSON Lines
        load_classification("mine")
    assert "indented JSON, not JSON Lines" in (err.value.hint or "")


def test_merged_classes_with_a_stale_label_id_say_to_drop_it(env) -> None:
    merged = {"Politics": "Society", "Economics": "Society"}
    _relabel(env.folder, lambda r, _: merged.get(r["label"], r["label"]), keep_label_id=True)
    (env.folder / "labels.json").write_text(json.dumps(["Society", "Education"]), "utf-8")
    with pytest.raises(DataError) as err:
        load_classification("mine")
    assert "label 'Society' has label_id" in err.value.message
    assert "drop the label_id field" in (err.value.hint or "")


def test_classify_takes_the_set_from_a_config_file(env) -> None:
    """--dataset is needed only where nothing else names the set: -c FILE (or --set) may."""
    refused = CliRunner().invoke(app, ["finetune", "classify", "--encoder", "none"])
    assert refused.exit_code == 2 and "--dataset" in refused.output
    config = env.tmp / "mine.yaml"
    settings = [*tiny_textcnn(env.vocab, env.tmp / "runs", *ONE_EPOCH), "finetune.dataset=./mine"]
    nested: dict = {}
    for setting in settings:
        key, value = setting.split("=", 1)
        section, name = key.split(".", 1)
        node = nested.setdefault(section, {})
        *parents, leaf = name.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = yaml.safe_load(value)
    config.write_text(yaml.safe_dump(nested), "utf-8")
    done = CliRunner().invoke(app, ["finetune", "classify", "--encoder", "none", "-c", str(config)])
    assert done.exit_code == 0, done.output
    assert (env.tmp / "runs" / "mine" / "textcnn-pieces(scratch)" / "results.json").is_file()


def test_a_text_of_closing_marks_only_is_no_text_to_the_model(env, capsys) -> None:
    """A text of "།" passed the loader's blank check (the stored form), but the classifier
    reads the tsheg-trimmed form, without it: the item was scored on [CLS] [SEP] alone, and in
    train it trained on no input. Refused in test, left out of train with a warning, by line."""
    rows = _records(env.folder / "train.jsonl")
    _write(
        env.folder / "train.jsonl",
        [r if i != 4 else {**r, "text": "།"} for i, r in enumerate(rows)],
    )
    setup = prepare(_cfg(env), load_classification("mine"))
    said = " ".join(capsys.readouterr().err.split())
    assert "1 training record(s) with no text once read as the model reads it" in said
    assert "left out of training: mine/train.jsonl:5" in said
    assert len(setup.ids["train"]) == len(setup.data.splits["train"]) == len(rows) - 1
    rows = _records(env.folder / "test.jsonl")
    _write(
        env.folder / "test.jsonl",
        [r if i != 2 else {**r, "text": "༎ ་"} for i, r in enumerate(rows)],
    )
    with pytest.raises(DataError) as err:
        prepare(_cfg(env), load_classification("mine"))
    assert "1 test record(s) hold no text once read as the model reads it" in err.value.message
    assert err.value.message.endswith("mine/test.jsonl:3")
    assert "an evaluation item needs a text" in (err.value.hint or "")


def test_texts_the_vocabulary_knows_nothing_of_are_named(env, capsys) -> None:
    """A set of another script trained on [UNK] alone; the only sign was a seed "not
    learning", with advice about the learning rate. `tibnlp predict` named such texts."""
    rows = _records(env.folder / "train.jsonl")
    _write(
        env.folder / "train.jsonl",
        [r if i not in (1, 6) else {**r, "text": "hello world"} for i, r in enumerate(rows)],
    )
    prepare(_cfg(env), load_classification("mine"))
    said = " ".join(capsys.readouterr().err.split())
    assert f"2 of {len(rows)} train text(s) hold no piece the vocabulary knows" in said
    assert said.endswith("mine/train.jsonl:2, mine/train.jsonl:7")


def test_a_validation_split_copied_from_test_is_warned(env, capsys) -> None:
    """test.jsonl copied as validation.jsonl (without ids, as the loader's hint allows)
    trained without a word, though every epoch and recipe was then chosen on the test items.
    Said in the notes always (TNCC's published split has 8 such titles), warned of from half."""
    tests = _records(env.folder / "test.jsonl")
    own = (env.folder / "validation.jsonl").read_text("utf-8")
    _write(env.folder / "validation.jsonl", [{k: r[k] for k in ("text", "label")} for r in tests])
    result = run_finetune(_cfg(env), "mine")
    said = " ".join(capsys.readouterr().err.split())
    n = len(tests)
    assert f"{n} of {n} validation texts are also test texts" in said
    assert result.notes["validation_in_test"] == f"{n} of {n} validation texts also in test"
    (env.folder / "validation.jsonl").write_text(own, "utf-8")  # its own: noted, not warned
    result = run_finetune(_cfg(env, "finetune.output=runs2"), "mine")
    assert "are also test texts" not in capsys.readouterr().err
    assert result.notes["validation_in_test"].startswith("0 of ")


def test_a_run_that_waited_for_the_folder_checks_its_set_again(env, monkeypatch) -> None:
    """`--wait`: the set check ran before the folder was held, and the run waited for may
    leave another set's seeds there. The check is made again once the folder is held."""
    from tibnlp.training import finetune

    make_set(env.tmp / "b" / "mine")
    cfg = _cfg(env)
    run_finetune(cfg, "b/mine")  # what the run waited for leaves: b/mine's results
    output = env.tmp / "runs" / "mine" / "textcnn-pieces(scratch)"
    before = {p: p.stat().st_mtime_ns for p in output.rglob("*")}
    aside = output.rename(output.parent / "aside")  # not there yet at the first check
    held = finetune.held_output

    def waited(*args, **kwargs):
        aside.rename(output)  # ... and finished while this run waited
        return held(*args, **kwargs)

    monkeypatch.setattr(finetune, "held_output", waited)
    with pytest.raises(DataError, match=r"holds the results of the folder .*b/mine"):
        run_finetune(cfg, "mine")
    assert {p: p.stat().st_mtime_ns for p in output.rglob("*")} == before
