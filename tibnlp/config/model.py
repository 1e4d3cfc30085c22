"""Settings of the encoder: ALBERT-tiny shape plus the attention designs of MODELS.md.

Attention options compose: `attention.heads` (fixed or dynamic head count), `attention.scales`
(multi-scale windowed heads), `position` (absolute or Transformer-XL relative) and the other
designs are independent keys, so one config names exactly one model.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from tibnlp.config.core import check


@dataclass
class HeadsConfig:
    """Head count. `small == large` is the fixed-head model; otherwise DMA-ALBERT's two routes."""

    small: int = 12
    large: int = 12
    threshold: int | Literal["auto"] = "auto"  # tokens; "auto": median real length of the corpus
    rule: Literal["batch", "sentence"] = "batch"

    @property
    def dynamic(self) -> bool:
        return self.small != self.large

    def validate(self, prefix: str) -> None:
        check(self.small >= 1, f"{prefix}.small", "must be >= 1")
        check(self.large >= self.small, f"{prefix}.large", "must be >= heads.small")
        if isinstance(self.threshold, int):
            check(self.threshold >= 0, f"{prefix}.threshold", "must be >= 0 or 'auto'")


# the windows of the multi-scale paper's layer (Guo et al.), as the speed benchmarks time it
PAPER_WINDOWS = ("1", "3", "N/16", "N/8", "N/4")


@dataclass
class ScalesConfig:
    """Multi-scale windowed heads (Guo et al.). Empty `windows`: every head sees everything."""

    windows: list[str] = field(default_factory=list)  # e.g. list(PAPER_WINDOWS)
    alpha: float = 0.5
    ffn: bool = True  # False: the paper's FFN-free layer norm(H + ReLU(MSMSA(H)))

    @property
    def enabled(self) -> bool:
        return bool(self.windows)

    def validate(self, prefix: str) -> None:
        for i, w in enumerate(self.windows):
            ok = _digits(w) and int(w) >= 1 and int(w) % 2 == 1
            ok = ok or _fraction(w)
            check(ok, f"{prefix}.windows[{i}]", f"{w!r} must be an odd integer or 'N/k'")
        check(
            self.ffn or self.enabled,
            f"{prefix}.ffn",
            "false (the paper's FFN-free layer) applies to multi-scale heads only: set "
            "model.scales.windows too, or leave ffn at true",
        )
        # MODELS.md section 3: the candidate scales are ascending (w_0 < w_1 < ...), which is
        # what gives alpha its meaning (alpha > 0: more small-scale heads in shallow layers).
        # Constants compare by width, fractions by divisor; a constant and a fraction compare
        # differently at different lengths, so either order of the two kinds is accepted.
        widths = [(i, int(w)) for i, w in enumerate(self.windows) if _digits(w)]
        # N/k widens as k falls: -k orders fractions by width
        shares = [(i, -int(w[2:])) for i, w in enumerate(self.windows) if _fraction(w)]
        for kind, seen in (("constant", widths), ("fraction", shares)):
            for (_, a), (i, b) in itertools.pairwise(seen):
                check(
                    a < b,
                    f"{prefix}.windows[{i}]",
                    f"{self.windows[i]!r} is not wider than the {kind} scale before it: list the "
                    "scales from the narrowest to the widest, each once",
                )

    def validate_shape(self, prefix: str, max_len: int, heads: int) -> None:
        """What the scales must fit: `model.max_len` tokens and `heads` (the smaller route)."""
        for i, w in enumerate(self.windows):
            width = _width(w)
            check(
                width is None or width <= max_len,
                f"{prefix}.windows[{i}]",
                f"a window of {width} tokens is wider than model.max_len ({max_len}): no "
                "sequence is that long",
            )
        check(
            heads >= len(self.windows),
            f"{prefix}.windows",
            f"{len(self.windows)} scales need at least {len(self.windows)} heads, and "
            f"model.heads.small is {heads}: the top layer spreads the heads evenly over the "
            "scales, so a scale would get no head",
        )


def _digits(text: str) -> bool:
    """ASCII digits only: str.isdigit also takes '³' or '٣', which int() refuses or reads."""
    return text.isascii() and text.isdigit()


def _width(window: str) -> int | None:
    """A constant window's width (None for 'N/k' or an unparsable entry)."""
    return int(window) if _digits(window) else None


def _fraction(window: str) -> bool:
    """Whether `window` is a valid 'N/k'."""
    return window.startswith("N/") and _digits(window[2:]) and int(window[2:]) >= 1


@dataclass
class RecurrenceConfig:
    """Transformer-XL segment recurrence: each layer also attends to the previous segment's
    `mem_len` (gradient-stopped) states. 0 = off. Needs `position: relative`.

    With recurrence on, `tibnlp pretrain` trains MLM over chains of
    `pretrain.recurrence_segments` consecutive `pretrain.seq_len` segments of one document
    (no SOP; see tibnlp.data.segment_chains)."""

    MOVED: ClassVar[dict[str, str]] = {"segments": "pretrain.recurrence_segments"}

    mem_len: int = 0

    @property
    def enabled(self) -> bool:
        return self.mem_len > 0


@dataclass
class FusionConfig:
    """RPSAN: forward, backward and distant (1 <= |i-j| <= radius) masked attentions fused
    with the input by a per-position, per-dimension softmax gate over the four sources."""

    enabled: bool = False
    radius: int = 3


@dataclass
class ModelConfig:
    """ALBERT-tiny defaults (MODELS.md section 1). Only what shapes the network: how a
    stage uses it (pretraining data, long-document reading) is that stage's setting."""

    # keys that left this section: a config naming one is told where it went; a saved model
    # directory holding one still loads (`drop_moved_keys`)
    MOVED: ClassVar[dict[str, str]] = {
        "global_memory": "finetune.global_memory",
        "pooling": "finetune.pooling",
    }

    vocab_size: int = 30000  # replaced by the vocabulary's real size at pretraining start
    embedding_size: int = 128
    hidden_size: int = 384
    num_layers: int = 4
    ffn_size: int = 1536
    max_len: int = 512
    dropout: float = 0.1
    attention_dropout: float = 0.1
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    position: Literal["absolute", "relative"] = "absolute"
    # how the absolute position table starts. random: N(0, initializer_range), as BERT/ALBERT.
    # sinusoidal: the Transformer's sinusoids scaled to that same std, still learned. Why: a
    # random table gives neighbouring positions unrelated vectors, and on a short budget the
    # model never learns to use word order (measured in benchmarks/results/positions.md);
    # sinusoids relate every offset by one linear map from the first step
    position_init: Literal["random", "sinusoidal"] = "random"
    # post: ALBERT's post-LN layer (the published shape); pre: LayerNorm before attention and
    # FFN plus a final LayerNorm, which tolerates a higher learning rate (cramming, 24h-BERT)
    norm: Literal["post", "pre"] = "post"
    # true: ALBERT's cross-layer sharing (one layer's weights run num_layers times). false:
    # num_layers own layers, BERT-style: the same FLOPs per token with num_layers x the layer
    # parameters, which is what a compute budget (not a memory one) can afford
    share_layers: bool = True
    heads: HeadsConfig = field(default_factory=HeadsConfig)
    scales: ScalesConfig = field(default_factory=ScalesConfig)
    recurrence: RecurrenceConfig = field(default_factory=RecurrenceConfig)
    fusion: FusionConfig = field(default_factory=FusionConfig)
    memory_tokens: int = 0  # learned [MEM] embeddings prepended to every input

    def validate(self, prefix: str) -> None:
        for key in (
            "vocab_size",
            "embedding_size",
            "hidden_size",
            "num_layers",
            "ffn_size",
            "max_len",
        ):
            check(getattr(self, key) >= 1, f"{prefix}.{key}", "must be >= 1")
        for h in {self.heads.small, self.heads.large}:
            check(
                self.hidden_size % h == 0,
                f"{prefix}.heads",
                f"hidden_size {self.hidden_size} is not divisible by {h} heads",
            )
        check(self.layer_norm_eps > 0, f"{prefix}.layer_norm_eps", "must be > 0")
        check(self.initializer_range >= 0, f"{prefix}.initializer_range", "must be >= 0 (a std)")
        for key in ("dropout", "attention_dropout"):
            check(0.0 <= getattr(self, key) < 1.0, f"{prefix}.{key}", "must be in [0, 1)")
        self._validate_designs(prefix)

    def _validate_designs(self, prefix: str) -> None:
        """Which of the section 4-6 designs compose (MODELS.md), and the values that fit the
        shape: a setting that can never take effect is refused, not silently dropped."""
        rec, fus = self.recurrence, self.fusion
        check(rec.mem_len >= 0, f"{prefix}.recurrence.mem_len", "must be >= 0 (0 = off)")
        check(self.memory_tokens >= 0, f"{prefix}.memory_tokens", "must be >= 0 (0 = off)")
        check(fus.radius >= 1, f"{prefix}.fusion.radius", "must be >= 1")
        if fus.enabled:
            check(
                fus.radius < self.max_len,
                f"{prefix}.fusion.radius",
                f"{fus.radius} is not below model.max_len ({self.max_len}): no two tokens are "
                "that far apart",
            )
        if self.scales.enabled:
            self.scales.validate_shape(f"{prefix}.scales", self.max_len, self.heads.small)
        # (a threshold of max_len or more leaves the large route unused; it is not refused:
        # `threshold: auto` resolves to the pretraining examples' median length, which can be
        # max_len for packed examples, and a saved model must load as it was trained)
        if rec.enabled:
            check(
                self.position == "relative",
                f"{prefix}.recurrence.mem_len",
                "segment recurrence needs model.position=relative (absolute positions would "
                "repeat across segments)",
            )
        check(
            self.position == "absolute" or self.position_init == "random",
            f"{prefix}.position_init",
            "applies to absolute positions only (model.position=relative has no position table)",
        )
        if self.position == "relative":
            check(
                not self.scales.enabled,
                f"{prefix}.position",
                "relative attention does not combine with multi-scale windows (scales.windows)",
            )
        if fus.enabled:
            for on, key in (
                (self.position == "relative", "position"),
                (self.scales.enabled, "scales.windows"),
                (self.memory_tokens > 0, "memory_tokens"),
            ):
                check(not on, f"{prefix}.fusion.enabled", f"masked fusion excludes model.{key}")
        if self.memory_tokens:
            check(
                not self.scales.enabled,
                f"{prefix}.memory_tokens",
                "memory tokens must see every token; windowed heads (scales.windows) cannot",
            )


def drop_moved_keys(data: Any) -> Any:
    """A model config as saved (model.yaml, classifier.yaml) before `MOVED` keys left the
    model section: those keys never shaped the network, so a saved model still loads."""
    if isinstance(data, dict):
        data = {k: v for k, v in data.items() if k not in ModelConfig.MOVED}
        rec = data.get("recurrence")
        if isinstance(rec, dict):
            data["recurrence"] = {k: v for k, v in rec.items() if k not in RecurrenceConfig.MOVED}
    return data
