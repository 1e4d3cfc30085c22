"""DeepSpeed set-up from our config: the only module that imports deepspeed.

- `init_distributed`: a single process with no launcher gets a local world of one (gloo), so
  `tibnlp pretrain` runs on a laptop; under `deepspeed`/`torchrun` the launcher's env is used.
  gloo on CPU, NCCL on CUDA (the NCCL and bf16/fp16 paths follow DeepSpeed's documented
  config but were not run on a GPU in this project's CI).
- `deepspeed_config`: ZeRO stage, precision, gradient accumulation and clipping as a dict.
  bf16 is DeepSpeed's `torch_autocast` section on every device: bf16 matmuls, fp32 weights,
  gradients and optimizer. DeepSpeed's bf16 mode (bf16 weights, fp32 masters inside the
  optimizer) was the GPU path until an H200 lease showed what it costs at this model size: a
  per-parameter overflow check and bf16/fp32 copies every step in a loop that is host-bound
  (benchmarks/results/precision_ops.md), and exports that kept the bf16 weights, not the fp32
  masters.
- `clip_fp32_gradients`: at ZeRO 0 DeepSpeed clips with a Python loop over the parameters
  (a norm, then a multiply, each per tensor: two kernel launches per parameter a step on a
  GPU, in a loop that is host-bound); `fused_clip` computes the same numbers with foreach ops.
- `safe_checkpoint_loading`: DeepSpeed 0.19.8 reads checkpoints with `torch.load(...,
  weights_only=False)` (runtime/checkpoint_engine/torch_checkpoint_engine.py), which would
  unpickle anything. We swap its loader for `weights_only=True` with an allowlist of the few
  plain DeepSpeed classes its ZeRO optimizer state contains.
"""

from __future__ import annotations

import atexit
import os
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import deepspeed
import torch
import torch.distributed as dist
from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
from deepspeed.runtime.zero.config import ZeroStageEnum
from deepspeed.utils.tensor_fragment import fragment_address
from torch import nn

from tibnlp.config.train import EngineConfig, OptimizerConfig
from tibnlp.errors import ConfigError, TibnlpError
from tibnlp.training import worker_exit
from tibnlp.training.optim import build_optimizer
from tibnlp.training.ranks import announce_main
from tibnlp.training.schedule import build_scheduler

# Classes DeepSpeed pickles into its own checkpoint files (checked on 0.19.8, ZeRO 0-2):
# plain records, no code executed when they are rebuilt.
_SAFE_GLOBALS = [LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address]


@dataclass
class World:
    rank: int
    local_rank: int
    size: int

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _skip_shared_memory_op() -> None:
    """DeepSpeed's CPU backend JIT-compiles a shared-memory all-reduce op on first use (90 s
    idle, minutes under load), used only by its inference all-reduce; training all-reduces go
    through torch.distributed (gloo). Its compile flags depend on how CPU flags were probed
    (py-cpuinfo or lscpu), so processes on one machine rebuilt it in turn. Not building it:
    DeepSpeed falls back to torch.distributed when the op is unavailable."""
    compatible = getattr(deepspeed.ops, "__compatible_ops__", None)
    if isinstance(compatible, dict):
        compatible["deepspeed_shm_comm"] = False


def _launched() -> bool:
    """Started by a launcher (torchrun, deepspeed) that names this process's rank and world."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def init_distributed(cfg: EngineConfig) -> World:
    """Join (or create) the process group; idempotent within a process."""
    if not torch.cuda.is_available():
        _skip_shared_memory_op()
    launched = _launched()
    cuda = torch.cuda.is_available()
    backend = cfg.backend if cfg.backend != "auto" else ("nccl" if cuda else "gloo")
    if backend == "nccl" and not cuda:
        raise ConfigError("config key 'engine.backend': nccl needs a CUDA device; use gloo")
    if not dist.is_initialized():
        if launched:
            deepspeed.init_distributed(dist_backend=backend, verbose=False)
        else:  # a world of one on a local port; RANK etc. stay unset for child processes
            os.environ.setdefault("LOCAL_RANK", "0")  # DeepSpeed's initialize asserts it
            deepspeed.init_distributed(
                dist_backend=backend,
                auto_mpi_discovery=False,
                init_method=f"tcp://127.0.0.1:{cfg.port or _free_port()}",
                rank=0,
                world_size=1,
                verbose=False,
            )
            # kept for the process's later stages (a pipeline's), left at exit: NCCL warns
            # of a leak otherwise (seen on an H200 after every pipeline run)
            atexit.register(_leave_local_world)
    announce_main()  # (the other ranks see rank 0 end or go while they wait for it)
    world = World(dist.get_rank(), int(os.environ.get("LOCAL_RANK", "0")), dist.get_world_size())
    if cuda:
        torch.cuda.set_device(world.local_rank)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world.size))
    torch.set_num_threads(cfg.threads or max(1, (os.cpu_count() or 1) // max(1, local)))
    return world


def _leave_local_world() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def hardware_name() -> str:
    """The GPU's name, or the CPU model: recorded beside every figure (they depend on it)."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def cpu_has_bf16() -> bool:
    """Native bf16 matrix instructions (x86 AVX512-BF16/AMX-BF16, Arm BF16) behind oneDNN.

    oneDNN also runs bf16 on plain AVX-512 by emulation, slower than fp32; that is not a
    reason to train in bf16, so it counts as no support here."""
    if not (torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()):
        return False
    caps = torch.cpu.get_capabilities()
    return any(bool(caps.get(flag)) for flag in ("avx512_bf16", "amx_bf16", "bf16", "sve_bf16"))


def resolve_precision(requested: str) -> str:
    """auto: bf16 on a GPU that has it, else fp16 on GPU, fp32 on CPU.

    On CPU, `bf16` is autocast (bf16 matmuls, fp32 weights, gradients and optimizer) and needs
    native bf16 instructions; `auto` stays fp32 there so that runs are bit-reproducible (the
    resume and data-parallel equivalence guarantees are stated for fp32)."""
    cuda = torch.cuda.is_available()
    if requested == "auto":
        if not cuda:
            return "fp32"
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    if requested == "fp16" and not cuda:
        raise ConfigError(
            "config key 'engine.precision': fp16 needs a GPU here",
            "use engine.precision=bf16 on a CPU with bf16 instructions, or fp32/auto",
        )
    if requested == "bf16" and not cuda and not cpu_has_bf16():
        raise ConfigError(
            "config key 'engine.precision': bf16 needs a GPU or a CPU with native bf16 "
            "instructions (AVX512-BF16/AMX-BF16 or Arm BF16); this CPU has none",
            "use engine.precision=auto (fp32 on CPU)",
        )
    return requested


def planned_world_size() -> int:
    """The processes `init_distributed` joins (or joined), known without joining: a run checks
    its batch split with it before minutes of tokenising, not at `start_training`."""
    if dist.is_initialized():
        return dist.get_world_size()
    return int(os.environ["WORLD_SIZE"]) if _launched() else 1


def accumulation_steps(
    batch_size: int, micro_batch_size: int, world_size: int, key: str = "pretrain.batch_size"
) -> int:
    """Micro-steps per optimizer step so that micro * accumulation * world == batch_size."""
    micro = micro_batch_size or batch_size // world_size
    if micro < 1 or batch_size % (micro * world_size):
        split = f"micro-batches of {micro_batch_size} x " if micro_batch_size else ""
        raise ConfigError(
            f"config key '{key}': {batch_size} sequences per step do not split into "
            f"{split}{world_size} processes",
            f"choose {key} = micro_batch_size x processes x accumulation steps"
            if micro_batch_size
            else f"choose {key} as a multiple of the number of processes ({world_size})",
        )
    return batch_size // (micro * world_size)


# DeepSpeed's section for `engine.precision: bf16` (see deepspeed_config)
AUTOCAST_BF16: dict[str, Any] = {
    "enabled": True,
    "dtype": "bfloat16",
    "lower_precision_safe_modules": [],
}


def deepspeed_config(
    engine: EngineConfig,
    optimizer: OptimizerConfig,
    batch_size: int,
    micro_batch_size: int,
    world_size: int,
) -> dict[str, Any]:
    accum = accumulation_steps(batch_size, micro_batch_size, world_size)
    precision = resolve_precision(engine.precision)
    config: dict[str, Any] = {
        "train_batch_size": batch_size,
        "train_micro_batch_size_per_gpu": batch_size // (accum * world_size),
        "gradient_accumulation_steps": accum,
        "gradient_clipping": optimizer.grad_clip,
        "zero_optimization": {"stage": engine.zero_stage},
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }
    if precision == "bf16":
        # DeepSpeed's own autocast around the module's forward (train and eval): bf16 matmuls,
        # fp32 weights and optimizer, so a saved model holds the weights the optimizer updates.
        # No "lower precision safe" modules: gradients are all-reduced in fp32, as in fp32.
        config["torch_autocast"] = dict(AUTOCAST_BF16)
    elif precision == "fp16":
        config["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
    return config


def _weights_only_load(path: str, map_location: Any = None) -> Any:
    try:
        with torch.serialization.safe_globals(_SAFE_GLOBALS):
            return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # UnpicklingError and friends: name the file, never fall back
        raise TibnlpError(
            f"checkpoint file {path} could not be loaded safely: {exc}".splitlines()[0],
            "only checkpoints written by tibnlp pretrain are loaded (weights_only)",
        ) from exc


def initialize(
    model: nn.Module,
    engine_cfg: EngineConfig,
    optim_cfg: OptimizerConfig,
    batch_size: int,
    micro_batch_size: int,
    total_steps: int,
    world: World,
    lr_by_prefix: Mapping[str, float] | None = None,
) -> Any:
    """The DeepSpeed engine around `model`, with our optimizer and lr schedule attached
    (`lr_by_prefix`: parameter-name prefix -> its own peak lr, see `optim.param_groups`)."""
    config = deepspeed_config(engine_cfg, optim_cfg, batch_size, micro_batch_size, world.size)
    optimizer = build_optimizer(model, optim_cfg, lr_by_prefix)
    if engine_cfg.compile != "off":
        compile_in_place(model, engine_cfg.compile)
    scheduler = build_scheduler(optimizer, optim_cfg, total_steps)
    ds_engine, _, _, _ = deepspeed.initialize(
        model=model, optimizer=optimizer, lr_scheduler=scheduler, config=config
    )
    ds_engine.checkpoint_engine.load = _weights_only_load
    if engine_cfg.zero_stage == 0:  # ZeRO 1 and 2 clip inside their own optimizer
        use_fused_clip(ds_engine, world.size)
        if world.size == 1:
            skip_lone_allreduce(ds_engine)
    return ds_engine


def skip_lone_allreduce(ds_engine: Any) -> None:
    """One process at ZeRO 0: the engine's gradient all-reduce averages over a world of one,
    which changes nothing, yet it flattens, reduces and copies every gradient back each step
    (73 copies a step in the loop profile, collate.md), host work on a host-bound GPU loop.
    DeepSpeed's own switch for it (`enable_backward_allreduce`, off when there is no backend)
    leaves it out; the gradients are the same to the bit (tests/test_engine.py)."""
    ds_engine.enable_backward_allreduce = False


def use_fused_clip(ds_engine: Any, world_size: int) -> None:
    """The engine's ZeRO 0 clipping (`clip_fp32_gradients`, called by its `step` when
    `gradient_clipping` > 0) done by `fused_clip`. The parameter list is taken once: DeepSpeed
    walks the module tree for it every step. Leaving this out keeps DeepSpeed's own loop."""
    params = list(ds_engine.module.parameters())
    ds_engine.clip_fp32_gradients = lambda: fused_clip(
        params, ds_engine.gradient_clipping(), world_size
    )


def fused_clip(parameters: Iterable[nn.Parameter], max_norm: float, world_size: int) -> None:
    """DeepSpeed 0.19.8's `clip_grad_norm_` (runtime/utils.py, 2-norm, no model parallelism)
    with one foreach call where it loops over parameters and no host-to-device copy. The
    arithmetic is the same, step for step, so on the CPU, where foreach ops run per tensor,
    the gradients are bit-identical to DeepSpeed's (tests/test_engine.py); on a GPU the fused
    kernels may round the norm differently. ZeRO 0 gradients are already averaged over ranks;
    the total is averaged once more as DeepSpeed does (for mixture-of-experts parameters,
    identical here)."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return
    norms = torch._foreach_norm(grads, 2.0)
    total = torch.stack(norms).pow(2.0).sum().float().pow(0.5)
    total = total * 1.0 / float(world_size)
    if world_size > 1:
        dist.all_reduce(total)
    # DeepSpeed divides a new tensor([max_norm]) and takes min with a new tensor([1.0]): on a
    # GPU each is a copy from pageable host memory, which waits for the stream to drain. Filled
    # on the device and clamped instead, the values are the same.
    coef = (torch.full_like(total, float(max_norm)) / (total + 1e-6)).clamp(max=1.0)
    torch._foreach_mul_(grads, coef)


def configure_dynamo() -> None:
    """Dynamo captures the masked-LM selection's data-dependent shape instead of breaking the
    graph, so the dense and relative pretraining models trace as one (tests/test_compile.py);
    room for the recompiles of designs that route on the data (multi-scale: one per layer
    distribution). Global settings: compiling is lazy, at the first step."""
    import torch._dynamo as dynamo

    from tibnlp.models.pretraining import DYNAMO_CAPTURE

    for key, value in DYNAMO_CAPTURE.items():
        setattr(dynamo.config, key, value)
    dynamo.config.recompile_limit = max(dynamo.config.recompile_limit, 64)


def compile_in_place(model: nn.Module, backend: str = "inductor") -> None:
    """`torch.compile` of the module in place: its state_dict keys stay the same, so
    checkpoints, resume and exports do not see it."""
    configure_dynamo()
    model.compile(backend=backend)


def shutdown(world: World) -> None:
    """Leave the process group. Under a launcher, processes that exit with the group alive
    hang at interpreter exit (seen with gloo on CPU); a single local process keeps it for reuse."""
    if world.size > 1 and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
        worker_exit.left_group()  # the process must end through worker_exit.end


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def all_gather_objects(obj: Any) -> list[Any]:
    """`obj` of every rank, in rank order (collective; a list of one without a group)."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def all_reduce_sum(values: torch.Tensor) -> torch.Tensor:
    """Sum a small CPU tensor across ranks (moved to the GPU and back under NCCL)."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return values
    on_device = values.cuda() if dist.get_backend() == "nccl" else values
    dist.all_reduce(on_device, op=dist.ReduceOp.SUM)
    return on_device.cpu()
