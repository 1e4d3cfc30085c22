"""Sequence classifiers: an encoder's token states -> a head -> class logits.

Three heads, as in the TNCC literature:
- `TextCNNHead` (Kim 2014, DMA-ALBERT's head): 1-D convolutions of several widths over the
  token states, ReLU, max-over-time pooling restricted to real tokens, dropout, a linear layer.
- `LinearHead`: dropout + linear on the sentence vector (`linear`), or a two-layer MLP on it
  (`mlp`: linear, ReLU, dropout, linear; with `cls_max` pooling the multi-scale paper's
  classifier, Guo et al. 2020).
The sentence vector of the linear and MLP heads is `[CLS]` (`pooling: cls`) or `[CLS]`
concatenated with a max-pool over the real tokens (`cls_max`); `finetune.pooling` sets it,
and its default (`auto`) is `cls_max` on a multi-scale encoder, as MODELS.md section 3 says.

`Classifier` accepts any encoder module whose forward(input_ids, attention_mask) returns the
hidden states as a tensor [B, N, D] or an object with `.hidden`, so the pretrained ALBERT, a
randomly initialised one, and the plain embedding table of the from-scratch TextCNN baseline
all plug in the same way.

The head reads the last layer's states, or (`HeadConfig.layers`, `finetune.layers`) several of
the encoder's states side by side, e.g. `[0, -1]`: the embedding layer's output beside the last
layer's. MLM trains the last layer to predict masked pieces, which is not the same as keeping
the evidence of which words a title contains; a TextCNN over the word embedding alone was the
stronger classifier on TNCC titles (benchmarks/results/layers.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn

from tibnlp.config.core import check
from tibnlp.config.finetune import FinetuneConfig, check_layers
from tibnlp.config.model import ModelConfig
from tibnlp.models.encoder import Encoder


@dataclass
class HeadConfig:
    kind: Literal["cnn", "linear", "mlp"] = "cnn"
    kernels: list[int] = field(default_factory=lambda: [2, 3, 4])  # TextCNN widths (tokens)
    channels: int = 128  # filters per width
    dropout: float = 0.1
    pooling: Literal["cls", "cls_max"] = "cls"  # linear and mlp heads
    # the encoder states read, concatenated along the width: 0 the embedding layer's output,
    # i the output of layer i, -1 the last layer's (see tibnlp.models.encoder.EncoderOutput)
    layers: list[int] = field(default_factory=lambda: [-1])
    # > 0: a frozen word-vector table of this width is read beside the states (the static
    # channel, `finetune.static_vectors`); its rows are weights of the classifier, never trained
    static_size: int = 0

    @property
    def reads_last_only(self) -> bool:
        return self.layers == [-1] and not self.static_size

    def validate(self, prefix: str) -> None:
        check_layers(self.layers, f"{prefix}.layers")
        check(len(self.kernels) >= 1, f"{prefix}.kernels", "needs at least one width")
        check(all(k >= 1 for k in self.kernels), f"{prefix}.kernels", "widths must be >= 1")
        check(self.channels >= 1, f"{prefix}.channels", "must be >= 1")
        check(0.0 <= self.dropout < 1.0, f"{prefix}.dropout", "must be in [0, 1)")
        check(self.static_size >= 0, f"{prefix}.static_size", "must be >= 0 (0 = none)")


def masked_max(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Max over the real (mask == 1) positions of [B, N, D]; padding never wins."""
    fill = torch.finfo(hidden.dtype).min
    return hidden.masked_fill(~mask.bool().unsqueeze(-1), fill).amax(dim=1)


class TextCNNHead(nn.Module):
    def __init__(
        self,
        hidden_size: int,
        num_labels: int,
        kernels: list[int] | tuple[int, ...] = (2, 3, 4),
        channels: int = 128,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        self.kernels = list(kernels)
        self.convs = nn.ModuleList(nn.Conv1d(hidden_size, channels, k) for k in self.kernels)
        self.dropout = nn.Dropout(dropout)
        self.out = nn.Linear(channels * len(self.kernels), num_labels)

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        mask = attention_mask.bool()
        x = hidden.masked_fill(~mask.unsqueeze(-1), 0.0)
        longest = max(self.kernels)
        if x.size(1) < longest:  # a batch of very short texts: pad so every width fits once
            x = nn.functional.pad(x, (0, 0, 0, longest - x.size(1)))
        x = x.transpose(1, 2)  # [B, D, N]
        lengths = mask.sum(dim=1)  # real tokens per sequence
        pooled = []
        for k, conv in zip(self.kernels, self.convs, strict=True):
            feats = torch.relu(conv(x))  # [B, C, N-k+1]
            starts = torch.arange(feats.size(-1), device=feats.device)
            # a window is real when it ends inside the text; a text shorter than k keeps window 0
            last = (lengths - k).clamp(min=0).unsqueeze(1)
            valid = starts.unsqueeze(0) <= last  # [B, N-k+1]
            feats = feats.masked_fill(~valid.unsqueeze(1), torch.finfo(feats.dtype).min)
            pooled.append(feats.amax(dim=-1))
        return self.out(self.dropout(torch.cat(pooled, dim=-1)))


def sentence_vector(
    hidden: torch.Tensor, attention_mask: torch.Tensor, pooling: Literal["cls", "cls_max"]
) -> torch.Tensor:
    """[B, D] `[CLS]` state, or [B, 2D] `[CLS]` ++ max-pool over the real tokens (`cls_max`)."""
    if pooling == "cls":
        return hidden[:, 0]
    return torch.cat([hidden[:, 0], masked_max(hidden, attention_mask)], dim=-1)


class LinearHead(nn.Module):
    """Dropout + linear on the sentence vector; with `mlp`, two layers: first a linear to the
    hidden width, ReLU and dropout (the multi-scale paper's classifier with `cls_max`)."""

    def __init__(
        self,
        hidden_size: int,
        num_labels: int,
        pooling: Literal["cls", "cls_max"] = "cls",
        dropout: float = 0.1,
        mlp: bool = False,
    ) -> None:
        super().__init__()
        self.pooling = pooling
        width = hidden_size * (2 if pooling == "cls_max" else 1)
        self.dropout = nn.Dropout(dropout)
        self.hidden = nn.Linear(width, hidden_size) if mlp else None
        self.out = nn.Linear(hidden_size if mlp else width, num_labels)

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        vector = self.dropout(sentence_vector(hidden, attention_mask, self.pooling))
        if self.hidden is not None:
            vector = self.dropout(torch.relu(self.hidden(vector)))
        return self.out(vector)


def build_head(cfg: HeadConfig, hidden_size: int, num_labels: int) -> nn.Module:
    if cfg.kind == "cnn":
        return TextCNNHead(hidden_size, num_labels, cfg.kernels, cfg.channels, cfg.dropout)
    return LinearHead(hidden_size, num_labels, cfg.pooling, cfg.dropout, mlp=cfg.kind == "mlp")


def resolve_pooling(
    pooling: Literal["auto", "cls", "cls_max"], model: ModelConfig
) -> Literal["cls", "cls_max"]:
    """`finetune.pooling` for an encoder of shape `model`: auto is the multi-scale paper's
    [CLS] ++ max-pool on a multi-scale encoder (MODELS.md section 3), [CLS] on any other."""
    if pooling == "auto":
        return "cls_max" if model.scales.enabled else "cls"
    return pooling


def head_config(ft: FinetuneConfig, model: ModelConfig) -> HeadConfig:
    """The head `finetune` settings describe (kind, CNN widths, dropout, pooling) on an
    encoder of shape `model`. The CNN head reads no pooling: it records `cls`, as before the
    default became auto, so its classifier.yaml and its seeds' key stay those it had."""
    pooling = "cls" if ft.head == "cnn" else resolve_pooling(ft.pooling, model)
    return HeadConfig(
        ft.head, list(ft.cnn_kernels), ft.cnn_channels, ft.dropout, pooling, list(ft.layers)
    )


class EmbeddingEncoder(nn.Module):
    """Token embeddings only: the encoder of the from-scratch TextCNN-on-pieces baseline."""

    def __init__(self, vocab_size: int, embedding_size: int = 128, dropout: float = 0.1) -> None:
        super().__init__()
        self.hidden_size = embedding_size
        self.embeddings = nn.Embedding(vocab_size, embedding_size, padding_idx=0)
        self.dropout = nn.Dropout(dropout)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return self.dropout(self.embeddings(input_ids))


def _hidden_size(encoder: nn.Module) -> int:
    size = getattr(encoder, "hidden_size", None)
    if size is None:
        size = getattr(getattr(encoder, "cfg", None), "hidden_size", None)
    if size is None:
        raise ValueError("cannot infer the encoder's hidden size; pass hidden_size=")
    return int(size)


class Classifier(nn.Module):
    """`encoder` + head. `head` is "cnn", "linear", "mlp" or a full `HeadConfig`."""

    static_vectors: torch.Tensor | None

    def __init__(
        self,
        encoder: nn.Module,
        num_labels: int,
        head: str | HeadConfig = "cnn",
        hidden_size: int | None = None,
        **head_options: Any,
    ) -> None:
        super().__init__()
        if isinstance(head, str):
            if head not in ("cnn", "linear", "mlp"):
                raise ValueError(f"unknown head {head!r}; use 'cnn', 'linear' or 'mlp'")
            head = HeadConfig(kind=head, **head_options)  # type: ignore[arg-type]
        self.head_config = head
        self.num_labels = num_labels
        self.encoder = encoder
        if not head.reads_last_only and not isinstance(encoder, Encoder):
            raise ValueError(
                f"head layers {head.layers} (static channel {head.static_size}) need the "
                f"transformer encoder read whole (got {type(encoder).__name__}); use layers "
                "[-1] and no static channel"
            )
        # the index of the last layer's state (-1 says the same)
        self.last_state = encoder.cfg.num_layers if isinstance(encoder, Encoder) else -1
        width = (hidden_size or _hidden_size(encoder)) * len(head.layers) + head.static_size
        # the static channel: a buffer, so no optimizer or freeze setting ever moves it, saved
        # with the weights (filled by fine-tuning: pretrained vectors, or random for a twin)
        table = None
        if head.static_size:
            assert isinstance(encoder, Encoder)
            table = torch.zeros(encoder.cfg.vocab_size, head.static_size)
        self.register_buffer("static_vectors", table)
        self.head = build_head(head, width, num_labels)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return self.classify(input_ids, attention_mask, token_type_ids)[0]

    def classify(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits, and the share of the batch's texts that took the large head route (None
        when the encoder reports no routing, e.g. the embedding encoder)."""
        if not self.head_config.reads_last_only:
            return self._classify_states(input_ids, attention_mask, token_type_ids)
        out = self.encoder(input_ids, attention_mask, token_type_ids)
        if isinstance(out, torch.Tensor):
            return self.head(out, attention_mask), None
        return self.head(out.hidden, attention_mask), getattr(out, "route_large_fraction", None)

    def _classify_states(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The head over several encoder states side by side, and the static channel's vectors
        when there is one. The last layer's state is normalised already (final norm, or
        post-LN); the others are layer-normalised here, without parameters, so that each enters
        the head at the same scale."""
        layers = self.head_config.layers
        out = self.encoder(input_ids, attention_mask, token_type_ids, states=tuple(layers))
        parts = [
            s if i in (-1, self.last_state) else nn.functional.layer_norm(s, s.shape[-1:])
            for i, s in zip(layers, out.states, strict=True)
        ]
        if self.static_vectors is not None:  # normalised like the states; padding stays zero
            static = nn.functional.layer_norm(
                self.static_vectors[input_ids], self.static_vectors.shape[-1:]
            )
            parts.append(static * attention_mask.unsqueeze(-1).to(static.dtype))
        # padding: zero in every state, and a parameter-free norm keeps a zero vector zero
        return self.head(torch.cat(parts, dim=-1), attention_mask), out.route_large_fraction

    def freeze_encoder(self, frozen: bool = True) -> None:
        """Freeze or unfreeze the encoder; weights a reader never trains (its
        `frozen_parameters`, e.g. GEMFormer's selector) stay frozen either way."""
        for p in self.encoder.parameters():
            p.requires_grad_(not frozen)
        for p in getattr(self.encoder, "frozen_parameters", list)():
            p.requires_grad_(False)
