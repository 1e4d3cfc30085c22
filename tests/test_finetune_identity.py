"""What counts as the same finished fine-tuning seed: a rerun reports a seed (not trains it
again) when its training is the same, however the command spelled the set it read."""

from __future__ import annotations

import json
import random
import zipfile
from pathlib import Path

from tests.ft_fixtures import LABELS, make_title
from tests.test_finetune import _cfg, cfg_flags, env  # noqa: F401  (the fixture)
from tibnlp.training.finetune import run_finetune


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
