"""Reading documents longer than the encoder's window, built on top of `tibnlp.models.encoder`.

- `windows`: the segmenting rule, segment-by-segment encoding (with Transformer-XL recurrence
  when the model has it), `LongOutput` and the `WindowReader` base; `SegmentReader`.
- `gemformer`: GEMFormer's two passes (Sagirova & Burtsev 2023): token entropy, the global
  memory it keeps, and `[CLS] prefix [SEP] memory [SEP] segment` encoding.
- `memory_reader`: `MemoryReader`, GEMFormer as a drop-in encoder, selecting the memory with
  the model being fine-tuned (as published) or with the frozen pretrained MLM (its ablation).
- `reading`: `Reading`, how a classifier reads long documents (saved with it), and
  `build_reader`, which rebuilds that reader around an encoder.

Nothing here imports training code; every tensor follows the encoder's device. This
`__init__` imports nothing, so importing one module does not pull in the others.
"""
