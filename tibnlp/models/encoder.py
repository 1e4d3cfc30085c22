"""ALBERT-tiny encoder (MODELS.md section 1): factorized embeddings, one shared post-LN layer
(or, with `model.share_layers: false`, one per depth).

The layer's attention is `RoutedAttention` (fixed or dynamic head count) around the core the
config selects. The batch is cut to its longest real sequence before the layers run, so a
padded batch costs what its real tokens cost; padding outputs are zero.

Designs of MODELS.md sections 4 and 6 enter here: `position: relative` drops the absolute
position embedding, `memory_tokens: k` prepends k learned [MEM] states (dropped from the
output), and `recurrence.mem_len` makes `forward` take and return a `SegmentMemory`. Readers of
documents longer than one window are built on top of this module, in
`tibnlp.models.long_documents`; the pieces it needs below it are `memory_tokens` and
`segment_memory`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tibnlp.config.model import ModelConfig
from tibnlp.models.attention import AttentionContext, build_attention, choose_large
from tibnlp.models.memory_tokens import MemoryTokens
from tibnlp.models.segment_memory import SegmentMemory, next_memory


@dataclass
class EncoderOutput:
    """`hidden` [B, N, D] of the last layer; `large` [B] bool: which sequences took the large
    head route (all False for fixed heads); `route_large_fraction`: its mean (for logging).
    `memory`: the memory to pass to the next segment (None unless recurrence is on)."""

    hidden: torch.Tensor
    large: torch.Tensor
    route_large_fraction: torch.Tensor
    memory: SegmentMemory | None = None
    # `forward(states=...)`: the states asked for, in that order ([B, N, D] each, padding
    # zero): 0 the embedding layer's output (after the E -> D projection), i in 1..L-1 the
    # output of layer i before any final norm, L (or -1) `hidden`
    states: list[torch.Tensor] | None = None


class Embeddings(nn.Module):
    """Token + absolute position + segment embeddings of width E, then the E -> D projection.

    With `position: relative` there is no position embedding: attention encodes distances."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        e = cfg.embedding_size
        self.word = nn.Embedding(cfg.vocab_size, e)
        self.position = nn.Embedding(cfg.max_len, e) if cfg.position == "absolute" else None
        self.segment = nn.Embedding(2, e)
        self.norm = nn.LayerNorm(e, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.dropout)
        self.project = nn.Linear(e, cfg.hidden_size)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        x = self.word(input_ids) + self.segment(token_type_ids)
        if self.position is not None:
            x = x + self.position(torch.arange(input_ids.shape[1], device=input_ids.device))[None]
        return self.project(self.dropout(self.norm(x)))


class SharedLayer(nn.Module):
    """Post-LN transformer layer; with `scales.ffn: false` the paper's norm(H + ReLU(MSMSA(H))).

    With `norm: pre` the norms move in front of attention and FFN (x + f(norm(x))); the
    encoder then applies `final_norm` after the last layer."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        d = cfg.hidden_size
        self.pre_norm = cfg.norm == "pre"
        self.attention = build_attention(cfg)
        self.attention_norm = nn.LayerNorm(d, eps=cfg.layer_norm_eps)
        self.use_ffn = cfg.scales.ffn or not cfg.scales.enabled
        if self.use_ffn:
            self.ffn_in = nn.Linear(d, cfg.ffn_size)
            self.ffn_out = nn.Linear(cfg.ffn_size, d)
            self.ffn_norm = nn.LayerNorm(d, eps=cfg.layer_norm_eps)
            self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, ctx: AttentionContext, large: torch.Tensor) -> torch.Tensor:
        """[B, N, D] -> [B, N, D]; [B, Q, D] at `ctx.queries` when given (keys from all N)."""
        if self.pre_norm:
            return self._forward_pre(x, ctx, large)
        a = self.attention(x, ctx, large)
        x = ctx.gather_queries(x)
        if not self.use_ffn:
            return self.attention_norm(x + F.relu(a))
        x = self.attention_norm(x + a)
        return self.ffn_norm(x + self._ffn(x))

    def _ffn(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.ffn_out(F.gelu(self.ffn_in(x))))

    def _forward_pre(
        self, x: torch.Tensor, ctx: AttentionContext, large: torch.Tensor
    ) -> torch.Tensor:
        a = self.attention(self.attention_norm(x), ctx, large)
        x = ctx.gather_queries(x)
        if not self.use_ffn:
            return x + F.relu(a)
        x = x + a
        return x + self._ffn(self.ffn_norm(x))


class Encoder(nn.Module):
    """`forward(input_ids [B,N], attention_mask [B,N], token_type_ids=None) -> EncoderOutput`.

    Padding must be on the right (real tokens a prefix of each row), which the data stage
    guarantees; windows and routes read each row's real length from the mask.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        # the head-routing rule in force: cfg.heads, or per text at evaluation
        # (`tibnlp.models.attention.dynamic.per_text_routing`)
        self.routing = cfg.heads
        self.embeddings = Embeddings(cfg)
        self.layer = SharedLayer(cfg)  # the first layer; with model.share_layers, the only one
        # layers 2..L when model.share_layers is false (`layer` keeps its name either way, so
        # shared models' saved weights and the Hugging Face export stay as they were)
        self.later_layers = nn.ModuleList(
            [] if cfg.share_layers else [SharedLayer(cfg) for _ in range(cfg.num_layers - 1)]
        )
        self.final_norm = (
            nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps) if cfg.norm == "pre" else None
        )
        self.memory_tokens = (
            MemoryTokens(cfg.memory_tokens, cfg.hidden_size, cfg.initializer_range)
            if cfg.memory_tokens
            else None
        )
        self.apply(lambda m: init_weights(m, cfg.initializer_range))
        if self.embeddings.position is not None and cfg.position_init == "sinusoidal":
            table = sinusoids(cfg.max_len, cfg.embedding_size)
            with torch.no_grad():
                self.embeddings.position.weight.copy_(table * (cfg.initializer_range / table.std()))

    def layer_at(self, index: int) -> SharedLayer:
        """The weights layer `index` (0-based) runs: the shared layer, or its own."""
        if index == 0 or not len(self.later_layers):
            return self.layer
        return self.later_layers[index - 1]  # type: ignore[return-value]

    @property
    def supports_sparse_outputs(self) -> bool:
        """Whether `forward(outputs_at=...)` can skip work (the attention's cores allow it)."""
        return bool(getattr(self.layer.attention, "supports_query_subset", False))

    @property
    def sentence_dim(self) -> int:
        """Width of `sentence_vector` (the [CLS] state)."""
        return self.cfg.hidden_size

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        memory: SegmentMemory | None = None,
        outputs_at: torch.Tensor | None = None,
        states: tuple[int, ...] = (),
    ) -> EncoderOutput:
        """`memory`: the previous segment's `EncoderOutput.memory` (recurrence only).

        `states`: indices of the states to return in `EncoderOutput.states` beside `hidden`
        (0 the embedding layer's output, L or -1 the last layer's; see `EncoderOutput`).

        `outputs_at` [B, N] bool: the only positions whose output the caller reads (e.g. the
        masked tokens and [CLS] in pretraining). Where the attention allows it, the last layer
        then runs queries, FFN and norms at those positions only (keys and values still at
        all), and `hidden` is zero elsewhere; the selected outputs equal the full run's.

        Under `torch.compile` the steps that read the data on the host (the right-padding
        check, the padding cut, the sparse last layer) are left out, so the forward traces as
        one graph: same outputs at every position a caller reads, padding computed.
        """
        mask = attention_mask.bool()
        compiling = torch.compiler.is_compiling()
        if not compiling and mask.shape[1] > 1 and bool((mask[:, 1:] & ~mask[:, :-1]).any()):
            raise ValueError("attention_mask must mark real tokens as a prefix (right padding)")
        lengths = mask.sum(1)
        n = input_ids.shape[1]
        if n > self.cfg.max_len:
            raise ValueError(f"sequence length {n} exceeds model.max_len {self.cfg.max_len}")
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        # cut shared padding: it would only cost compute (not under compile: a host sync)
        keep = n if compiling else max(int(lengths.max()), 1)
        large = choose_large(lengths, self.routing)
        x = self.embeddings(input_ids[:, :keep], token_type_ids[:, :keep])
        real = mask[:, :keep]
        k = 0
        if self.memory_tokens is not None:
            x, real, k = *self.memory_tokens.prepend(x, real), self.memory_tokens.count
        ctx = AttentionContext(real, real.sum(1), 0, self.cfg.num_layers)
        recurrent = self.cfg.recurrence.enabled
        if memory is not None and not recurrent:
            raise ValueError("memory given to an encoder without model.recurrence.mem_len")
        want = None
        if outputs_at is not None and self.supports_sparse_outputs and not compiling:
            want = outputs_at[:, :keep].bool() & real[:, k:]
            queries, valid = _query_positions(want)
        layer_inputs = []
        last = self.cfg.num_layers - 1
        wanted = {self._state_index(i) for i in states}
        kept: dict[int, torch.Tensor] = {0: x} if 0 in wanted else {}
        for layer in range(self.cfg.num_layers):
            lctx = ctx.at_layer(layer)
            if memory is not None:
                lctx = dataclasses.replace(
                    lctx, memory=memory.states[layer], memory_mask=memory.mask
                )
            if want is not None and layer == last:
                lctx = dataclasses.replace(lctx, queries=queries + k)
            block = self.layer_at(layer)
            if recurrent:  # the memory holds what this layer's attention reads
                layer_inputs.append((block.attention_norm(x) if self.final_norm else x)[:, k:])
            x = block(x, lctx, large)
            if layer + 1 in wanted and layer < last:
                kept[layer + 1] = x
        if self.final_norm is not None:
            x = self.final_norm(x)
        if want is not None:  # [B, Q, D] at the wanted positions -> [B, keep, D], zero elsewhere
            sparse = x.new_zeros(x.shape[0], keep, x.shape[-1])
            sparse[want] = x[valid]
            x = sparse
        else:
            x = x[:, k:]
        x = _pad_back(x, mask[:, :keep], n)
        new_memory = (
            next_memory(memory, layer_inputs, mask[:, :keep], self.cfg.recurrence.mem_len)
            if recurrent
            else None
        )
        asked = None
        if states:
            asked = [
                x if j == self.cfg.num_layers else _pad_back(kept[j][:, k:], mask[:, :keep], n)
                for j in (self._state_index(i) for i in states)
            ]
        return EncoderOutput(x, large, large.float().mean(), new_memory, asked)

    def _state_index(self, index: int) -> int:
        """`forward(states=...)` index -> 0..L (-1 is L)."""
        count = self.cfg.num_layers
        if not -1 <= index <= count:
            raise ValueError(f"state {index} does not exist: use 0..{count}, or -1 for the last")
        return count if index == -1 else index

    def sentence_vector(self, output: EncoderOutput, attention_mask: torch.Tensor) -> torch.Tensor:
        """[B, sentence_dim]: the [CLS] state. A classifier pools in its head
        (`finetune.pooling`), over the token states it is given."""
        return output.hidden[:, 0]


def _pad_back(x: torch.Tensor, mask: torch.Tensor, n: int) -> torch.Tensor:
    """States of the `keep` kept positions -> [B, n, D], padding positions zero."""
    x = x * mask.unsqueeze(-1).to(x.dtype)
    return F.pad(x, (0, 0, 0, n - x.shape[1])) if x.shape[1] < n else x


def _query_positions(want: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, N] bool -> (positions [B, Q] long ascending per row, padded with 0; valid [B, Q]),
    Q the largest count in a row: row-major `valid` entries match row-major `want` ones."""
    counts = want.sum(1)
    q = max(int(counts.max()), 1)
    order = torch.argsort((~want).to(torch.uint8), dim=1, stable=True)[:, :q]
    valid = torch.arange(q, device=want.device)[None, :] < counts[:, None]
    return torch.where(valid, order, torch.zeros_like(order)), valid


def sinusoids(length: int, width: int) -> torch.Tensor:
    """[length, width] Transformer position table (Vaswani et al. 2017): sin on even, cos on
    odd columns, wavelengths 2pi .. 10000 * 2pi. The dot product of two rows depends only on
    their offset."""
    pos = torch.arange(length, dtype=torch.float)[:, None]
    freq = torch.exp(torch.arange(0, width, 2, dtype=torch.float) * (-math.log(10000.0) / width))
    table = torch.zeros(length, width)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq[: width // 2])
    return table


def init_weights(module: nn.Module, std: float) -> None:
    """BERT/ALBERT initialisation: N(0, std) weights, zero biases, unit LayerNorm."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=std)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)
