"""The FlexAttention window path of multi-scale attention (`models/attention/flex.py`), on CPU.

On CUDA that path is compiled and also trained (tests/test_gpu.py checks it against the CPU
path there). On CPU, torch runs FlexAttention only eagerly and forward only (no backward on
CPU), so these tests check the mask semantics in forward: per-head windows, padding, the
width-1 heads, against the dense masked reference. The model never takes this path on CPU.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from benchmarks.gpu.designs import batch, build, designs
from tibnlp.models.attention import flex, multiscale
from tibnlp.models.attention.multiscale import Scale, reference_window_attention

pytest.importorskip("torch.nn.attention.flex_attention")


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "flex_attention called without torch.compile()"
        yield


def test_flex_windows_equal_the_dense_reference_per_head() -> None:
    torch.manual_seed(0)
    lengths = torch.tensor([48, 31, 17, 5])
    b, h, n, d = 4, 4, 48, 16
    q, k, v = (torch.randn(b, h, n, d) for _ in range(3))
    radius = torch.stack([Scale.parse(s).radii(lengths) for s in ["3", "N/8", "N/4", "N/1"]], 1)
    assert flex.flex_available(q) is False  # the model keeps its own CPU path
    out = flex.flex_window_attention(q, k, v, radius, lengths)
    ref = torch.cat(
        [
            reference_window_attention(
                q[:, i : i + 1], k[:, i : i + 1], v[:, i : i + 1], radius[:, i], lengths
            )
            for i in range(h)
        ],
        1,
    )
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)


def test_flex_windows_across_tiles_equal_the_reference_with_padding() -> None:
    """Several 128-tiles (odd N), rows of odd lengths down to 1, windows from 1 to the whole
    row: the block mask's partial/full tiles give the dense reference, padding rows too."""
    torch.manual_seed(0)
    n, lengths = 261, torch.tensor([261, 200, 129, 7, 1])
    b, h, d = 5, 5, 8
    q, k, v = (torch.randn(b, h, n, d) for _ in range(3))
    scales = ["1", "3", "N/16", "N/4", "N/1"]
    radius = torch.stack([Scale.parse(s).radii(lengths) for s in scales], 1)
    out = flex.flex_window_attention(q, k, v, radius, lengths)
    for i in range(h):
        one = (q[:, i : i + 1], k[:, i : i + 1], v[:, i : i + 1], radius[:, i], lengths)
        torch.testing.assert_close(
            out[:, i : i + 1], reference_window_attention(*one), rtol=1e-5, atol=1e-6
        )


def test_64_token_tiles_give_the_128_token_result() -> None:
    """The 64-token tile is a speed knob: the same windows, the same output; the kernel's
    tiles follow it (a block mask's tile must be a multiple of the kernel's)."""
    torch.manual_seed(0)
    n, lengths = 200, torch.tensor([200, 150, 65, 3])
    q, k, v = (torch.randn(4, 3, n, 8) for _ in range(3))
    radius = torch.stack([Scale.parse(s).radii(lengths) for s in ["3", "N/16", "N/4"]], 1)
    want = flex.flex_window_attention(q, k, v, radius, lengths)
    got = flex.flex_window_attention(q, k, v, radius, lengths, tile=64)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert flex.kernel_options(128) is None
    assert set(flex.kernel_options(64).values()) == {64}
    with pytest.raises(ValueError, match="tile 32"):
        flex.kernel_options(32)


def test_multiscale_model_through_flex_equals_its_cpu_path(monkeypatch) -> None:
    """The whole multi-scale model (width-1 heads included) with the flex path forced on."""
    design = next(d for d in designs() if d.name == "multi-scale")
    model = build(design).eval()
    inputs = batch(design, [40, 33, 17, 9])
    with torch.no_grad():
        want = model(**inputs)["loss"]
        calls = []
        monkeypatch.setattr(multiscale, "flex_available", lambda q: True)
        original = multiscale.flex_window_attention
        monkeypatch.setattr(
            multiscale,
            "flex_window_attention",
            lambda *a, **kw: calls.append(1) or original(*a, **kw),
        )
        got = model(**inputs)["loss"]
    assert len(calls) == design.cfg.num_layers  # one fused call per layer
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_speed_times_the_block_mask_a_layer_step_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    """benchmarks/gpu/speed.py captures the arguments a step passes `window_mask`, times the
    build alone with those arguments, and puts the real function back; no FlexAttention
    call: None."""
    from benchmarks.gpu.speed import SpeedSettings, mask_build_seconds

    lengths = torch.tensor([40, 23])
    q, k, v = (torch.randn(2, 2, 40, 8) for _ in range(3))
    radius = torch.stack([Scale.parse(s).radii(lengths) for s in ["3", "N/4"]], 1)
    builds: list[tuple[object, ...]] = []
    original = flex.window_mask

    def counted(*args):  # type: ignore[no-untyped-def]
        builds.append(args)
        return original(*args)

    monkeypatch.setattr(flex, "window_mask", counted)
    settings = SpeedSettings.tiny()
    seconds = mask_build_seconds(
        lambda: flex.flex_window_attention(q, k, v, radius, lengths), settings
    )
    assert seconds is not None and seconds > 0
    assert flex.window_mask is counted  # put back
    # the step's one build, then the same arguments rebuilt alone (a warm-up and the timed ones)
    assert len(builds) >= 3 and all(b is builds[0] or b == builds[0] for b in builds[1:])
    assert mask_build_seconds(lambda: None, settings) is None


@pytest.mark.parametrize("tile", [128, 64])
@pytest.mark.parametrize("n", [1, 40, 64, 128, 129, 300, 512])
def test_window_mask_tiles_equal_create_block_mask(n: int, tile: int) -> None:
    """`window_mask` classifies the tiles from the windows' geometry; `create_block_mask`,
    evaluating the same mask on every pair, is the oracle: the same partial and full tiles
    (queries' and keys' views), whatever the radius (0, inside, beyond N) and row length."""
    g = torch.Generator().manual_seed(n)
    for _ in range(8):
        lengths = torch.randint(1, n + 1, (3,), generator=g)
        lengths[0] = n
        radius = torch.randint(0, n + 2, (3, 5), generator=g)
        radius[:, 0] = 0
        _same_tiles(radius, lengths, n, tile)


def _same_tiles(radius: torch.Tensor, lengths: torch.Tensor, n: int, tile: int) -> None:
    from torch.nn.attention.flex_attention import create_block_mask

    def mask_mod(b, h, q, k):
        inside = ((q - k).abs() <= radius[b, h]) & (k < lengths[b])
        return inside | ((q == k) & (q >= lengths[b]))

    want = create_block_mask(mask_mod, 3, 5, n, n, device="cpu", _compile=False, BLOCK_SIZE=tile)
    got = flex.window_mask(radius, lengths, n, tile)
    for name in ("kv_num_blocks", "full_kv_num_blocks", "q_num_blocks", "full_q_num_blocks"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    assert torch.equal(got.to_dense(), want.to_dense())
    for num, idx in (("kv_num_blocks", "kv_indices"), ("full_kv_num_blocks", "full_kv_indices")):
        keep = torch.arange(got.kv_indices.shape[-1]) < getattr(got, num)[..., None]
        assert torch.equal(getattr(got, idx)[keep], getattr(want, idx)[keep]), idx


def test_speed_times_64_token_tiles_beside_their_128_token_twin() -> None:
    """The speed benchmark's tile groups: dense, then each multi-scale layer at both tiles
    (on CPU the multi-scale path ignores the tile: this checks the rows, not a speed)."""
    from benchmarks.gpu.speed import TILES_GROUPS, SpeedSettings, layer_rows

    for group in TILES_GROUPS:
        rows = layer_rows(SpeedSettings.tiny(), False, names=group)
        assert [r["design"] for r in rows] == ["dense", *group]
        assert all(r["ms"] > 0 for r in rows) and rows[0]["vs_dense"] == 1.0
