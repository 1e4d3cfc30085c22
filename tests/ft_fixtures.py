"""Tiny synthetic Tibetan task, data directory and SentencePiece vocabulary for fine-tuning tests.

Classes are told apart by their syllables, so a tiny model learns them in a few steps; the
data directory has the layout and manifest file names of the real one (tncc/, advts/).
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from types import SimpleNamespace

import sentencepiece as spm

from tibnlp.text.spm_units import SYLLABLE_RULES
from tibnlp.text.vocab import MARKER

LABELS = ["Politics", "Economics", "Education"]
CLASS_SYLLABLES = [
    ["རྒྱལ", "ཁབ", "སྲིད", "བློན"],
    ["དཔལ", "འབྱོར", "ཚོང", "དངུལ"],
    ["སློབ", "གྲྭ", "དགེ", "རྒན"],
]
COMMON = ["གི", "ལ", "དང", "ནི", "བོད", "ཀྱི"]


def make_title(label: int, rng: random.Random) -> str:
    """Space-separated syllables without tsheg: the TNCC title form."""
    n = rng.randint(3, 8)
    sylls = [rng.choice(CLASS_SYLLABLES[label] if rng.random() < 0.8 else COMMON) for _ in range(n)]
    return " ".join(sylls)


def write_split(path: Path, n: int, seed: int, prefix: str) -> list[dict]:
    rng = random.Random(seed)
    records = []
    for i in range(n):
        label = i % len(LABELS)
        text = make_title(label, rng)
        rid = f"{prefix}-{i}"
        records.append({"id": rid, "label": LABELS[label], "label_id": label, "text": text})
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), "utf-8")
    return records


def make_data_dir(root: Path, sizes: tuple[int, int, int] = (90, 30, 30)) -> Path:
    tncc = root / "tncc"
    tncc.mkdir(parents=True)
    (tncc / "labels.json").write_text(json.dumps({"labels": LABELS}), "utf-8")
    train = write_split(tncc / "tncc_title_train.jsonl", sizes[0], 1, "train")
    write_split(tncc / "tncc_title_validation.jsonl", sizes[1], 2, "validation")
    test = write_split(tncc / "tncc_title_test.jsonl", sizes[2], 3, "test")
    # one test title that also occurs in train: the leakage split must drop exactly it
    test[0] = {**test[0], "text": train[0]["text"], "label": train[0]["label"]}
    test[0]["label_id"] = train[0]["label_id"]
    (tncc / "tncc_title_test.jsonl").write_text(
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in test), "utf-8"
    )
    advts = root / "advts"
    advts.mkdir()
    (advts / "labels.json").write_text(
        json.dumps({"advts_tncc_title": {"labels": LABELS}}), "utf-8"
    )
    adv = [
        {
            "id": f"advts-{i}",
            "label": r["label"],
            "text": r["text"].replace(" ", "\u0f0b") + "\u0f0bཀ",
            "orig_text": r["text"].replace(" ", "\u0f0b"),
        }
        for i, r in enumerate(test[:12])
    ]
    (advts / "advts_tncc_title.jsonl").write_text(
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in adv), "utf-8"
    )
    return root


def make_word_segmented_set(root: Path) -> Path:
    """The TNCC splits of `make_data_dir` in the word-segmented form of shajiu_news_culture
    (its manifest's folder and file names): words separated by spaces, tsheg kept, and a
    particle split off its syllable ("... རྒན འི" for "... རྒནའི")."""
    folder = root / "shajiu_news_culture"
    folder.mkdir(parents=True)
    (folder / "labels.json").write_text(json.dumps({"labels": LABELS}), "utf-8")
    for split in ("train", "validation", "test"):
        lines = (root / "tncc" / f"tncc_title_{split}.jsonl").read_text("utf-8").splitlines()
        records = [json.loads(line) for line in lines]
        for r in records:
            r["text"] = r["text"].replace(" ", "\u0f0b ") + " འི"
        (folder / f"shajiu_news_culture_{split}.jsonl").write_text(
            "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), "utf-8"
        )
    return root


def make_vocab(directory: Path, size: int = 60) -> Path:
    """A tiny `tibnlp.text.vocab.Vocabulary` directory trained the way `vocab build` trains
    (ids 0-4 = [PAD] [UNK] [CLS] [SEP] [MASK], tsheg as the syllable boundary)."""
    directory.mkdir(parents=True, exist_ok=True)
    rules = directory.parent / f"{directory.name}-rules.tsv"
    rules.write_text("".join(f"{k}\t{v}\n" for k, v in SYLLABLE_RULES.items()))
    rng = random.Random(0)
    lines = [make_title(i % len(LABELS), rng).replace(" ", "\u0f0b") for i in range(400)]
    text = directory.parent / f"{directory.name}-train.txt"
    text.write_text("\n".join(lines) + "\n", "utf-8")
    spm.SentencePieceTrainer.train(
        input=str(text),
        model_prefix=str(directory / "spm"),
        vocab_size=size,
        model_type="unigram",
        normalization_rule_tsv=str(rules),
        pad_id=0,
        pad_piece="[PAD]",
        unk_id=1,
        unk_piece="[UNK]",
        bos_id=-1,
        eos_id=-1,
        control_symbols=["[CLS]", "[SEP]", "[MASK]"],
        hard_vocab_limit=False,
        minloglevel=2,
    )
    (directory / MARKER).write_text(json.dumps({"kind": "vocabulary", "version": 1}))
    return directory


TINY_MODEL = [
    "model.embedding_size=8",
    "model.hidden_size=16",
    "model.num_layers=1",
    "model.ffn_size=32",
    "model.max_len=64",
    "model.heads.small=2",
    "model.heads.large=2",
]


def make_model_dir(root: Path, vocab: Path, vocab_size: int | None = None) -> Path:
    """A model directory as pretraining writes it: weights + model.yaml + vocabulary files."""
    from tibnlp.config import load_config
    from tibnlp.models.encoder import Encoder
    from tibnlp.models.io import save_pretrained
    from tibnlp.text.vocab import Vocabulary

    cfg = load_config(None, TINY_MODEL).model
    cfg.vocab_size = vocab_size or Vocabulary.load(vocab).size
    out = root / f"pretrained-{cfg.vocab_size}"
    save_pretrained(Encoder(cfg), cfg, out)
    for f in vocab.iterdir():
        shutil.copy2(f, out / f.name)
    return out


def pretrained_env(tmp_path: Path, monkeypatch) -> SimpleNamespace:
    """The tiny data directory (set as TIBNLP_DATA), a vocabulary and a model directory on it:
    what a test of fine-tuning a pretrained model starts from (`tmp`, `vocab`, `model`)."""
    monkeypatch.setenv("TIBNLP_DATA", str(make_data_dir(tmp_path / "data")))
    vocab = make_vocab(tmp_path / "vocab")
    return SimpleNamespace(tmp=tmp_path, vocab=vocab, model=make_model_dir(tmp_path, vocab))


def tiny_textcnn(vocab: Path, output: Path, *extra: str) -> list[str]:
    """Config overrides of a tiny TextCNN fine-tuning (2 epochs, no tracking)."""
    return [
        f"finetune.vocab={vocab}",
        f"finetune.output={output}",
        "finetune.encoder=none",
        "finetune.epochs=2",
        "finetune.embedding_size=16",
        "finetune.cnn_channels=8",
        "finetune.optimizer.lr=0.01",
        "tracking.enabled=false",
        *extra,
    ]


def trained_textcnn(tmp: Path) -> Path:
    """A tiny TextCNN classifier folder fine-tuned on the synthetic task under `tmp` (the data
    directory is set only while it trains): what `predict` tests read."""
    import pytest

    from tibnlp.config import load_config
    from tibnlp.training.finetune import run_finetune

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TIBNLP_DATA", str(make_data_dir(tmp / "data")))
        cfg = load_config(None, tiny_textcnn(make_vocab(tmp / "vocab"), tmp / "runs"))
        return run_finetune(cfg, "tncc").seeds[0].directory
