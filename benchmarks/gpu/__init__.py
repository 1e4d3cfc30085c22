"""The GPU harness: what travels to a lent GPU machine (`bundle`) and what runs there (`run`).

    python -m benchmarks.gpu bundle            # here: wheels + data into .bundle/, size check
    python -m benchmarks.gpu run check|speed|pretrain|finetune [--cpu] [--out DIR]

See benchmarks/gpu/README.md for the device commands and what each part measures.
"""
