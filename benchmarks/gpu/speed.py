"""`run speed`: pretraining tokens/s of our ALBERT-tiny against transformers' AlbertForPreTraining
at the same shape on the same device, and one layer of each attention design against dense.

Models: vocab 30000, E=128, D=384, 4 shared layers, 12 heads, FFN 1536, MLM + SOP, dropout 0,
AdamW, fully packed batches with 15% MLM targets, bf16 autocast on CUDA (fp32 weights and
optimizer in both; fp32 on CPU), sequence 128 and 512. All variants live in one process and
run alternately, round after round, so drifts hit all alike; then, in a block of its own with
the eager transformers model as its baseline again, `torch.compile` (`compile`: ours, or both).
MFU = tokens/s x analytic training FLOPs per token (`training_flops_per_token`, the same count
for both models: transformers' dense MLM projection is its own waste, not extra useful work)
/ the measured matmul peak. Memory: the device's peak during one step (weights, AdamW state,
activations). GPU busy share: NVML utilisation sampled during the timed rounds.

Layers (one shared ALBERT layer, forward + backward, N=512): dense, multi-scale (the paper's
windows; FlexAttention on CUDA) and dynamic heads (8/12), eager and compiled; and, where the
layer takes FlexAttention, its per-call `BlockMask` build timed alone (a share of its time).

Blocks run eager first and compiled last (`blocks` picks some), and `run_speed` hands the table
so far to `emit` after each: a lease that runs out during compilation still brings the eager
figures back; the compiled layers come in small sub-blocks for the same reason.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from benchmarks.gpu import timing
from tibnlp.config.model import PAPER_WINDOWS, HeadsConfig, ModelConfig, ScalesConfig
from tibnlp.models.attention.flex import BLOCK

BLOCKS = ("models", "layers", "compiled-models", "compiled-layers", "compiled-tiles")


@dataclass
class SpeedSettings:
    device: str
    vocab: int = 30000
    emb: int = 128
    hidden: int = 384
    layers: int = 4
    heads: int = 12
    ffn: int = 1536
    shapes: tuple[tuple[int, int], ...] = ((128, 256), (512, 64))  # (seq, batch)
    rounds: int = 3
    steps: int = 10
    compile: str = "ours"  # none | ours | all (transformers compiled too: minutes more)
    # one layer at N=512: batch 16 (the first leases' rows, launch-bound: dense does ~5 % of the
    # card's peak) and 64 (the model rows' batch at 512, where the layer's work shows)
    layer_batches: tuple[int, ...] = (16, 64)
    peak_n: int = 8192
    # which blocks run, in this order: eager models, eager layers, then (compile != none)
    # compiled models and compiled layers. A lease that has the eager figures already spends
    # its minutes on the compiled layers alone (`--blocks compiled-layers`); compiled-tiles:
    # the multi-scale layers at 128- and 64-token FlexAttention tiles, the largest batch only
    blocks: tuple[str, ...] = BLOCKS

    @classmethod
    def tiny(cls) -> SpeedSettings:
        """CPU mode: every code path at toy sizes (no compile: minutes of inductor on CPU)."""
        return cls("cpu", 500, 16, 32, 2, 4, 64, ((16, 4), (32, 2)), 2, 1, "none", (2,), 256)

    def __post_init__(self) -> None:
        if self.compile not in ("none", "ours", "all"):
            raise ValueError(f"SpeedSettings.compile: {self.compile!r} (none, ours or all)")
        unknown = [b for b in self.blocks if b not in BLOCKS]
        if unknown or not self.blocks:
            raise ValueError(f"SpeedSettings.blocks: {list(self.blocks)!r}: name some of {BLOCKS}")
        if self.compile == "none" and all(b.startswith("compiled") for b in self.blocks):
            raise ValueError("SpeedSettings.blocks: compiled blocks need compile ours or all")


WINDOWS = list(PAPER_WINDOWS)
TILE64, TILE64_FREE = "multi-scale, 64-token tiles", "multi-scale, FFN-free, 64-token tiles"


def _ours_cfg(s: SpeedSettings, **kw: Any) -> ModelConfig:
    return ModelConfig(
        vocab_size=s.vocab,
        embedding_size=s.emb,
        hidden_size=s.hidden,
        num_layers=s.layers,
        ffn_size=s.ffn,
        dropout=0.0,
        attention_dropout=0.0,
        heads=kw.pop("heads", HeadsConfig(small=s.heads, large=s.heads)),
        **kw,
    )


def build_model(variant: str, s: SpeedSettings, sparse_last_layer: bool = True) -> torch.nn.Module:
    """The pretraining model of a row at the settings' shape: transformers'
    `AlbertForPreTraining` (SDPA attention, no dropout) for a `transformers*` variant, ours
    otherwise. `benchmarks/bench_vs_transformers.py` builds its CPU rows with it too."""
    if variant.startswith("transformers"):
        from transformers import AlbertConfig, AlbertForPreTraining

        hf = AlbertConfig(
            vocab_size=s.vocab,
            embedding_size=s.emb,
            hidden_size=s.hidden,
            num_hidden_layers=s.layers,
            num_attention_heads=s.heads,
            intermediate_size=s.ffn,
            max_position_embeddings=512,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            attn_implementation="sdpa",
        )
        model = AlbertForPreTraining(hf)
        assert model.config._attn_implementation == "sdpa"
        return model
    from tibnlp.models import AlbertForPretraining

    return AlbertForPretraining(_ours_cfg(s), sparse_last_layer=sparse_last_layer)


def random_batch(s: SpeedSettings, batch: int, seq: int) -> dict[str, torch.Tensor]:
    """A fully packed batch of random pieces, 15 % of them MLM targets, random SOP labels:
    every row of a speed comparison trains on the same one."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, s.vocab, (batch, seq), generator=g)
    chosen = torch.rand(batch, seq, generator=g) < 0.15
    chosen[:, 0] = False
    out = {
        "ids": ids,
        "mask": torch.ones(batch, seq, dtype=torch.long),
        "types": (torch.arange(seq)[None, :] >= seq // 2).long().expand(batch, seq).contiguous(),
        "labels": torch.where(chosen, ids, torch.full_like(ids, -100)),
        "sop": torch.randint(0, 2, (batch,), generator=g),
    }
    return {k: v.to(s.device) for k, v in out.items()}


def _compile(module: torch.nn.Module) -> Callable[..., Any]:
    """`torch.compile` under the engine's dynamo settings (`engine.configure_dynamo`): the
    dense and relative pretraining models trace as one graph (the H200's compiled half of
    2026-11-26 ran with 19 breaks before); multi-scale recompiles per layer distribution."""
    from tibnlp.training.engine import configure_dynamo

    configure_dynamo()
    return torch.compile(module)


def _stepper(variant: str, s: SpeedSettings, batch: int, seq: int) -> Callable[[], None]:
    torch.manual_seed(0)
    model = build_model(variant, s).to(s.device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=s.device == "cuda")
    x = random_batch(s, batch, seq)
    hf = variant.startswith("transformers")
    forward = _compile(model) if variant.endswith("compiled") else model

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(s.device, dtype=torch.bfloat16, enabled=s.device == "cuda"):
            if hf:
                out = forward(
                    input_ids=x["ids"],
                    attention_mask=x["mask"],
                    token_type_ids=x["types"],
                    labels=x["labels"],
                    sentence_order_label=x["sop"],
                )
            else:
                out = forward(x["ids"], x["mask"], x["types"], x["labels"], x["sop"])
        out["loss"].backward()
        opt.step()

    return step


def model_rows(s: SpeedSettings, peak: float, names: list[str]) -> list[dict[str, Any]]:
    """Tokens/s of `names` (the first is the baseline of `vs_transformers`), alternating."""
    from tibnlp.models.summary import training_flops_per_token

    rows = []
    for seq, batch in s.shapes:
        steps = {v: _stepper(v, s, batch, seq) for v in names}
        memory = {}
        for v, step in steps.items():
            step()  # warm-up (compiles, allocates the optimizer state)
            memory[v] = timing.peak_memory(step, s.device)
        rates: dict[str, list[float]] = {v: [] for v in names}
        with timing.busy_share(s.device) as busy:
            for _ in range(s.rounds):
                for v, step in steps.items():
                    rates[v].append(batch * seq / timing.timed(step, s.device, s.steps))
        flops = training_flops_per_token(_ours_cfg(s), seq, 0.15)
        base = statistics.median(rates[names[0]])
        for v in names:
            med = statistics.median(rates[v])
            rows.append(
                {
                    "seq": seq,
                    "batch": batch,
                    "variant": v,
                    "tokens_per_s": med,
                    "vs_transformers": med / base,
                    "mfu": med * flops / peak,
                    "peak_mib": memory[v],
                    "rounds": rates[v],
                    "gpu_busy": busy["busy"],
                }
            )
        del steps
        if s.device == "cuda":
            torch.cuda.empty_cache()
    return rows


def _layer_step(
    cfg: ModelConfig, s: SpeedSettings, b: int, n: int, compiled: bool, tile: int = BLOCK
) -> tuple[Callable[[], None], int]:
    """One step of the layer and the number of layer calls in it (multi-scale: one per layer
    distribution, so its time per call is comparable with dense's one call). `tile`: the
    multi-scale cores' FlexAttention tile."""
    from tibnlp.models.attention import AttentionContext, choose_large
    from tibnlp.models.attention.multiscale import MultiScaleCore
    from tibnlp.models.encoder import SharedLayer

    torch.manual_seed(0)
    layer = SharedLayer(cfg).to(s.device)
    for core in layer.modules():
        if isinstance(core, MultiScaleCore):
            core.tile = tile
    x = torch.randn(b, n, cfg.hidden_size, device=s.device, requires_grad=True)
    lens = torch.full((b,), n, device=s.device)
    mask = torch.ones(b, n, dtype=torch.bool, device=s.device)
    large = choose_large(lens, cfg.heads)
    layers = cfg.num_layers if cfg.scales.enabled else 1  # multi-scale: every distribution
    ctxs = [AttentionContext(mask, lens, i, cfg.num_layers) for i in range(layers)]
    run = _compile(layer) if compiled else layer

    def step() -> None:
        with torch.autocast(s.device, dtype=torch.bfloat16, enabled=s.device == "cuda"):
            y = sum(run(x, ctx, large).float().sum() for ctx in ctxs) / layers
        y.backward()  # type: ignore[union-attr]

    return step, layers


def layer_rows(
    s: SpeedSettings,
    compiled: bool,
    n: int = 512,
    batches: tuple[int, ...] | None = None,
    names: tuple[str, ...] | None = None,
) -> list[dict[str, Any]]:
    """Time per layer call of each design against dense, alternating, at each batch of
    `batches` (default: the settings'); `names` limits the designs. Dense is always timed and
    its row always kept: it is the base of the rows after it (compiled, dense's time moved by
    up to a third between sub-blocks on an H200, so a ratio is read against its own base)."""
    multi = _ours_cfg(s, scales=ScalesConfig(windows=WINDOWS, alpha=0.5))
    ffn_free = _ours_cfg(s, scales=ScalesConfig(windows=WINDOWS, alpha=0.5, ffn=False))
    dynamic = HeadsConfig(small=2 * s.heads // 3, large=s.heads, threshold=64, rule="batch")
    every = {  # name -> (config, FlexAttention tile)
        "dense": (_ours_cfg(s), BLOCK),
        "multi-scale": (multi, BLOCK),
        "multi-scale, FFN-free": (ffn_free, BLOCK),
        "dynamic (8/12), batch rule": (_ours_cfg(s, heads=dynamic), BLOCK),
        TILE64: (multi, 64),
        TILE64_FREE: (ffn_free, 64),
    }
    wanted = names or [k for k in every if k not in (TILE64, TILE64_FREE)]  # tiles: own block
    designs = {k: v for k, v in every.items() if k == "dense" or k in wanted}
    if s.device == "cpu":
        n = max(shape[0] for shape in s.shapes)
    rows = []
    for b in s.layer_batches if batches is None else batches:
        steps = {name: _layer_step(c, s, b, n, compiled, t) for name, (c, t) in designs.items()}
        for step, _ in steps.values():
            step()
        times: dict[str, list[float]] = {k: [] for k in steps}
        for _ in range(s.rounds):
            for key, (step, calls) in steps.items():
                times[key].append(timing.timed(step, s.device, s.steps) / calls)
        base = statistics.median(times["dense"])
        for name, ts in times.items():
            med = statistics.median(ts)
            row = {"n": n, "batch": b, "design": name, "compiled": compiled, "ms": med * 1e3}
            rows.append(row | {"vs_dense": med / base})
        # where multi-scale's time goes: its FlexAttention mask, built per call
        if not compiled and "multi-scale" in steps:
            mask = mask_build_seconds(steps["multi-scale"][0], s)
            if mask is not None:
                name = "multi-scale: its BlockMask build alone"
                row = {"n": n, "batch": b, "design": name, "compiled": False, "ms": mask * 1e3}
                rows.append(row | {"vs_dense": mask / base})
    return rows


def mask_build_seconds(step: Callable[[], None], s: SpeedSettings) -> float | None:
    """Seconds per call of `flex.window_mask` with the arguments one multi-scale layer step
    passes it (captured from the step, then rebuilt alone); None where the layer does not take
    FlexAttention (the CPU)."""
    from tibnlp.models.attention import flex

    captured: list[tuple[Any, ...]] = []
    real = flex.window_mask

    def spy(*args: Any) -> Any:
        captured.append(args)
        return real(*args)

    flex.window_mask = spy  # type: ignore[assignment]
    try:
        step()
    finally:
        flex.window_mask = real  # type: ignore[assignment]
    if not captured:
        return None
    total = 0.0
    for args in captured:  # one per layer distribution: the mean per layer call
        real(*args)  # warm (inductor compiles the mask function once per shape)
        total += timing.timed(lambda a=args: real(*a), s.device, s.steps)
    return total / len(captured)


def _num(x: float, unit: str = "") -> str:
    """A table cell: NaN (not measured on this device) reads n/a."""
    return "n/a" if x != x else f"{x:,.0f}{unit}"


def _text(s: SpeedSettings, peak: float, models: list[dict], layers: list[dict]) -> str:
    dtype = "bf16 autocast" if s.device == "cuda" else "fp32"
    lines = [
        f"Matmul peak measured here ({s.peak_n}^3, {'bf16' if s.device == 'cuda' else 'fp32'}): "
        f"{peak / 1e9:,.1f} GFLOP/s. Models: {dtype}, AdamW, {s.rounds} alternating rounds of "
        f"{s.steps} steps; vocab {s.vocab}, E={s.emb}, D={s.hidden}, L={s.layers}, "
        f"{s.heads} heads, FFN {s.ffn}. Compiled variants run in a block of their own, beside "
        "the eager transformers model again (their `vs transformers`).",
        "",
    ]
    if models:
        lines += [
            "| seq | batch | variant | tokens/s (median) | vs transformers | MFU | peak MiB | "
            "GPU busy |",
            "|---|---|---|---:|---:|---:|---:|---:|",
        ]
    for r in models:
        lines.append(
            f"| {r['seq']} | {r['batch']} | {r['variant']} | {r['tokens_per_s']:,.0f} | "
            f"{r['vs_transformers']:.2f}x | {100 * r['mfu']:.1f}% | {_num(r['peak_mib'])} | "
            f"{_num(100 * r['gpu_busy'], '%')} |"
        )
    lines += [
        "",
        "One shared layer, forward + backward, time per layer call (multi-scale: windows "
        f"{WINDOWS}, the mean over the layer distributions, one call each):",
        "",
        "| N | batch | design | compiled | ms | vs dense (same batch and compile) |",
        "|---|---:|---|---|---:|---:|",
    ]
    for r in layers:
        lines.append(
            f"| {r['n']} | {r['batch']} | {r['design']} | {'yes' if r['compiled'] else 'no'} | "
            f"{r['ms']:.2f} | "
            f"{r['vs_dense']:.2f}x |"
        )
    if layers:
        n = layers[0]["n"]
        lines += [
            "",
            f"Analytic floor at N={n}: {ffn_floor(s.hidden, s.ffn, n):.2f}x dense for a layer "
            "that keeps the FFN (its projections and FFN are dense's; only the attention core, "
            "2ND multiply-adds a token, can shrink), so the 0.6x target can hold for the "
            "attention or the paper's FFN-free layer, not for multi-scale heads with an FFN.",
        ]
    return "\n".join(lines)


def ffn_floor(d: int, f: int, n: int) -> float:
    """The least time a layer with dense's projections (4D^2) and FFN (2DF) can take against
    dense, if its attention core (2ND multiply-adds a token) cost nothing."""
    rest = 4 * d * d + 2 * d * f
    return rest / (rest + 2 * n * d)


Emit = Callable[[str, dict[str, Any]], None]
COMPILED_GROUPS = (("multi-scale",), ("multi-scale, FFN-free", "dynamic (8/12), batch rule"))
TILES_GROUPS = (
    ("multi-scale", TILE64),
    ("multi-scale, FFN-free", TILE64_FREE),
)


def run_speed(s: SpeedSettings, emit: Emit | None = None) -> tuple[str, dict[str, Any]]:
    """Eager models, eager layers, then (compile != none) compiled models and layers; `emit`
    gets the text and payload so far after each block."""
    from tibnlp.training.engine import configure_dynamo

    # the eager multi-scale layers compile FlexAttention once per shape: 4 head counts x 2
    # batches is dynamo's default limit of 8 exactly, and one more would time the slow path
    configure_dynamo()
    peak = timing.matmul_peak(s.device, s.peak_n)
    models: list[dict[str, Any]] = []
    layers: list[dict[str, Any]] = []
    compiled = ["ours, compiled"] + (["transformers, compiled"] if s.compile == "all" else [])
    blocks: list[Callable[[], None]] = []
    if "models" in s.blocks:
        blocks.append(lambda: models.extend(model_rows(s, peak, ["transformers", "ours"])))
    if "layers" in s.blocks:
        blocks.append(lambda: layers.extend(layer_rows(s, False)))
    if s.compile != "none" and "compiled-models" in s.blocks:
        blocks.append(lambda: models.extend(model_rows(s, peak, ["transformers", *compiled])))
    if s.compile != "none" and "compiled-layers" in s.blocks:
        # Inductor builds a graph per multi-scale layer distribution (minutes in all): the
        # largest batch first, multi-scale against dense, then the other designs, each
        # sub-block emitted as it ends, so a cut lease keeps what finished
        for b in sorted(s.layer_batches, reverse=True):
            for group in COMPILED_GROUPS:
                blocks.append(
                    lambda b=b, g=group: layers.extend(layer_rows(s, True, batches=(b,), names=g))
                )
    if s.compile != "none" and "compiled-tiles" in s.blocks:
        # does a finer tile grid let the narrow windows skip more at N=512 (issue: <= 0.6x)?
        for group in TILES_GROUPS:
            blocks.append(
                lambda g=group: layers.extend(
                    layer_rows(s, True, batches=(max(s.layer_batches),), names=g)
                )
            )
    payload = {"peak_flops": peak, "models": models, "layers": layers}  # filled block by block
    for block in blocks:
        block()
        if emit is not None:
            emit(_text(s, peak, models, layers), payload)
    return _text(s, peak, models, layers), payload
