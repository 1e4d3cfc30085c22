"""A YAML file whose aliases nest ("billion laughs": `b: [*a, *a, ...]`, `c: [*b, *b, ...]`)
is a few hundred bytes that `read_yaml`, copying out what aliases share, would expand to
billions of values: it is refused as the copy grows, naming the file, whether it is a config,
a pipeline or a downloaded classifier's `classifier.yaml`."""

from __future__ import annotations

from pathlib import Path

import pytest

from tibnlp.config.yaml_loader import read_yaml
from tibnlp.errors import ConfigError, DataError
from tibnlp.models.classifier_io import META_FILE, read_meta


def _laughs(levels: int = 9) -> str:
    """Ten of each alias per level: 10**levels values once expanded."""
    lines = ["l0: &l0 [x, x, x, x, x, x, x, x, x, x]"]
    for level in range(1, levels):
        refs = ", ".join([f"*l{level - 1}"] * 10)
        lines.append(f"l{level}: &l{level} [{refs}]")
    return "\n".join(lines) + "\n"


def test_nested_aliases_are_refused_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "laughs.yaml"
    path.write_text(_laughs(), encoding="utf-8")
    assert path.stat().st_size < 1000
    with pytest.raises(ConfigError, match=r"laughs\.yaml: its aliases expand too far"):
        read_yaml(path)


def test_nested_aliases_in_a_classifier_folder_are_refused(tmp_path: Path) -> None:
    """`tibnlp predict` reads the classifier.yaml of a folder that may have been downloaded."""
    (tmp_path / META_FILE).write_text(_laughs(), encoding="utf-8")
    with pytest.raises(DataError, match=r"classifier\.yaml: damaged.*aliases expand too far"):
        read_meta(tmp_path)


def test_a_shared_section_and_a_long_file_stay_readable(tmp_path: Path) -> None:
    """An alias for a config shared by stages is copied out, each stage its own; a long file
    without aliases (many labels) is not held to the fixed limit."""
    path = tmp_path / "shared.yaml"
    path.write_text(
        "common: &common {vocab: {vocab_size: 100}}\n"
        "stages:\n  - {name: a, config: *common}\n  - {name: b, config: *common}\n",
        encoding="utf-8",
    )
    stages = read_yaml(path)["stages"]
    assert stages[0]["config"] == stages[1]["config"] == {"vocab": {"vocab_size": 100}}
    assert stages[0]["config"] is not stages[1]["config"]
    labels = tmp_path / "labels.yaml"
    labels.write_text("labels:\n" + "".join(f"  - l{i}\n" for i in range(150_000)))
    assert len(read_yaml(labels)["labels"]) == 150_000
