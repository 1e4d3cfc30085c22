"""ALBERT pretraining heads: MLM (decoder tied to the input embedding) and sentence order.

With `segment_len > 0` (segment recurrence, `model.recurrence.mem_len > 0`) each input is one
stream of a document read window by window with memory (`mlm_over_segments`, on the segments
of `tibnlp.models.long_documents.windows`): MLM only, the SOP labels of the batch are ignored
(tibnlp.data.segment_chains says why). `mlm_logits` is the one MLM head formula (GEMFormer's
memory selection reads it too).

The vocabulary projection runs only at masked positions (`mlm_labels != -100`): with a 30k
vocabulary it is most of a tiny model's compute, and the other 85% of its outputs would be
thrown away by the loss anyway. For the same reason the encoder's last layer runs only at the
masked positions and [CLS] (`sparse_last_layer`, where the attention design allows it): keys
and values from every position, so the outputs read are exactly the full computation's.

Same-document contrast (`contrastive > 0`, DeCLUTR's idea: Giorgi et al. 2021): rows 2i and
2i + 1 are two consecutive stretches of one document (`MlmCollator(split_pairs=True)`). Each
row's mean last-layer state, through a projection, must pick its partner among the batch's
other rows (InfoNCE, both directions); the loss is added to MLM with that weight. Titles are
classified by topic, and MLM alone learns little of what a document is about; telling one
document from the batch's others is about nothing else. The projection (`contrastive_proj`)
is a pretraining head like SOP's: fine-tuning and a continuation without the contrast leave
it behind.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tibnlp.config.model import ModelConfig
from tibnlp.models.encoder import Encoder, init_weights
from tibnlp.models.long_documents.windows import run_segments

IGNORE = -100


# torch._dynamo settings under which the pretraining model traces as one graph: the masked-LM
# selection's data-dependent shape is captured instead of breaking the graph (the encoder
# skips its own host-side steps under compile; tests/test_compile.py).
DYNAMO_CAPTURE = {"capture_dynamic_output_shape_ops": True, "capture_scalar_outputs": True}


class AlbertForPretraining(nn.Module):
    """`forward(...) -> dict` with ALBERT's five metrics and the large-route share.

    `loss = mask_loss + sop_loss`; all values are tensors (the trainer decides when to sync).
    With `segment_len`: `loss = mask_loss` over the segments, plus `segments` read.
    """

    def __init__(
        self,
        cfg: ModelConfig,
        sparse_last_layer: bool = True,
        segment_len: int = 0,
        sop: bool = True,
        contrastive: float = 0.0,
        temperature: float = 0.05,
    ) -> None:
        super().__init__()
        if contrastive and (sop or segment_len):
            raise ValueError("the same-document contrast reads split pairs: no SOP, no segments")
        self.cfg = cfg
        self.contrastive = contrastive
        self.temperature = temperature
        self.sparse_last_layer = sparse_last_layer
        self.segment_len = segment_len
        self.sop = sop
        self.encoder = Encoder(cfg)
        d, e = cfg.hidden_size, cfg.embedding_size
        self.mlm_dense = nn.Linear(d, e)
        self.mlm_norm = nn.LayerNorm(e, eps=cfg.layer_norm_eps)
        self.mlm_bias = nn.Parameter(torch.zeros(cfg.vocab_size))
        heads: list[nn.Module] = [self.mlm_dense, self.mlm_norm]
        if sop:  # without SOP there is no pair head at all (no unused parameters)
            self.sop_pooler = nn.Linear(d, d)
            self.sop_classifier = nn.Linear(d, 2)
            heads += [self.sop_pooler, self.sop_classifier]
        if contrastive:
            self.contrastive_proj = nn.Linear(d, d)
            heads.append(self.contrastive_proj)
        for m in heads:
            init_weights(m, cfg.initializer_range)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None,
        mlm_labels: torch.Tensor,
        sop_labels: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        if self.segment_len:
            return self.mlm_over_segments(input_ids, attention_mask, mlm_labels)
        if sop_labels is None and self.sop:
            raise ValueError("sop_labels are needed unless the model reads segments")
        sel = mlm_labels != IGNORE
        read = None
        # the heads read the masked positions and [CLS] only; the contrast pools every state
        if self.sparse_last_layer and not self.contrastive:
            read = sel.clone()
            read[:, 0] = self.sop
        out = self.encoder(input_ids, attention_mask, token_type_ids, outputs_at=read)
        h = out.hidden
        _, mask_loss, mask_acc = self.masked_lm(h, mlm_labels)
        result = {
            "loss": mask_loss,
            "mask_loss": mask_loss.detach(),
            "mask_accuracy": mask_acc.detach(),
            "route_large_fraction": out.route_large_fraction.detach(),
        }
        if self.contrastive:
            loss, accuracy = self.same_document(h, attention_mask)
            result["loss"] = mask_loss + self.contrastive * loss
            result["contrastive_loss"] = loss.detach()
            result["contrastive_accuracy"] = accuracy.detach()
        if self.sop:
            assert sop_labels is not None
            sop_logits = self.sop_classifier(torch.tanh(self.sop_pooler(h[:, 0])))
            sop_loss = F.cross_entropy(sop_logits, sop_labels)
            result["loss"] = mask_loss + sop_loss
            result["sop_loss"] = sop_loss.detach()
            result["sop_accuracy"] = (sop_logits.argmax(-1) == sop_labels).float().mean().detach()
        return result

    def same_document(
        self, hidden: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """InfoNCE of rows 2i and 2i + 1 against the batch's other rows (both directions), and
        the share of rows whose nearest other row is their partner."""
        rows = hidden.shape[0]
        if rows % 2:
            raise ValueError(f"the same-document contrast needs row pairs, got {rows} rows")
        weight = attention_mask.to(hidden.dtype).unsqueeze(-1)
        pooled = (hidden * weight).sum(1) / weight.sum(1).clamp(min=1.0)
        z = F.normalize(self.contrastive_proj(pooled).float(), dim=-1)
        scores = z @ z.T / self.temperature
        scores = scores.masked_fill(torch.eye(rows, dtype=torch.bool, device=z.device), -1e4)
        partner = torch.arange(rows, device=z.device) ^ 1  # 0<->1, 2<->3, ...
        loss = F.cross_entropy(scores, partner)
        accuracy = (scores.argmax(-1) == partner).float().mean()
        return loss, accuracy

    def masked_lm(
        self, hidden: torch.Tensor, mlm_labels: torch.Tensor
    ) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
        """MLM logits at the masked positions (None when none is masked), their loss and
        accuracy; with no masked token, a zero loss that still touches the graph."""
        sel = mlm_labels != IGNORE
        targets = mlm_labels[sel]
        # (under torch.compile the count is a symbol no branch may read; a pretraining batch
        # always holds a masked token)
        if not torch.compiler.is_compiling() and not targets.numel():
            return None, hidden.sum() * 0.0, hidden.new_zeros(())
        logits = self.mlm_logits(hidden[sel])
        accuracy = (logits.argmax(-1) == targets).float().mean()
        return logits, F.cross_entropy(logits, targets), accuracy

    def mlm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The MLM head (decoder tied to the word embedding) on hidden states [..., D]."""
        word = self.encoder.embeddings.word.weight
        return mlm_head_logits(self.mlm_dense, self.mlm_norm, self.mlm_bias, word, hidden)

    def mlm_over_segments(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, mlm_labels: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """MLM loss over all segments of a batch of documents, memory carried between segments.

        Same masking as ordinary pretraining (`mlm_labels` [B, T], -100 where not predicted;
        the [CLS] at position 0 must be -100). Returns `loss` (= `mask_loss`, mean over every
        masked token of every segment; backward once), `mask_loss`, `mask_accuracy`
        (detached), `segments`. Memory is gradient-stopped, so the graph of segment k never
        reaches back to segment k - 1; the graphs of all segments are held until backward.
        """
        total = input_ids.new_zeros((), dtype=torch.float)
        correct = input_ids.new_zeros((), dtype=torch.float)
        count, n_seg = 0, 0
        anchor = None  # keeps a graph when no token of the batch is masked
        for seg, out in run_segments(self.encoder, input_ids, attention_mask, self.segment_len):
            cols = seg.positions.clamp(min=0)
            labels = mlm_labels[seg.rows][:, cols].masked_fill(seg.positions[None, :] < 0, IGNORE)
            sel = labels != IGNORE
            anchor = out.hidden.sum() * 0.0 if anchor is None else anchor
            if bool(sel.any()):
                logits = self.mlm_logits(out.hidden[sel])
                targets = labels[sel]
                total = total + F.cross_entropy(logits, targets, reduction="sum")
                correct = correct + (logits.argmax(-1) == targets).sum()
                count += int(targets.numel())
            n_seg += 1
        loss = total / count if count else anchor if anchor is not None else total
        return {
            "loss": loss,
            "mask_loss": loss.detach(),
            "mask_accuracy": (correct / max(count, 1)).detach(),
            "segments": torch.tensor(n_seg, device=loss.device),
        }


def mlm_head_logits(
    dense: nn.Linear,
    norm: nn.LayerNorm,
    bias: torch.Tensor,
    decoder: torch.Tensor,
    hidden: torch.Tensor,
) -> torch.Tensor:
    """The MLM head formula: dense + GELU + norm, then the decoder tied to the word embedding
    (`decoder` [V, E]), plus `bias`. Used by the pretraining model and by the MLM head a
    GEMFormer classifier keeps beside the encoder being fine-tuned."""
    return F.linear(norm(F.gelu(dense(hidden))), decoder, bias)
