"""The fine-tuned classifier directory: everything `predict` needs, and nothing else.

    classifier.yaml      encoder kind + its config, head config, labels, max_len, text form,
                         the vocabulary's sha256, where it came from and the fields of
                         its dataset's records
    model.safetensors    weights
    spm.model, ...       the vocabulary files, copied beside

Written to a temporary folder and renamed into place, so a crash never leaves half a model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch
import yaml
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from tibnlp.config.core import check, from_dict, to_dict
from tibnlp.config.model import ModelConfig, drop_moved_keys
from tibnlp.config.yaml_loader import read_yaml
from tibnlp.errors import ConfigError, DataError
from tibnlp.fsutil import share, staged_dir
from tibnlp.models.classifier import Classifier, EmbeddingEncoder, HeadConfig
from tibnlp.models.encoder import Encoder
from tibnlp.models.long_documents.reading import Reading, build_reader
from tibnlp.text.vocab import copy_vocabulary

META_FILE = "classifier.yaml"
WEIGHTS_FILE = "model.safetensors"
FORMAT = "tibnlp-classifier/1"
DAMAGED = "fine-tune again, or point --model at another classifier folder"


@dataclass
class ClassifierMeta:
    encoder: Literal["albert", "embedding"]
    labels: list[str]
    max_len: int
    vocab_sha256: str
    vocab_size: int
    head: HeadConfig = field(default_factory=HeadConfig)
    model: ModelConfig = field(default_factory=ModelConfig)  # encoder == "albert"
    embedding_size: int = 128  # encoder == "embedding"
    text_form: str = "tsheg"  # the model's input form (see tibnlp.data.labelled.model_text)
    # False: trained on a word-segmented set, whose spaces `model_text` removes, not joins
    join_spaced_syllables: bool = True
    dataset: str = ""
    # the record fields of the training set (`LabelledSet.text_field`): what `predict` reads in
    # JSONL input unless told otherwise, so the set's own files predict as they are
    text_field: str = "text"
    label_field: str = "label"
    source_model: str = ""  # pretrained model dir, or "" for random initialisation
    eval_routing: Literal["batch", "per_text"] = "batch"  # see FinetuneConfig.eval_routing
    reading: Reading = field(default_factory=Reading)  # how documents beyond max_len are read
    format: str = FORMAT

    def validate(self, prefix: str) -> None:
        """What an edited classifier.yaml may break that loading the weights does not catch:
        a read length of no text, classes that collapse in `probabilities`, an unknown form."""
        from tibnlp.data.labelled import TEXT_FORMS

        check(self.max_len >= 3, f"{prefix}.max_len", "must be >= 3 ([CLS], a piece, [SEP])")
        check(bool(self.labels), f"{prefix}.labels", "must name at least one class")
        twice = sorted({x for x in self.labels if self.labels.count(x) > 1})
        check(not twice, f"{prefix}.labels", f"names {', '.join(map(repr, twice))} twice")
        check(
            self.text_form in TEXT_FORMS,
            f"{prefix}.text_form",
            f"{self.text_form!r} is not allowed; allowed values: {', '.join(TEXT_FORMS)}",
        )
        for key in ("text_field", "label_field"):
            check(bool(getattr(self, key).strip()), f"{prefix}.{key}", "must name a record field")
        if self.encoder == "albert":  # fine-tuning clamps both; an edit may not have
            rows = self.reading.positions(self.max_len)
            check(
                rows <= self.model.max_len,
                f"{prefix}.max_len",
                f"a {self.reading.window or self.max_len}-token window reads {rows} positions, "
                f"past the encoder's model.max_len {self.model.max_len}",
            )


def build_reading_encoder(meta: ClassifierMeta) -> nn.Module:
    """The encoder, wrapped in the long-document reader `meta.reading` names."""
    if meta.encoder == "embedding":
        return EmbeddingEncoder(meta.vocab_size, meta.embedding_size, meta.head.dropout)
    return build_reader(Encoder(meta.model), meta.reading, meta.max_len)


def read_length(meta: ClassifierMeta) -> int:
    """Tokens of each text the classifier reads ([CLS] and [SEP] included)."""
    return meta.reading.read_length(meta.max_len)


def build_classifier(meta: ClassifierMeta, encoder: nn.Module | None = None) -> Classifier:
    return Classifier(encoder or build_reading_encoder(meta), len(meta.labels), meta.head)


def save_classifier(
    directory: Path, model: nn.Module, meta: ClassifierMeta, vocab_dir: Path
) -> Path:
    directory = Path(directory)
    with staged_dir(directory, replace=True) as tmp:
        state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
        save_file(state, str(tmp / WEIGHTS_FILE))
        share(tmp / WEIGHTS_FILE)
        text = yaml.safe_dump(to_dict(meta), sort_keys=False, allow_unicode=True)
        (tmp / META_FILE).write_text(text, encoding="utf-8")
        copy_vocabulary(vocab_dir, tmp)
    return directory


def read_meta(directory: Path) -> ClassifierMeta:
    path = Path(directory) / META_FILE
    if not path.is_file():
        raise DataError(
            f"{directory} is not a fine-tuned classifier directory ({META_FILE} is missing)",
            "give a directory written by `tibnlp finetune`",
        )
    try:  # a damaged file (edited, truncated): named with its line, not a traceback
        data = read_yaml(path)
        if isinstance(data.get("model"), dict):
            data["model"] = drop_moved_keys(data["model"])
        meta = from_dict(ClassifierMeta, data, "classifier")
    except ConfigError as exc:
        raise DataError(f"{path}: damaged ({exc.message})", DAMAGED) from exc
    if meta.format != FORMAT:
        raise DataError(f"{path}: format {meta.format!r}, expected {FORMAT!r}")
    return meta


def load_classifier(directory: Path) -> tuple[Classifier, ClassifierMeta]:
    meta = read_meta(directory)
    weights = Path(directory) / WEIGHTS_FILE
    if not weights.is_file():
        raise DataError(f"{weights} is missing: the classifier directory is incomplete", DAMAGED)
    model = build_classifier(meta)
    try:
        state: dict[str, torch.Tensor] = load_file(str(weights))
        missing, unexpected = model.load_state_dict(state, strict=False)
    except (SafetensorError, OSError, ValueError) as exc:
        raise DataError(f"{weights} is corrupt or not a safetensors file ({exc})", DAMAGED) from exc
    except RuntimeError as exc:  # a tensor of another shape than classifier.yaml describes
        first = [line.strip() for line in str(exc).splitlines() if line.strip()][1:2]
        raise DataError(
            f"{weights}: weights do not fit the architecture in {META_FILE} "
            f"({''.join(first) or exc})",
            DAMAGED,
        ) from exc
    if missing or unexpected:
        raise DataError(
            f"{weights}: weights do not fit the architecture in {META_FILE} "
            f"(missing {missing[:3]}, unexpected {unexpected[:3]})",
            DAMAGED,
        )
    model.eval()
    return model, meta
