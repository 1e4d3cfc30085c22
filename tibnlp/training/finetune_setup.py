"""Everything a fine-tuning run resolves before its first seed (`prepare`): the task's data, the
encoder (pretrained, random or none) and its vocabulary, the classifier's meta, and every split
encoded (`finetune_splits`), with hashes of the weights and the data that seed records keep.
The seeds themselves run in `finetune.py`.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import itertools
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from tibnlp.config import Config
from tibnlp.config.core import check
from tibnlp.config.finetune import FinetuneConfig
from tibnlp.config.model import ModelConfig
from tibnlp.data.labelled import LabelledSet
from tibnlp.errors import DataError
from tibnlp.models.classifier import head_config
from tibnlp.models.classifier_io import ClassifierMeta
from tibnlp.models.io import check_vocab_of_weights, load_config_file, load_encoder
from tibnlp.text.vocab import MODEL_FILE, Vocabulary
from tibnlp.training.finetune_splits import encode_splits, texts
from tibnlp.training.long_documents import reading_of
from tibnlp.training.ranks import is_main_process

TASK_MAX_LEN = {"tncc-title": 50, "tncc-document": 300}


@dataclass
class Setup:
    """Everything resolved before training: data as ids, the vocabulary, the meta to save."""

    data: LabelledSet
    ids: dict[str, list[list[int]]]
    meta: ClassifierMeta
    vocab: Vocabulary
    vocab_dir: Path
    pretrained: dict[str, torch.Tensor] | None
    system: str
    # per split, the texts longer than the read length (the window, or document_max_len) and
    # the pieces cut off them: what the classifier never read
    cut: dict[str, dict[str, int]] = field(default_factory=dict)
    # the static channel's pretrained vectors [V, dim] (`finetune.static_vectors`); None with
    # none, or with init random (each seed draws its own frozen random table)
    static: torch.Tensor | None = None

    @functools.cached_property
    def train_texts(self) -> list[str]:
        """The training texts actually used (`finetune.limit_train`), in the model's input
        form: what the classifier trains on, and what a test text is unseen against."""
        return texts(self.data, "train", self.meta.text_form)[: len(self.ids["train"])]

    @functools.cached_property
    def pretrained_sha256(self) -> str:
        """The pretrained weights every seed starts from ("" for none), hashed once: a model
        folder is rewritten in place (pretraining resumed for more steps) under the same name,
        which the seed fingerprint holds."""
        if self.pretrained is None:
            return ""
        digest = hashlib.sha256()
        weights = dict(self.pretrained)
        if self.static is not None:  # a name no encoder weight has
            weights["<static_vectors>"] = self.static
        for name in sorted(weights):
            tensor = weights[name].detach().contiguous().cpu()
            digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
            digest.update(tensor.view(-1).view(torch.uint8).numpy().tobytes())
        return digest.hexdigest()

    @functools.cached_property
    def data_sha256(self) -> str:
        """Every split's ids (limit_train applied) and labels (`ids_sha256`). The seed
        fingerprint holds the splits' sizes only: a corrected dataset with as many rows would
        reuse the seeds trained on the old one. A folder set's (`LabelledSet.files_sha256`)
        follows the hash of its files, so any change to them (an id, a label name, the label
        order) trains again; a shipped set's hash is as it was."""
        return ids_sha256(
            ((s, self.ids[s], self.data.targets(s)[: len(self.ids[s])]) for s in sorted(self.ids)),
            self.data.files_sha256,
        )


def ids_sha256(
    parts: Iterable[tuple[str, Sequence[Sequence[int]], Sequence[int]]], after: str = ""
) -> str:
    """The data a seed reads, hashed: each part's name, ids as the model reads them and labels,
    following `after` (a hash this one extends)."""
    digest = hashlib.sha256(after.encode())
    for name, rows, labels in parts:
        lengths = np.array([len(r) for r in rows], dtype=np.int64)
        flat = np.fromiter(itertools.chain.from_iterable(rows), np.int64, int(lengths.sum()))
        for part in (name.encode(), lengths, flat, np.array(labels, dtype=np.int64)):
            digest.update(part if isinstance(part, bytes) else part.tobytes())
    return digest.hexdigest()


def prepare(cfg: Config, data: LabelledSet) -> Setup:
    """Resolve the encoder (pretrained / random / none) and vocabulary; encode every split."""
    ft = cfg.finetune
    pretrained = None
    model_cfg: ModelConfig = copy.deepcopy(cfg.model)
    model_dir = Path(ft.model_dir) if ft.model_dir else None
    if model_dir is None:
        if not ft.vocab:
            raise DataError(
                "no vocabulary: a randomly initialised or from-scratch model needs one",
                "pass --vocab DIR (a `tibnlp vocab build` output), or --model DIR with "
                "--set finetune.init=random to use that model's vocabulary",
            )
        vocab_dir = Path(ft.vocab)
    else:
        if not model_dir.is_dir():
            what = "is a file, not" if model_dir.exists() else "does not exist: name"
            raise DataError(
                f"model directory {model_dir} {what} a folder",
                "--model takes a saved model directory (a pretraining run's OUTPUT/model)",
            )
        if ft.init == "pretrained":
            model_cfg, encoder = load_encoder(model_dir)
            pretrained = encoder.state_dict()
            if ft.encoder == "none":  # TextCNN on the model's piece embeddings alone,
                # at the from-scratch table's scale (N(0, 1)): the encoder's LayerNorm made
                # the table's own scale irrelevant, the TextCNN has none, and its recipe
                # was searched at that scale
                word = pretrained["embeddings.word.weight"]
                pretrained = {"embeddings.weight": word / word.std()}
        elif ft.encoder == "albert":  # the same shape, fresh weights: a no-pretraining twin
            model_cfg = load_config_file(model_dir)
        # the vocabulary is copied beside the weights at pretraining; --vocab must match it
        vocab_dir = model_dir if (model_dir / MODEL_FILE).is_file() else Path(ft.vocab or ".")
        if vocab_dir != model_dir and not ft.vocab:
            raise DataError(
                f"model directory {model_dir} holds no vocabulary ({MODEL_FILE})",
                "pass --vocab DIR with the vocabulary the model was pretrained with",
            )
    vocab = _load_vocab(vocab_dir)
    if model_dir is not None and ft.vocab and vocab_dir != Path(ft.vocab):
        other = _load_vocab(Path(ft.vocab))
        if other.sha256 != vocab.sha256:
            raise DataError(
                f"vocabulary {ft.vocab} (sha256 {other.sha256[:12]}) is not the one model "
                f"{ft.model} was pretrained with ({vocab.sha256[:12]})",
                "drop --vocab (the model directory's own vocabulary is used) or pass the "
                "matching model",
            )
    if model_dir is None:
        model_cfg.vocab_size = vocab.size
    else:
        check_vocab_of_weights(model_dir, vocab.sha256, vocab_dir)
        if ft.encoder == "albert" and vocab.size > model_cfg.vocab_size:  # (none recorded)
            raise DataError(
                f"vocabulary in {vocab_dir} has {vocab.size} pieces but model {ft.model} "
                f"embeds only {model_cfg.vocab_size}: ids would be out of range",
                "the model directory holds a different vocabulary than its weights were trained on",
            )
    if ft.encoder_dropout >= 0:
        model_cfg.dropout = model_cfg.attention_dropout = ft.encoder_dropout
    # (a folder set named like a TNCC task is not TNCC: its dataset.yaml's max_len, or 128)
    task_len = 0 if data.folder else TASK_MAX_LEN.get(data.name, 0)
    max_len = ft.max_len or task_len or data.max_len or 128
    lowered = ft.encoder == "albert" and ft.max_len > model_cfg.max_len
    if ft.encoder == "albert":
        max_len = min(max_len, model_cfg.max_len)
    depth = model_cfg.num_layers
    check(
        all(i <= depth for i in ft.layers),
        "finetune.layers",
        f"the encoder has {depth} layers: states are 0..{depth}, or -1 for the last",
    )
    resolved = [depth if i == -1 else i for i in ft.layers]
    check(
        len(set(resolved)) == len(resolved),
        "finetune.layers",
        f"-1 and {depth} are the same state (the last of {depth} layers): list it once",
    )
    head = head_config(ft, model_cfg)
    static = None
    if ft.static_vectors:
        vectors = load_static_vectors(Path(ft.static_vectors), model_cfg.vocab_size)
        head.static_size = int(vectors.shape[1])
        static = None if ft.random_init else vectors
    reading = reading_of(ft, model_cfg, max_len)
    if lowered and is_main_process():  # said, not lowered in silence (once the reading holds)
        how = (
            f"texts are read to {max_len} pieces"
            if ft.long_document == "truncate"
            else f"documents are read in windows of {max_len} pieces"
        )
        print(
            f"warning: finetune.max_len {ft.max_len} is past the {max_len} positions of the "
            f"encoder {ft.model or '(config)'}: {how}",
            file=sys.stderr,
            flush=True,
        )
    meta = ClassifierMeta(
        encoder="embedding" if ft.encoder == "none" else "albert",
        labels=list(data.labels),
        max_len=max_len,
        vocab_sha256=vocab.sha256,
        vocab_size=model_cfg.vocab_size if pretrained is not None else vocab.size,
        head=head,
        model=model_cfg,
        embedding_size=model_cfg.embedding_size if pretrained is not None else ft.embedding_size,
        text_form=ft.text_form,
        join_spaced_syllables=data.join_spaced_syllables,
        dataset=data.name,
        text_field=data.text_field,
        label_field=data.label_field,
        source_model="" if ft.random_init else str(ft.model),
        eval_routing=ft.eval_routing,
        reading=reading,
    )
    ids, cut = encode_splits(
        data, vocab, ft.text_form, reading.read_length(max_len), ft.limit_train
    )
    return Setup(
        data, ids, meta, vocab, vocab_dir, pretrained, system_name(ft, head.pooling), cut, static
    )


def load_static_vectors(path: Path, vocab_size: int) -> torch.Tensor:
    """The static channel's vectors (`finetune.static_vectors`): a [V, dim] tensor file, or
    the skip-gram start a pretraining output kept (OUTPUT/skipgram/vectors.pt), given that
    output folder or the model folder inside it."""
    from tibnlp.training.skipgram import VECTORS_FILE

    key = "finetune.static_vectors"
    file = path
    if path.is_dir():
        found = [d / "skipgram" / VECTORS_FILE for d in (path, path.parent)]
        found = [f for f in found if f.is_file()]
        if not found:
            raise DataError(
                f"{key}: {path} holds no skip-gram vectors (skipgram/{VECTORS_FILE} in it or "
                "beside it)",
                "give a pretraining output whose run had pretrain.skipgram.epochs > 0, or a "
                "[vocabulary size, dim] tensor file",
            )
        file = found[0]
    if not file.is_file():
        raise DataError(f"{key}: {file} does not exist")
    try:
        vectors = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as exc:  # a file torch cannot read, whatever the reason
        raise DataError(f"{key}: {file} is not a tensor file torch can read ({exc})") from exc
    if not isinstance(vectors, torch.Tensor) or vectors.dim() != 2:
        raise DataError(f"{key}: {file} must hold one [vocabulary size, dim] tensor")
    if vectors.shape[0] != vocab_size:
        raise DataError(
            f"{key}: {file} has {vectors.shape[0]} rows, the model's vocabulary {vocab_size}",
            "give the vectors trained with the model's vocabulary",
        )
    return vectors.float()


def system_name(ft: FinetuneConfig, pooling: str = "") -> str:
    """The system's name in result tables; `pooling`: the resolved `finetune.pooling`
    (auto names what it became)."""
    loss = f"+balance{ft.class_balance:g}" if ft.class_balance else ""  # the training loss's
    loss += f"+adv{ft.adversarial:g}" if ft.adversarial else ""  # levers, in the name,
    loss += f"+l2sp{ft.l2sp:g}" if ft.l2sp else ""
    loss += f"+sw{ft.subword_alpha:g}" if ft.subword_alpha else ""  # and the inputs' ones
    loss += f"+mask{ft.input_mask:g}" if ft.input_mask else ""
    if ft.encoder == "none":
        base = "textcnn-pieces(scratch)" if ft.random_init else "textcnn-pieces(pretrained)"
        return base + loss + (f"+soup{ft.soup}" if ft.soup > 1 else "")
    shape = f"({Path(ft.model_dir).name})" if ft.model_dir else ""
    base = f"albert-random{shape}" if ft.random_init else f"albert-pretrained{shape}"
    head = ft.head if ft.head == "cnn" else f"{ft.head}-{pooling or ft.pooling}"
    long = "" if ft.long_document == "truncate" else f"+long-{ft.long_document}"
    if ft.long_document == "memory" and ft.memory_selection == "frozen":
        long += "-frozen"
    routing = "+eval-per-text" if ft.eval_routing == "per_text" else ""
    if ft.layers != [-1]:
        head += "@" + ",".join(str(i) for i in ft.layers)
    probe = f"+probe{ft.probe_epochs}" if ft.probe_epochs else ""
    probe += f"+soup{ft.soup}" if ft.soup > 1 else ""
    if ft.static_vectors:
        head += "+static"
    head += loss
    return f"{base}+{head}" + ("+frozen" if ft.freeze_encoder else "") + probe + long + routing


def _load_vocab(directory: Path) -> Vocabulary:
    return Vocabulary.load(directory)  # names a missing folder, a file, a damaged spm.model
