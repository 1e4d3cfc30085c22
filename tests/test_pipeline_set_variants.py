"""`tibnlp pipeline run FILE --set stages.S.variants.V.set.KEY=VALUE`: a variant sits in a YAML
list, which a dotted --set key could not index ("'stages.S.variants' is a value, not a
section"); V is its name or its position."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tibnlp.config.yaml_loader import read_yaml
from tibnlp.errors import ConfigError
from tibnlp.pipeline.planner import Planner
from tibnlp.pipeline.registry import register_stage
from tibnlp.pipeline.spec import load_pipeline


def _noop(ctx: Any) -> dict[str, Any]:
    return {}


register_stage("sv_vocab", _noop, ("vocab",))

VARIANTS = [
    {"name": "small", "set": {"vocab.vocab_size": 100}},
    {"set": {"vocab.vocab_size": 200}},  # unnamed: "vocab_size=200", by position 1
]


def _write(tmp_path: Path, stages: dict[str, Any]) -> Path:
    path = tmp_path / "p.yaml"
    body = {"name": "p", "workdir": str(tmp_path / "work"), "stages": stages}
    path.write_text(yaml.safe_dump(body, sort_keys=False), encoding="utf-8")
    return path


def _sizes(path: Path, *sets: str) -> dict[str, tuple[int, str]]:
    """Each node's vocab size in its planned config, and its content key."""
    steps = Planner(load_pipeline(path, sets)).plan()
    return {s.node.name: (s.config["vocab"]["vocab_size"], s.key) for s in steps}


def test_set_reaches_a_variant_by_name_or_position(tmp_path: Path) -> None:
    path = _write(tmp_path, {"v": {"kind": "sv_vocab", "variants": VARIANTS}})
    before = _sizes(path)
    assert [size for size, _ in before.values()] == [100, 200]
    by_name = _sizes(path, "stages.v.variants.small.set.vocab.vocab_size=150")
    assert by_name["v[small]"][0] == 150 and by_name["v[small]"][1] != before["v[small]"][1]
    assert by_name["v[vocab_size=200]"] == before["v[vocab_size=200]"]  # the other: as it was
    by_place = _sizes(path, "stages.v.variants.0.set.vocab.vocab_size=150")
    assert by_place == by_name
    # an unnamed variant's name is made from its values: it follows them
    assert (
        _sizes(path, "stages.v.variants.1.set.vocab.vocab_size=250")["v[vocab_size=250]"][0] == 250
    )
    # a name with dots is one name, as a grid key with dots is one key
    (tmp_path / "dotted").mkdir()
    one = [{**VARIANTS[0], "name": "v1.5"}]
    dotted = _write(tmp_path / "dotted", {"v": {"kind": "sv_vocab", "variants": one}})
    assert _sizes(dotted, "stages.v.variants.v1.5.set.vocab.vocab_size=150")["v[v1.5]"][0] == 150
    # a key the variant does not set yet is added to it; a mapping merges into the variant
    spec = load_pipeline(path, ["stages.v.variants.small={set: {vocab.seed: 3}}"])
    assert spec.stages[0].variants[0].overrides == {"vocab.vocab_size": 100, "vocab.seed": 3}
    assert (
        load_pipeline(path, ["stages.v.variants.small.name=tiny"]).stages[0].variants[0].name
        == "tiny"
    )


def test_set_of_a_variant_shared_by_an_alias_changes_that_stage_only(tmp_path: Path) -> None:
    """labels.yaml gives two stages one list (`variants: *lpft_variants`)."""
    path = tmp_path / "alias.yaml"
    path.write_text(
        f"name: alias\nworkdir: {tmp_path / 'work'}\nstages:\n"
        "  a: {kind: sv_vocab, variants: &both [{name: small, set: {vocab.vocab_size: 100}}]}\n"
        "  b: {kind: sv_vocab, variants: *both}\n",
        encoding="utf-8",
    )
    spec = load_pipeline(path, ["stages.a.variants.small.set.vocab.vocab_size=150"])
    assert [s.variants[0].overrides["vocab.vocab_size"] for s in spec.stages] == [150, 100]


@pytest.mark.parametrize(
    ("text", "said", "hint"),
    [
        (
            "stages.v.variants.big.set.vocab.vocab_size=1",
            "stage v has no variant 'big'",
            "its variants: small, 1 (unnamed); write --set stages.v.variants.NAME.set.KEY=VALUE",
        ),
        (
            "stages.v.variants.small.vocab.vocab_size=1",
            "a variant has the keys name and set, not 'vocab'",
            "--set stages.v.variants.small.set.vocab.vocab_size=VALUE",
        ),
        (
            "stages.g.variants.a.set.vocab.vocab_size=1",
            "stage g has no list of variants",
            "--set stages.g.grid.KEY=",
        ),
    ],
)
def test_set_of_a_variant_not_there_says_how_to_write_it(
    tmp_path: Path, text: str, said: str, hint: str
) -> None:
    stages = {
        "v": {"kind": "sv_vocab", "variants": VARIANTS},
        "g": {"kind": "sv_vocab", "grid": {"vocab.vocab_size": [1, 2]}},
    }
    path = _write(tmp_path, stages)
    with pytest.raises(ConfigError) as err:
        load_pipeline(path, [text])
    assert err.value.message == f"{path}: --set {text.split('=')[0]}: {said}"
    assert hint in str(err.value.hint)


def test_a_shared_set_a_variant_shadows_names_the_set_that_reaches_it(tmp_path: Path) -> None:
    stages = {
        "v": {"kind": "sv_vocab", "variants": VARIANTS},
        "g": {"kind": "sv_vocab", "grid": {"vocab.vocab_size": [1, 2]}},
    }
    notes = load_pipeline(_write(tmp_path, stages), ["vocab.vocab_size=7"]).notes
    assert notes == [
        "--set vocab.vocab_size does not reach stage v: its variants (small, vocab_size=200) "
        "set it (for them: --set stages.v.variants.NAME.set.vocab.vocab_size=...)",
        "--set vocab.vocab_size does not reach stage g: its variants (vocab_size=1, "
        "vocab_size=2) set it (for them: --set stages.g.grid.vocab.vocab_size='[...]')",
    ]


def test_set_reaches_a_variant_of_a_shipped_pipeline() -> None:
    """labels.yaml: `encoder` and `twin` share their variants through a YAML alias; a --set of
    one stage's variant leaves the other's."""
    path = Path(__file__).resolve().parents[1] / "pipelines" / "labels.yaml"
    spec = load_pipeline(path, ["stages.encoder.variants.n371.set.finetune.epochs=5"])
    epochs = {s.name: s.variants[0].overrides["finetune.epochs"] for s in spec.stages[:2]}
    assert epochs == {"encoder": 5, "twin": 60}


def test_set_of_a_config_shared_by_an_alias_changes_that_stage_only(tmp_path: Path) -> None:
    """A YAML alias gives two stages one config mapping: a --set naming one stage must not
    reach the other (read_yaml unshares what an alias shares)."""
    path = tmp_path / "alias.yaml"
    path.write_text(
        f"name: alias\nworkdir: {tmp_path / 'work'}\nstages:\n"
        "  a: {kind: sv_vocab, config: &both {vocab: {vocab_size: 100}}}\n"
        "  b: {kind: sv_vocab, config: *both}\n",
        encoding="utf-8",
    )
    spec = load_pipeline(path, ["stages.a.config.vocab.vocab_size=150"])
    assert [s.config["vocab"]["vocab_size"] for s in spec.stages] == [150, 100]


def test_an_alias_to_a_mapping_that_holds_it_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "loop.yaml"
    path.write_text("a: &loop {b: *loop}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"loop\.yaml: an alias refers to a mapping"):
        read_yaml(path)
