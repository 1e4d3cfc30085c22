"""Which SDPA kernel each attention design gets on CUDA, and why.

For each design, under bf16 autocast (the training setting: flash attention takes only 16-bit
inputs), on a batch without padding and on a padded one: the attention operators that the
forward + backward actually dispatched (from the profiler: flash, memory-efficient, cuDNN,
math SDPA, FlexAttention, or none, when the design computes its scores itself), and for the
fast kernels that were not chosen, the reason PyTorch gives when it is forced to use them.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from benchmarks.gpu.designs import batch, build, designs

# profiler op name fragment -> kernel family
OPS = {
    "_scaled_dot_product_flash_attention_for_cpu": "flash (CPU kernel)",
    "_scaled_dot_product_flash_attention": "flash",
    "_scaled_dot_product_efficient_attention": "memory-efficient",
    "_scaled_dot_product_cudnn_attention": "cuDNN",
    "_scaled_dot_product_attention_math": "math",
    "flex_attention": "FlexAttention",
}
FAST = ("flash", "memory-efficient", "cuDNN")  # fused kernels; cuDNN leads on Hopper (torch 2.11)
FAMILIES_SDPA = ("flash", "memory-efficient", "cuDNN", "math")


def _step(model: Any, inputs: dict[str, Any], device: str) -> None:
    with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
        out = model(**inputs)
    out["loss"].backward()


def _used(model: Any, inputs: dict[str, Any], device: str) -> list[str]:
    from torch.profiler import ProfilerActivity, profile

    _step(model, inputs, device)  # warm-up (compiles FlexAttention)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        _step(model, inputs, device)
    names = {e.name for e in prof.events()}
    found = set()
    for name in names:  # the longest matching fragment names the kernel
        frags = [f for f in OPS if f in name]
        if frags:
            found.add(OPS[max(frags, key=len)])
    return sorted(found) or ["none (scores computed by the design itself)"]


def _why_not(model: Any, inputs: dict[str, Any], device: str) -> dict[str, str]:
    """Each fast SDPA kernel forced alone: "possible", or PyTorch's reason (its warnings say
    why a kernel was refused; the error itself only says that none was left)."""
    import warnings

    from torch.nn.attention import SDPBackend, sdpa_kernel

    reasons = {}
    backends = (
        SDPBackend.FLASH_ATTENTION,
        SDPBackend.EFFICIENT_ATTENTION,
        SDPBackend.CUDNN_ATTENTION,
    )
    for name, backend in zip(FAST, backends, strict=True):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                with sdpa_kernel([backend]):
                    _step(model, inputs, device)
                reasons[name] = "possible"
            except RuntimeError as exc:
                said = [str(w.message) for w in caught if "sdp_utils" in str(w.message)]
                reasons[name] = refusal(said) or " ".join(str(exc).split())[:200]
    return reasons


def refusal(warnings_text: list[str]) -> str:
    """PyTorch's reasons from its sdp_utils warnings, without their 'X kernel not used
    because:' headers and 'Triggered internally at' source locations."""
    text = " ".join(warnings_text)
    text = re.sub(r"\(Triggered internally at [^)]*\)", " ", text)
    text = re.sub(r"[A-Za-z -]*kernel not used because:?", " ", text)
    return " ".join(text.split())[:200]


def report(device: str = "cuda", seq: int = 128) -> list[dict[str, Any]]:
    rows = []
    for design in designs():
        model = build(design).to(device)
        for label, lengths in (("full", [seq] * 4), ("padded", [seq, seq - 5, seq // 2, 9])):
            inputs = batch(design, lengths, device=device)
            used = _used(model, inputs, device)
            sdpa = device == "cuda" and any(u in FAMILIES_SDPA for u in used)
            why = _why_not(model, inputs, device) if sdpa else dict.fromkeys(FAST, "n/a")
            rows.append({"design": design.name, "batch": label, "used": used, **why})
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| design | batch | kernels used | flash alone | memory-efficient alone | cuDNN alone |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['design']} | {r['batch']} | {', '.join(r['used'])} | {r['flash']} | "
            f"{r['memory-efficient']} | {r['cuDNN']} |"
        )
    return "\n".join(lines)
