"""Bad corpus, vocabulary and checkpoint inputs: a clear DataError naming the file and what to
do, before anything is written (no `datasets`/sentencepiece traceback, no half-made output)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from tibetan_fixtures import TINY_MODEL, prepared_inputs
from typer.testing import CliRunner

from tibnlp.cli.main import app
from tibnlp.config import CorpusConfig, load_config
from tibnlp.errors import DataError, TibnlpError
from tibnlp.text.prepare import load_prepared, prepare_corpus
from tibnlp.text.vocab import Vocabulary

S = "བཀྲ་ཤིས་བདེ་ལེགས། ཁྱེད་རང་སྐུ་གཟུགས་བདེ་པོ་ཡིན་པས།"
TINY = {
    "model": TINY_MODEL,
    "pretrain": {"seq_len": 48, "batch_size": 8, "max_steps": 2},
    "engine": {"threads": 1},
}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """root/corpus (50 train, 10 held-out documents) and root/vocab."""
    return prepared_inputs(tmp_path_factory.mktemp("bad_inputs"), n_docs=60, heldout=10)


def _with_split_emptied(inputs: Path, path: Path, split: str) -> Path:
    """A copy of the corpus whose `split` holds no document (saved as `prepare` saves one)."""
    import datasets

    corpus = load_prepared(inputs / "corpus")
    empty = corpus[split].select([])
    dd = datasets.DatasetDict({**corpus, split: empty})
    dd.save_to_disk(str(path / "dataset"), num_shards={s: 1 for s in dd})
    for name in ("tibnlp-corpus.json", "report.json"):
        shutil.copy(inputs / "corpus" / name, path / name)
    return path


def _prepare(tmp_path: Path, name: str, text: str, **cfg: Any) -> Path:
    source = tmp_path / name
    source.write_text(text, encoding="utf-8")
    out = tmp_path / "out"
    prepare_corpus([source], out, CorpusConfig(num_proc=1, **cfg), progress=False)
    return out


def _pretrain_config(inputs: Path, corpus: Path, out: Path, **pretrain: Any) -> Any:
    data = {k: dict(v) for k, v in TINY.items()}
    data["pretrain"].update(corpus=str(corpus), vocab=str(inputs / "vocab"), output=str(out))
    data["pretrain"].update(pretrain)
    data["tracking"] = {"uri": f"sqlite:///{out.parent / 'mlflow.db'}"}
    path = out.parent / "pt.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_config(path)


# --- 1. empty splits ---------------------------------------------------------------------


def test_one_document_with_a_held_out_fraction_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A .txt without blank lines is one document: it got 0 held-out documents in silence.
    It still trains (pretraining runs without held-out scores), with a warning saying why."""
    out = _prepare(tmp_path, "one.txt", f"{S}\n{S}ཀ\n{S}ཁ\n", heldout_fraction=0.1)
    said = " ".join(capsys.readouterr().err.split())
    assert "one.txt: no document for the held-out split" in said
    assert "1 document(s)" in said and "blank line" in said
    assert "corpus.heldout_fraction=0" in said
    corpus = load_prepared(out)
    assert len(corpus["heldout"]) == 0 and len(corpus["train"]) == 1
    # asked for none: no warning
    (tmp_path / "none").mkdir()
    _prepare(tmp_path / "none", "one.txt", f"{S}\n", heldout_fraction=0.0)
    assert "held-out" not in capsys.readouterr().err


def test_every_document_held_out_is_refused(tmp_path: Path) -> None:
    """Two JSONL records at heldout_fraction 0.9: an empty train split, exit 0."""
    text = "".join(json.dumps({"text": f"{S}{c}"}) + "\n" for c in "ཀཁ")
    with pytest.raises(DataError, match=r"two\.jsonl: all 2 document\(s\) went to the held-out"):
        _prepare(tmp_path, "two.jsonl", text, heldout_fraction=0.9)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["two.jsonl"]


def test_pretraining_data_of_a_corpus_without_held_out_split_loads(
    inputs: Path, tmp_path: Path
) -> None:
    """heldout_fraction 0: the empty held-out split was saved as no shard, and the loader
    failed on it with an IndexError (after config.yaml and data/ were written)."""
    from tibnlp.data.pretraining import build_pretraining_dataset, load_pretraining_dataset

    corpus = _with_split_emptied(inputs, tmp_path / "corpus", "heldout")
    vocab = Vocabulary.load(inputs / "vocab")
    data = build_pretraining_dataset(corpus, vocab, 48, tmp_path / "data", num_proc=1)
    splits, meta = load_pretraining_dataset(data)
    assert len(splits["heldout"]) == 0 and len(splits["train"]) == meta["counts"]["train"] > 0
    shutil.rmtree(data / "dataset" / "train")  # a damaged cache: say to delete it
    with pytest.raises(DataError, match=rf"delete {data}"):
        load_pretraining_dataset(data)


@pytest.mark.slow
def test_words_of_a_corpus_without_held_out_split_load(inputs: Path, tmp_path: Path) -> None:
    """`corpus words` saved the empty held-out split as no shard: whole-word pretraining then
    failed on it with an IndexError."""
    from tibnlp.text.corpus_words import load_words, segment_corpus
    from tibnlp.text.words import require_pack

    try:
        pack = require_pack()
    except DataError as exc:
        pytest.skip(f"needs the botok dialect pack: {exc}")
    corpus = _with_split_emptied(inputs, tmp_path / "corpus", "heldout")
    segment_corpus(corpus, 1, pack=pack, cache=tmp_path / "cache", progress=None)
    words, _ = load_words(corpus, load_prepared(corpus))
    assert len(words["heldout"]) == 0 and len(words["train"]) == 50


def _tiny_model(inputs: Path, out: Path) -> Path:
    """A saved model of TINY's shape on the fixture's vocabulary (what --eval-only scores)."""
    from tibnlp.config.model import ModelConfig
    from tibnlp.models import AlbertForPretraining, save_pretrained

    vocab = Vocabulary.load(inputs / "vocab")
    shape = [f"model.{k}={v}" for k, v in TINY["model"].items() if k != "heads"]
    heads = ["model.heads.small=4", "model.heads.large=4"]  # fixed heads: no length rule
    cfg = load_config(None, [*shape, *heads]).model
    cfg = ModelConfig(**{**cfg.__dict__, "vocab_size": vocab.size})
    save_pretrained(AlbertForPretraining(cfg), cfg, out)
    for f in (inputs / "vocab").iterdir():
        shutil.copy2(f, out / f.name)
    return out


@pytest.mark.parametrize("eval_only", [False, True])
def test_pretrain_refuses_an_empty_split_before_writing(
    inputs: Path, tmp_path: Path, eval_only: bool
) -> None:
    from tibnlp.training.pretrain import run_pretraining

    split = "heldout" if eval_only else "train"
    corpus = _with_split_emptied(inputs, tmp_path / "corpus", split)
    out = tmp_path / "run"
    extra = {"init_from": str(_tiny_model(inputs, tmp_path / "model"))} if eval_only else {}
    cfg = _pretrain_config(inputs, corpus, out, **extra)
    expected = "no held-out documents" if eval_only else "no training documents"
    with pytest.raises(DataError, match=expected):
        run_pretraining(cfg, eval_only=eval_only)
    assert not out.exists()


def test_vocab_build_warns_of_a_corpus_without_held_out_split(inputs: Path, tmp_path: Path) -> None:
    corpus = _with_split_emptied(inputs, tmp_path / "corpus", "heldout")
    args = ["vocab", "build", "--corpus", str(corpus), "--output", str(tmp_path / "v")]
    res = CliRunner().invoke(app, [*args, "--vocab-size", "150"])
    assert res.exit_code == 0, res.output
    said = " ".join(res.output.split())
    assert "has no held-out documents" in said and "corpus.heldout_fraction > 0" in said


# --- 2. a damaged prepared corpus --------------------------------------------------------


@pytest.mark.parametrize("removed", ["dataset", "dataset/train"])
def test_damaged_prepared_corpus_says_prepare_it_again(
    inputs: Path, tmp_path: Path, removed: str
) -> None:
    corpus = tmp_path / "cb4"
    shutil.copytree(inputs / "corpus", corpus)
    shutil.rmtree(corpus / removed)
    with pytest.raises(DataError, match=rf"prepared corpus {corpus} is incomplete") as info:
        load_prepared(corpus)
    assert "prepare it again" in str(info.value.hint)
    vocab_build = ["vocab", "build", "--corpus", str(corpus), "--output", str(tmp_path / "v")]
    for args in (["corpus", "words", str(corpus)], vocab_build):
        res = CliRunner().invoke(app, args)
        # a DataError, which `tibnlp` prints as a message with exit code 2 (no traceback)
        assert isinstance(res.exception, DataError), res.exception
        assert not (tmp_path / "v").exists()


# --- 3. a damaged vocabulary ---------------------------------------------------------------


def test_truncated_spm_model_names_the_file(inputs: Path, tmp_path: Path) -> None:
    vocab = tmp_path / "vx2"
    shutil.copytree(inputs / "vocab", vocab)
    (vocab / "spm.model").write_bytes((inputs / "vocab" / "spm.model").read_bytes()[:100])
    with pytest.raises(DataError, match=rf"{vocab / 'spm.model'}: not a readable SentencePiece"):
        Vocabulary.load(vocab)


def test_a_file_given_as_vocabulary_is_named_as_a_file(tmp_path: Path) -> None:
    good = tmp_path / "good.txt"
    good.write_text("x")
    with pytest.raises(DataError, match=r"good\.txt is a file, not a vocabulary folder"):
        Vocabulary.load(good)
    with pytest.raises(DataError, match=r"vocabulary folder .*nope does not exist"):
        Vocabulary.load(tmp_path / "nope")


def test_the_commands_name_a_file_given_for_a_vocabulary_folder(
    inputs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """finetune --vocab FILE (its own folder check said "does not exist") and vocab build
    --output FILE (an OS error before): the file is named, nothing runs."""
    afile = tmp_path / "afile"
    afile.write_text("x")
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    args = ["finetune", "tncc", "--encoder", "none", "--head", "cnn", "--vocab", str(afile)]
    result = runner.invoke(app, args)
    assert isinstance(result.exception, DataError)  # main() prints it and exits 2
    assert "is a file, not a vocabulary folder" in str(result.exception)
    result = runner.invoke(
        app, ["vocab", "build", "--corpus", str(inputs / "corpus"), "--output", str(afile)]
    )
    assert isinstance(result.exception, DataError)
    assert "is a file; give a folder path" in str(result.exception)
    assert afile.read_text() == "x"


# --- 4. --resume with nothing to resume ----------------------------------------------------


def test_resume_without_checkpoint_writes_nothing(inputs: Path, tmp_path: Path) -> None:
    """It tokenised the corpus and wrote config.yaml and data/ before refusing."""
    from tibnlp.training.pretrain import run_pretraining

    out = tmp_path / "pt_new"
    cfg = _pretrain_config(inputs, inputs / "corpus", out)
    with pytest.raises(TibnlpError, match="--resume: no complete checkpoint"):
        run_pretraining(cfg, resume=True)
    assert not out.exists()


def test_fresh_start_over_checkpoints_leaves_the_earlier_config(
    inputs: Path, tmp_path: Path
) -> None:
    from tibnlp.training.pretrain import run_pretraining

    out = tmp_path / "pt_old"
    (out / "checkpoints" / "step00000002").mkdir(parents=True)
    (out / "checkpoints" / "latest").write_text("step00000002\n")
    (out / "config.yaml").write_text("earlier: run\n")
    cfg = _pretrain_config(inputs, inputs / "corpus", out)
    with pytest.raises(TibnlpError, match="already holds checkpoints"):
        run_pretraining(cfg)
    assert (out / "config.yaml").read_text() == "earlier: run\n"
    assert not (out / "data").exists()


def test_ctrl_c_in_pretrain_says_how_to_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An interrupted run keeps its checkpoints; the command says so and exits 130 (the
    shell's code for SIGINT), not with Click's bare "Aborted!"."""
    import tibnlp.training.pretrain as pretrain

    def interrupted(*args: Any, **kwargs: Any) -> Path:
        raise KeyboardInterrupt

    monkeypatch.setattr(pretrain, "run_pretraining", interrupted)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["pretrain", "-s", "pretrain.output=out"])
    assert result.exit_code == 130
    said = " ".join(result.output.split())  # the console wraps long lines
    assert "checkpoints in out/checkpoints stay" in said and "with --resume" in said
