"""Settings of fine-tuning an encoder (pretrained, random, or none) on a labelled task."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from tibnlp.config.core import check, check_seed
from tibnlp.config.train import OptimizerConfig

TaskName = Literal["title", "document"]  # `finetune.task`: TNCC's two tasks


def check_layers(layers: list[int], key: str) -> None:
    """The encoder states a head reads (`finetune.layers`): their indices, as far as they can
    be checked before the encoder's depth is known."""
    check(len(layers) >= 1, key, "needs at least one state (-1: last)")
    check(len(set(layers)) == len(layers), key, "must be distinct")
    check(
        all(i >= -1 for i in layers),
        key,
        "indices are 0 (embedding layer) .. L (last layer), or -1 for the last",
    )


@dataclass
class GlobalMemoryConfig:
    """GEMFormer: tokens whose MLM entropy (nats) is below `threshold` form a global memory
    of at most `budget` tokens, prepended to every segment when classifying a long document."""

    threshold: float = 0.3
    budget: int = 128

    def validate(self, prefix: str) -> None:
        check(self.threshold > 0, f"{prefix}.threshold", "must be > 0 (nats)")
        check(self.budget >= 1, f"{prefix}.budget", "must be >= 1")


@dataclass
class FinetuneConfig:
    # pretrained model directory; "" or "none": the `model` section's encoder, randomly
    # initialised (the no-pretraining baseline)
    model: str = ""
    # "random" with a `model` directory: that model's shape and vocabulary with fresh weights
    # (and for encoder "none", its vocabulary): the baselines compared with it differ from it
    # only in pretraining
    init: Literal["pretrained", "random"] = "pretrained"
    # "albert": the transformer encoder; "none": TextCNN directly on SentencePiece piece
    # embeddings (the classic baseline; head must be cnn): from scratch with `vocab` (or a
    # `model` and init=random), or starting from a pretrained `model`'s word embedding
    encoder: Literal["albert", "none"] = "albert"
    vocab: str = ""  # vocabulary directory; default: the one inside `model`
    # a shipped set's manifest name (`tibnlp data list`), or the folder of a set of your own
    # (train.jsonl, validation.jsonl, test.jsonl with "text" and "label"; optional labels.json,
    # dataset.yaml: tibnlp.data.folder_set). A value with a path separator is a folder
    # (relative: from the current directory, e.g. ./my_set); a shipped set's name is that set;
    # another name is a folder if one exists
    dataset: str = "tncc"
    task: TaskName = "title"  # TNCC only
    # cnn: TextCNN over the token states; linear: one layer on the sentence vector; mlp: a
    # two-layer MLP on it (with pooling cls_max: the multi-scale paper's classifier)
    head: Literal["cnn", "linear", "mlp"] = "cnn"
    # the sentence vector of the linear and mlp heads: [CLS], or [CLS] ++ max-pool over the
    # real tokens (the one pooling setting; the CNN head pools by max-over-time itself).
    # auto: cls_max on a multi-scale encoder (MODELS.md section 3's classification node),
    # cls on any other
    pooling: Literal["auto", "cls", "cls_max"] = "auto"
    freeze_encoder: bool = False
    # > 0: LP-FT (Kumar et al. 2022): first this many epochs train the head alone on the frozen
    # encoder (at probe_lr; 0: the head's rate), then the whole classifier fine-tunes with
    # the recipe below from that head, so a random head's first gradients do not distort
    # what pretraining learnt
    probe_epochs: int = 0
    probe_lr: float = 0.0
    # > 1: a model soup (tibnlp.training.soup): this many copies fine-tune from the seed's
    # start (its head, after the probe with LP-FT), each with its own data order and dropout,
    # and the classifier is the greedy soup of their weights, chosen on validation. Costs that
    # many fine-tunings; inference stays one model's
    soup: int = 1
    # dynamic heads with rule batch route a whole batch by its mean length, so a text's route
    # (and prediction) at evaluation depends on the texts scored with it; per_text: every text
    # by its own length, as if scored one at a time (validation, test, AdvTS and `predict`)
    eval_routing: Literal["batch", "per_text"] = "batch"
    # tokens incl. [CLS]/[SEP]; 0: the set's default (TNCC: 50 titles, 300 documents; else its
    # manifest's or dataset.yaml's max_len, or 128)
    max_len: int = 0
    # texts longer than max_len (the window): truncate, read window by window (segments;
    # Transformer-XL recurrence when the model has it), or GEMFormer global memory;
    # see tibnlp.training.long_documents
    long_document: Literal["truncate", "segments", "memory"] = "truncate"
    document_max_len: int = 2048  # tokens read per document when long_document != truncate
    # the classifier's input form (tibnlp.data.labelled.model_text), applied at fine-tuning and
    # recorded for `predict`: "tsheg-trimmed" drops closing shads/tshegs, so a title typed
    # with a final shad gets the prediction it gets without; "tsheg" keeps them (as before)
    text_form: Literal["tsheg", "tsheg-trimmed"] = "tsheg-trimmed"
    global_memory: GlobalMemoryConfig = field(default_factory=GlobalMemoryConfig)
    # long_document=memory: which model selects the memory. "finetuned" (GEMFormer as
    # published): the model being fine-tuned with the pretrained MLM head, refreshed each
    # epoch; "frozen": the pretrained MLM, once (the paper's no-fine-tune ablation)
    memory_selection: Literal["finetuned", "frozen"] = "finetuned"
    embedding_size: int = 128  # encoder "none" only
    batch_size: int = 32
    eval_batch_size: int = 128
    epochs: int = 10
    patience: int = 3  # epochs without validation macro-F1 gain before stopping
    warmup_ratio: float = 0.1  # used when optimizer.warmup_steps is 0
    # peak lr of the head (CNN or linear); 0: optimizer.lr like the encoder. A head trained
    # from scratch on a pretrained (or random) encoder usually wants a higher rate than it
    head_lr: float = 0.0
    # peak lr of the encoder's whole embedding layer (piece, segment and position tables, its
    # norm and projection; with encoder none, the piece table); 0: optimizer.lr. Measured in
    # embedding_levers.md: neither a faster nor a held embedding won on validation
    embedding_lr: float = 0.0
    # layer-wise lr decay (ELECTRA, ULMFiT): layer i of L trains at lr * decay^(L - i), the
    # embedding layer at lr * decay^L unless embedding_lr is set; 1: one rate for the encoder
    layer_decay: float = 1.0
    # > 0: MLM on each training batch beside the classification loss, with this weight, through
    # the pretrained model's MLM head (tibnlp.training.aux_mlm); mlm_prob of the pieces masked
    mlm_weight: float = 0.0
    mlm_prob: float = 0.15
    # > 0: adversarial training on the piece vectors (Miyato et al. 2017, FGM;
    # tibnlp.training.adversarial): each batch also trains with every text's piece vectors
    # moved this share of their norm along its loss gradient. A step takes about twice as
    # long (finetune_levers.md); the LP-FT probe runs without it
    adversarial: float = 0.0
    # > 0: subword regularization (Kudo 2018): every training batch reads its texts in a
    # segmentation drawn from the unigram vocabulary, P ~ P_LM^subword_alpha over the
    # subword_nbest best (-1: all), so the classifier meets the pieces a rare syllable falls
    # into; validation, test and `predict` keep the best segmentation. 0: off
    subword_alpha: float = 0.0
    subword_nbest: int = -1
    # > 0: L2-SP (Li et al. 2018): the loss adds l2sp/2 x the squared distance of the encoder's
    # weights from where the main phase starts (the pretrained ones), instead of letting 7,422
    # titles pull them anywhere; the head is free. 0: off
    l2sp: float = 0.0
    # > 0: each real piece of a training batch is read as [MASK] with this probability (token
    # cutoff, tibnlp.data.input_mask): a pretrained encoder fills it from context, a
    # random-init one loses it (word dropout). Validation, test and predict read every piece
    input_mask: float = 0.0
    # class weights (N / (K n_c))^class_balance in the training loss, n_c the training
    # examples of class c among K: 0 off, 1 inverse frequency (each class weighs as much as
    # macro-F1 counts it), 0.5 between. TNCC's rarest classes are where pretraining pays most
    class_balance: float = 0.0
    seeds: list[int] = field(default_factory=lambda: [1])
    cnn_kernels: list[int] = field(default_factory=lambda: [2, 3, 4])
    cnn_channels: int = 128
    # the encoder states the head reads, side by side: -1 the last layer's, 0 the embedding
    # layer's output, i the output of layer i. [0, -1] gives the head the word embedding's
    # evidence beside the context (benchmarks/results/layers.md). Encoder albert, truncate only
    layers: list[int] = field(default_factory=lambda: [-1])
    # word vectors read beside those states as a frozen channel (Kim 2014's static channel):
    # a [V, dim] tensor file (.pt), or a pretraining output folder (or its model folder) whose
    # skip-gram start they are (`pretrain.skipgram`, kept in OUTPUT/skipgram). Fine-tuning
    # moves the word embedding and MLM washes it out; the frozen copy keeps what the vectors
    # knew. With init random: a frozen random table of the same shape (the twin's). "": off
    static_vectors: str = ""
    dropout: float = 0.1
    # dropout inside the encoder while fine-tuning; -1 keeps the model's own. Pretraining with
    # dropout off (a short-budget lever) must not silently switch it off for fine-tuning too.
    encoder_dropout: float = -1.0
    device: Literal["auto", "cpu", "cuda"] = "auto"  # auto: cuda when available
    # only the first N training examples (smoke runs; few-label curves: TNCC's training file is
    # in shuffled order, so its first N hold every class, benchmarks/results/labels.md); 0: all
    limit_train: int = 0
    output: str = "runs/finetune"
    eval_also: list[str] = field(default_factory=list)  # e.g. ["advts"]
    optimizer: OptimizerConfig = field(
        default_factory=lambda: OptimizerConfig(lr=5e-5, warmup_steps=0, weight_decay=0.01)
    )

    @property
    def random_init(self) -> bool:
        return self.model in ("", "none") or self.init == "random"

    @property
    def model_dir(self) -> str:
        """The model directory read (weights, or only shape and vocabulary); "" when none."""
        return "" if self.model in ("", "none") else self.model

    def unread_settings(self) -> list[str]:
        """Long-document settings moved from their defaults that this reading never uses.
        Not refused: a pipeline grid over `long_document` shares one memory setting among
        its variants; `tibnlp finetune` says so instead."""
        default = FinetuneConfig()
        moved = []
        if self.long_document != "memory":
            for name in ("threshold", "budget"):
                if getattr(self.global_memory, name) != getattr(default.global_memory, name):
                    moved.append(f"global_memory.{name}")
            if self.memory_selection != default.memory_selection:
                moved.append("memory_selection")
        if self.long_document == "truncate" and self.document_max_len != default.document_max_len:
            moved.append("document_max_len")
        return [f"finetune.{name}" for name in moved]

    def validate(self, prefix: str) -> None:
        check(bool(self.output.strip()), f"{prefix}.output", "must name a folder")
        check(
            bool(self.dataset.strip()),
            f"{prefix}.dataset",
            "must name a shipped set (e.g. tncc, tusa) or the folder of a set of your own",
        )
        check(  # it chooses nothing elsewhere, yet a run logged it (a pipeline's plan refuses)
            self.task == "title" or self.dataset in ("tncc", "tncc_document"),
            f"{prefix}.task",
            f"'{self.task}' is a task of TNCC, and dataset '{self.dataset}' has one task only: "
            f"leave {prefix}.task out (title), or set {prefix}.dataset=tncc",
        )
        check(self.max_len >= 0, f"{prefix}.max_len", "must be >= 0 (0 = task default)")
        check(self.max_len == 0 or self.max_len >= 3, f"{prefix}.max_len", "must be >= 3")
        check(self.document_max_len >= 3, f"{prefix}.document_max_len", "must be >= 3")
        check(self.batch_size >= 1, f"{prefix}.batch_size", "must be >= 1")
        check(self.eval_batch_size >= 1, f"{prefix}.eval_batch_size", "must be >= 1")
        check(self.epochs >= 1, f"{prefix}.epochs", "must be >= 1")
        check(self.patience >= 1, f"{prefix}.patience", "must be >= 1")
        check(self.probe_epochs >= 0, f"{prefix}.probe_epochs", "must be >= 0 (0 = off)")
        check(self.probe_lr >= 0.0, f"{prefix}.probe_lr", "must be >= 0 (0 = the head's rate)")
        if self.probe_epochs:
            check(
                not self.freeze_encoder,
                f"{prefix}.probe_epochs",
                "a head probed on the frozen encoder before fine-tuning it; with "
                "finetune.freeze_encoder=true the encoder is never fine-tuned: set one of them",
            )
        check(self.soup >= 1, f"{prefix}.soup", "must be >= 1 (1: one fine-tuning, no soup)")
        check(self.head_lr >= 0.0, f"{prefix}.head_lr", "must be >= 0 (0 = optimizer.lr)")
        check(self.embedding_lr >= 0.0, f"{prefix}.embedding_lr", "must be >= 0 (0 = optimizer.lr)")
        check(0.0 < self.layer_decay <= 1.0, f"{prefix}.layer_decay", "must be in (0, 1]")
        check(self.mlm_weight >= 0.0, f"{prefix}.mlm_weight", "must be >= 0 (0 = off)")
        check(0.0 < self.mlm_prob < 1.0, f"{prefix}.mlm_prob", "must be in (0, 1)")
        if self.mlm_weight:
            check(
                self.encoder == "albert" and self.long_document == "truncate",
                f"{prefix}.mlm_weight",
                "the MLM beside fine-tuning needs encoder 'albert' and long_document "
                "'truncate'; set finetune.mlm_weight=0",
            )
        check(self.adversarial >= 0.0, f"{prefix}.adversarial", "must be >= 0 (0 = off)")
        if self.adversarial:
            check(
                self.long_document == "truncate",
                f"{prefix}.adversarial",
                "adversarial training perturbs one read of each text: it needs long_document "
                "'truncate'; set finetune.adversarial=0",
            )
        check(
            self.subword_alpha >= 0.0,
            f"{prefix}.subword_alpha",
            "must be >= 0 (0: off; 0.1-1: the smoothing of Kudo 2018, lower samples wider)",
        )
        check(self.l2sp >= 0.0, f"{prefix}.l2sp", "must be >= 0 (0: off)")
        check(
            0.0 <= self.input_mask < 1.0,
            f"{prefix}.input_mask",
            "must be in [0, 1) (0: off; 0.1-0.2 hides one piece in five to ten)",
        )
        if self.input_mask:
            check(
                self.long_document == "truncate",
                f"{prefix}.input_mask",
                "pieces are hidden in one read of each text: it needs long_document "
                "'truncate'; set finetune.input_mask=0",
            )
        check(
            self.subword_nbest == -1 or self.subword_nbest >= 2,
            f"{prefix}.subword_nbest",
            "must be -1 (every segmentation) or >= 2 (the n best)",
        )
        if self.subword_alpha:
            check(
                self.long_document == "truncate",
                f"{prefix}.subword_alpha",
                "subword sampling re-segments each text as one read: it needs long_document "
                "'truncate'; set finetune.subword_alpha=0",
            )
        check(0.0 <= self.warmup_ratio < 1.0, f"{prefix}.warmup_ratio", "must be in [0, 1)")
        check(
            0.0 <= self.class_balance <= 1.0,
            f"{prefix}.class_balance",
            "must be in [0, 1] (0: off, 1: inverse class frequency)",
        )
        check(len(self.seeds) >= 1, f"{prefix}.seeds", "needs at least one seed")
        check(len(set(self.seeds)) == len(self.seeds), f"{prefix}.seeds", "must be distinct")
        for i, seed in enumerate(self.seeds):
            check_seed(seed, f"{prefix}.seeds[{i}]")
        check(len(self.cnn_kernels) >= 1, f"{prefix}.cnn_kernels", "needs at least one width")
        check(all(k >= 1 for k in self.cnn_kernels), f"{prefix}.cnn_kernels", "widths must be >= 1")
        check(self.cnn_channels >= 1, f"{prefix}.cnn_channels", "must be >= 1")
        check_layers(self.layers, f"{prefix}.layers")
        if self.layers != [-1]:
            check(
                self.encoder == "albert" and self.long_document == "truncate",
                f"{prefix}.layers",
                "other states than the last are read with encoder 'albert' and long_document "
                "'truncate' only; set finetune.layers=[-1]",
            )
        if self.static_vectors:
            check(
                (self.encoder, self.head, self.long_document) == ("albert", "cnn", "truncate"),
                f"{prefix}.static_vectors",
                "a static word-vector channel is read by the CNN head beside a transformer "
                "encoder (encoder 'albert', head 'cnn', long_document 'truncate'); "
                'set finetune.static_vectors=""',
            )
        check(0.0 <= self.dropout < 1.0, f"{prefix}.dropout", "must be in [0, 1)")
        check(
            self.encoder_dropout == -1.0 or 0.0 <= self.encoder_dropout < 1.0,
            f"{prefix}.encoder_dropout",
            "must be in [0, 1), or -1 to keep the model's",
        )
        check(self.embedding_size >= 1, f"{prefix}.embedding_size", "must be >= 1")
        check(self.limit_train >= 0, f"{prefix}.limit_train", "must be >= 0 (0 = all)")
        check(
            self.head != "cnn" or self.pooling != "cls_max",
            f"{prefix}.pooling",
            "applies to the linear and mlp heads; the CNN head pools by max-over-time "
            "(set finetune.head=linear or mlp, or leave pooling at auto)",
        )
        if self.encoder == "none":
            check(
                self.head == "cnn",
                f"{prefix}.head",
                "encoder 'none' (TextCNN on pieces) needs head 'cnn'",
            )
            # its vocabulary (vocab=DIR, or model=DIR) may come from a pipeline input: checked
            # when fine-tuning starts. With model=DIR and init=pretrained, the piece embeddings
            # start from that model's word embedding (a static-vector baseline)
        for name in self.eval_also:
            check(name in ("advts",), f"{prefix}.eval_also", f"{name!r} unknown; allowed: 'advts'")
