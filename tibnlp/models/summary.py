"""What a config builds, for `tibnlp model describe`: head distributions and parameter counts."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tibnlp.config.model import ModelConfig
from tibnlp.config.train import PretrainConfig
from tibnlp.models.attention import core_name, head_distribution
from tibnlp.models.electra import generator_config
from tibnlp.models.objectives import heads_name, pretraining_model


@dataclass
class ModelSummary:
    """`distributions[h]` holds, per layer, the heads given to each of `scales` (h = a route)."""

    core: str
    scales: list[str]
    distributions: dict[int, list[list[int]]]
    parameters: dict[str, int]


def describe(cfg: ModelConfig, pretrain: PretrainConfig | None = None) -> ModelSummary:
    """Summarise `cfg` without needing data (an unresolved 'auto' threshold is fine here),
    with the heads `pretrain` trains (default: MLM + SOP)."""
    heads = sorted({cfg.heads.small, cfg.heads.large})
    scales = list(cfg.scales.windows) or ["N"]
    dists = {
        h: head_distribution(cfg.num_layers, h, len(scales), cfg.scales.alpha)
        if cfg.scales.enabled
        else [[h] for _ in range(cfg.num_layers)]
        for h in heads
    }
    counting = dataclasses.replace(cfg, heads=dataclasses.replace(cfg.heads, threshold=0))
    p = pretrain or PretrainConfig()
    model = pretraining_model(counting, p)
    enc = model.encoder

    def count(module: object) -> int:
        return sum(p.numel() for p in module.parameters())  # type: ignore[attr-defined]

    params = {"embeddings": count(enc.embeddings)}
    # a route's weights in every layer that owns one (one layer when layers are shared)
    owners = [enc.layer, *enc.later_layers]
    each = "" if len(owners) == 1 else f", {len(owners)} layers"
    for h in heads:
        routes = sum(count(layer.attention.route(h)) for layer in owners)
        params[f"attention route h={h}{each}"] = routes
    if cfg.share_layers:
        params["shared layer (all)"] = count(enc.layer)
    else:
        params[f"{cfg.num_layers} unshared layers"] = count(enc.layer) + count(enc.later_layers)
    # the rest of the encoder, so the parts above add up to it
    if enc.memory_tokens is not None:
        params["memory tokens"] = count(enc.memory_tokens)
    if enc.final_norm is not None:
        params["final norm (norm: pre)"] = count(enc.final_norm)
    params["encoder"] = count(enc)
    params[f"pretraining heads ({heads_name(p)})"] = count(model) - count(enc)
    params["total"] = count(model)
    return ModelSummary(core_name(cfg), scales, dists, params)


def training_flops_per_token(cfg: ModelConfig, seq_len: int, mask_prob: float) -> float:
    """Analytic training FLOPs per input token: 6 x the weights a token passes through, plus
    attention scores and mixing (12 x layers x keys x hidden), the MLM head at the masked
    share only. Dense upper bound: the sparse last layer, padding cuts and narrower windows
    are not counted.

    What a design adds: `fusion` runs three masked attentions (each its own Q/K/V and
    output projection, each over every key) and the D -> 4D gate; `memory_tokens: k` runs the
    layers over k more positions per sequence (k / seq_len more per input token); the
    FFN-free multi-scale layer (`scales.ffn: false`) has no FFN; segment recurrence
    (`recurrence.mem_len: M`) gives every layer M more keys (`_recurrence_flops`). `W_R`'s
    projection of the relative distance table runs once per batch, not per token, and is not
    counted (0.1 % of the quickstart shape's count at batch 64).

    Why analytic: on a shared or varying CPU, a budget in FLOPs and tokens compares runs
    where wall-clock time cannot (issue 11's budget rule)."""
    d, e, f, layers = cfg.hidden_size, cfg.embedding_size, cfg.ffn_size, cfg.num_layers
    attentions = 3 if cfg.fusion.enabled else 1
    has_ffn = cfg.scales.ffn or not cfg.scales.enabled
    per_layer = attentions * 4 * d * d  # Q, K, V, O of each attention
    per_layer += (4 * d * d if cfg.fusion.enabled else 0) + (2 * d * f if has_ffn else 0)
    positions = seq_len + cfg.memory_tokens  # what the layers run over, per sequence
    share = positions / seq_len
    weights = e * d + share * layers * per_layer + mask_prob * (d * e + e * cfg.vocab_size)
    attention = 12.0 * attentions * layers * positions * d * share
    if cfg.position == "relative":
        attention += 6.0 * layers * (2 * positions - 1) * d * share
    return 6.0 * weights + attention + _recurrence_flops(cfg, seq_len)


def _recurrence_flops(cfg: ModelConfig, seq_len: int) -> float:
    """What segment recurrence's memory adds per input token: 0 without it.

    Every layer's attention reads `mem_len` more keys (the previous segment's states, gradient
    stopped, concatenated before the segment's own): each query of the segment scores them
    and mixes their values (12 x layers x M x hidden per query, as for the segment's keys),
    their relative-position term covers M more distances (6 x layers x M x hidden per query),
    and their keys and values are projected again at every segment (2 D x D weights for M
    states per sequence; the backward pass computes those rows' input gradient too, since
    they enter the same matmul as the segment, so 6 x as for any weight). Why count them: a
    recurrent run reads M more keys than a plain one of the same `seq_len`, and a FLOPs
    budget that ignored them compared it with the others at a discount. Upper bound: the
    memory is counted full (`mem_len` states) for every segment, where a chain's first
    segment has none and its second at most one segment's worth."""
    m = cfg.recurrence.mem_len
    if m == 0:
        return 0.0
    d, layers = cfg.hidden_size, cfg.num_layers
    share = (seq_len + cfg.memory_tokens) / seq_len  # queries per input token
    per_query = 12.0 * m * d + (6.0 * m * d if cfg.position == "relative" else 0.0)
    projection = 6.0 * 2 * d * d * m / seq_len
    return layers * (share * per_query + projection)


def electra_flops_per_token(
    cfg: ModelConfig, seq_len: int, mask_prob: float, generator_ratio: float
) -> float:
    """`training_flops_per_token` of replaced-token detection: the generator (an MLM model of
    `generator_config`'s shape) plus the discriminator at every position with its detection
    head (D x D + D), and no MLM head of its own."""
    generator = training_flops_per_token(generator_config(cfg, generator_ratio), seq_len, mask_prob)
    d = cfg.hidden_size
    discriminator = training_flops_per_token(cfg, seq_len, 0.0) + 6.0 * (d * d + d)
    return generator + discriminator
