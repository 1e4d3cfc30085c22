"""What counts as the same finished fine-tuning seed: a rerun reports a seed (not trains it
again) when its training is the same, however the command spelled the set it read."""

from __future__ import annotations

import json
import random
import zipfile
from pathlib import Path

from typer.testing import CliRunner

from tests.ft_fixtures import LABELS, make_title
from tests.test_finetune import _cfg, cfg_flags, env  # noqa: F401  (the fixture)
from tibnlp.cli.main import app
from tibnlp.evaluation.result_loader import RESULTS_JSON
from tibnlp.training import finetune as ft_mod
from tibnlp.training import finetune_seeds as seeds_mod
from tibnlp.training.finetune import FinetuneResult, run_finetune
from tibnlp.training.finetune_seeds import SEED_FILE
from tibnlp.training.finetune_setup import ids_sha256


def _stamp(directory: Path) -> int:
    """When the seed's classifier was last written: unchanged when a rerun reports it."""
    return (directory / "model.safetensors").stat().st_mtime_ns


def test_a_config_naming_another_set_keys_its_seeds_by_the_set_read(env) -> None:  # noqa: F811
    """`finetune tncc -c FILE` whose file named another set read TNCC, but its seeds'
    fingerprint held the file's set: the same seeds under the plain command trained again."""
    named_other = _cfg(env, "finetune.epochs=1", "finetune.dataset=tusa")
    directory = run_finetune(named_other, "tncc").seeds[0].directory
    stamp = _stamp(directory)
    again = run_finetune(_cfg(env, "finetune.epochs=1"), "tncc")
    assert _stamp(directory) == stamp  # reported, not retrained
    assert again.seeds[0].directory == directory


def _documents(data_dir: Path) -> None:
    """TNCC's document task as the FudanNLP zip: 16/2/2 documents once cut 8:1:1."""
    rng = random.Random(0)
    lines = [f"{LABELS[i % 3]}\t{make_title(i % 3, rng)}" for i in range(20)]
    (data_dir / "tncc_document").mkdir()
    archive = data_dir / "tncc_document" / "Tibetan News Classification Corpus.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("document-tibetan.txt", "\n".join(lines) + "\n")


def test_the_document_set_under_either_name_is_one_seed(env) -> None:  # noqa: F811
    """`classify --dataset tncc_document` (with task document, or the title default, which
    reads the documents too) writes where `tncc --task document` does: its seeds were keyed
    by the other spelling, so alternating the two commands trained the seeds every time."""
    from tibnlp.cli import finetune as cli

    _documents(env.tmp / "data")
    flags = cfg_flags(env, "finetune.epochs=1")
    cli.tncc(task="document", set_=flags)
    directory = env.tmp / "runs" / "tncc-document" / "textcnn-pieces(scratch)" / "seed-1"
    stamp = _stamp(directory)
    cli.classify(dataset="tncc_document", set_=[*flags, "finetune.task=document"])
    cli.classify(dataset="tncc_document", set_=flags)
    assert _stamp(directory) == stamp  # reported, not retrained
    saved = json.loads((directory.parent / "results.json").read_text("utf-8"))
    assert saved["dataset"] == "tncc-document"


def test_an_added_extra_set_scores_the_finished_seeds_not_trains_them(env, capsys) -> None:  # noqa: F811
    """`--eval-also advts` added to a finished run trained every seed again: the extra test
    set was part of the seeds' key. It scores their saved classifiers, updates their records
    and the run's results; without it again, the seeds report the parts every seed has."""
    plain = ("finetune.epochs=1", "finetune.seeds=[1,2]")
    first = run_finetune(_cfg(env, *plain), "tncc")
    stamps = [_stamp(s.directory) for s in first.seeds]
    capsys.readouterr()
    scored = run_finetune(_cfg(env, *plain, "finetune.eval_also=[advts]"), "tncc")
    said = capsys.readouterr().err
    assert said.count("reported, not retrained; scored on advts from its saved classifier") == 2
    assert [_stamp(s.directory) for s in scored.seeds] == stamps
    # as a run scored on AdvTS from the start scores the same classifiers
    fresh = _cfg(env, *plain, "finetune.eval_also=[advts]", f"finetune.output={env.tmp / 'b'}")
    whole = run_finetune(fresh, "tncc")
    for seed, same in zip(scored.seeds, whole.seeds, strict=True):
        assert seed.metrics["advts"].count == 12
        for part in ("advts", "advts_original", "test"):
            assert seed.metrics[part].predictions == same.metrics[part].predictions
        record = json.loads((seed.directory / SEED_FILE).read_text("utf-8"))
        assert record["metrics"]["advts"]["predictions"] == seed.metrics["advts"].predictions
    saved = json.loads((scored.output / RESULTS_JSON).read_text("utf-8"))
    assert saved["aggregate"]["advts"] == whole_aggregate(whole)
    shown = CliRunner().invoke(app, ["finetune", "report", str(scored.output)])
    assert shown.exit_code == 0 and "AdvTS adv" in shown.output
    # without it: reported again, AdvTS left out of this run's result (not of the records)
    plain_again = run_finetune(_cfg(env, *plain), "tncc")
    assert [_stamp(s.directory) for s in plain_again.seeds] == stamps
    assert "advts" not in plain_again.aggregate
    assert "advts" not in json.loads((scored.output / RESULTS_JSON).read_text("utf-8"))["aggregate"]
    record = json.loads((first.seeds[0].directory / SEED_FILE).read_text("utf-8"))
    assert "advts" in record["metrics"]
    capsys.readouterr()
    run_finetune(_cfg(env, *plain, "finetune.eval_also=[advts]"), "tncc")
    assert "scored on advts" not in capsys.readouterr().err  # kept from before


def whole_aggregate(result: FinetuneResult) -> dict:
    """A result's AdvTS aggregate as results.json writes it."""
    return {k: {"mean": m, "std": s} for k, (m, s) in result.aggregate["advts"].items()}


def test_an_extra_set_without_the_classifier_to_score_trains_the_seed(env, capsys) -> None:  # noqa: F811
    """A finished seed whose classifier is gone cannot be scored on an added set: it is
    trained again, saying why."""
    directory = run_finetune(_cfg(env, "finetune.epochs=1"), "tncc").seeds[0].directory
    (directory / "model.safetensors").unlink()
    capsys.readouterr()
    again = run_finetune(_cfg(env, "finetune.epochs=1", "finetune.eval_also=[advts]"), "tncc")
    assert "has no scores on the --eval-also set" in capsys.readouterr().err
    assert (directory / "model.safetensors").is_file()
    assert again.seeds[0].metrics["advts"].count == 12


def test_a_seed_recorded_with_advts_in_its_key_is_reported(env) -> None:  # noqa: F811
    """Records written while AdvTS was part of the seeds' key (its flag and eval_also in the
    fingerprint, its items in the data hash) keep their seeds under the same command."""
    cfg = _cfg(env, "finetune.epochs=1", "finetune.eval_also=[advts]")
    directory = run_finetune(cfg, "tncc").seeds[0].directory
    stamp = _stamp(directory)
    setup = ft_mod.prepare(cfg, ft_mod.load_classification("tncc", "title"))
    advts = ft_mod._advts(setup, ["advts"])
    assert advts is not None
    path = directory / SEED_FILE
    record = json.loads(path.read_text("utf-8"))
    current = record.pop("eval_sha256")
    record["fingerprint"] = seeds_mod.seed_fingerprint(setup, cfg, 1, True)
    record["data_sha256"] = ids_sha256(seeds_mod._advts_parts(setup, advts), setup.data_sha256)
    path.write_text(json.dumps(record), "utf-8")
    run_finetune(cfg, "tncc")
    assert _stamp(directory) == stamp
    upgraded = json.loads(path.read_text("utf-8"))
    assert upgraded["eval_sha256"] == current and upgraded["data_sha256"] == setup.data_sha256
