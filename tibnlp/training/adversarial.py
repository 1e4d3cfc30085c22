"""Adversarial training on the word embedding (Miyato et al. 2017; FGM), `finetune.adversarial`.

Each training batch is classified twice: as it is, and with every text's piece vectors moved
a small step in the direction that raises its loss most (the gradient of the clean loss with
respect to the word-embedding output). The classifier trains on both losses, so it must keep
its prediction in a neighbourhood of each title's words rather than on their exact vectors.

The step is relative: `epsilon` times the norm of the text's own piece vectors (over its real
pieces). A pretrained embedding and a random one (the twin's) differ in scale (the main job's
rows: about 1.2 in norm against 0.23 at initialisation), and a fixed step would be a different
lever for each.

The perturbation enters at the output of the piece table (`nn.Embedding`), before position
and segment vectors and the embedding norm, so the same code serves the transformer encoder
and the TextCNN baseline's table.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

from tibnlp.models.encoder import Encoder
from tibnlp.models.long_documents.reading import inner_encoder


def piece_table(encoder: nn.Module) -> nn.Embedding:
    """The piece-embedding table whose output adversarial training perturbs."""
    inner = inner_encoder(encoder)
    if isinstance(inner, Encoder):
        return inner.embeddings.word
    table = getattr(inner, "embeddings", None)
    if isinstance(table, nn.Embedding):  # the TextCNN baseline's EmbeddingEncoder
        return table
    raise TypeError(f"no piece-embedding table found in {type(inner).__name__}")


@contextmanager
def _on_output(
    table: nn.Embedding, change: Callable[[torch.Tensor], torch.Tensor]
) -> Iterator[None]:
    handle = table.register_forward_hook(lambda _m, _i, out: change(out))
    try:
        yield
    finally:
        handle.remove()


@contextmanager
def piece_vectors(table: nn.Embedding | None) -> Iterator[list[torch.Tensor]]:
    """The outputs of `table` in the forward passes run inside, in order (none without one)."""
    seen: list[torch.Tensor] = []
    if table is None:
        yield seen
        return

    def keep(out: torch.Tensor) -> torch.Tensor:
        seen.append(out)
        return out

    with _on_output(table, keep):
        yield seen


def adversarial_step(
    gradient: torch.Tensor, vectors: torch.Tensor, real: torch.Tensor, epsilon: float
) -> torch.Tensor:
    """[B, N, E] step of norm epsilon * ||text's vectors|| along each text's gradient, zero at
    padding; a text whose gradient vanishes gets no step."""
    keep = real[:, : vectors.shape[1]].unsqueeze(-1).to(vectors.dtype)
    grad = gradient.detach().float() * keep
    size = (vectors.detach().float() * keep).flatten(1).norm(dim=1)
    direction = grad / grad.flatten(1).norm(dim=1).clamp(min=1e-12)[:, None, None]
    return (epsilon * size[:, None, None] * direction).to(vectors.dtype)


def adversarial_loss(
    clean: torch.Tensor,
    vectors: torch.Tensor,
    classify: Callable[[], torch.Tensor],
    loss_of: Callable[[torch.Tensor], torch.Tensor],
    table: nn.Embedding,
    attention_mask: torch.Tensor,
    epsilon: float,
) -> torch.Tensor:
    """The batch's loss with its piece vectors moved uphill. `clean` is its clean loss and
    `vectors` the piece vectors that pass read (`piece_vectors`); `classify()` runs the
    classifier on the batch again and `loss_of(logits)` is the training loss. Only the clean
    loss's gradient with respect to the vectors is taken here (no parameter's gradient is
    touched); the caller backpropagates the sum."""
    (gradient,) = torch.autograd.grad(clean, vectors, retain_graph=True)
    step = adversarial_step(gradient, vectors, attention_mask, epsilon)
    with _on_output(table, lambda out: out + step):
        return loss_of(classify())
