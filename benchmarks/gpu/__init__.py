"""The GPU harness: what travels to a lent GPU machine (`bundle`) and what runs there (`run`).

    python -m benchmarks.gpu bundle            # here: wheels + data into .bundle/, size check
    python -m benchmarks.gpu run check|speed|pretrain|curve|wide|loop|finetune [--cpu] [--out DIR]

See benchmarks/results/gpu.md for the device commands, what each part measures and the figures.
"""
