"""Data-parallel training on PyTorch's own engine, launched by ``torchrun``.

``torchrun --nproc_per_node N ...`` sets ``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE`` in every
process; :func:`init_distributed` reads them, joins the process group (gloo on CPU, NCCL on GPU)
and picks the device.  Without them everything runs as a single process and the helpers below
become no-ops, so the Trainer has one code path.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import warnings

import torch
import torch.distributed as dist
from torch import nn

from ..errors import ConfigError

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class DistEnv:
    """Where this process sits in the job.

    Attributes:
        rank: global rank (0 writes files and shows progress).
        world_size: number of processes.
        local_rank: rank on this machine (selects the GPU).
        device: the torch device this process trains on.
        owns_group: True when :func:`init_distributed` created the process group (and so should
            destroy it in :func:`cleanup`).
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = dataclasses.field(default_factory=lambda: torch.device("cpu"))
    owns_group: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def _pick_device(device: str, local_rank: int, distributed: bool) -> torch.device:
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError("device cuda was asked for but torch sees no CUDA GPU; use --device cpu")
        if device == "cuda":
            return torch.device("cuda", local_rank if distributed else torch.cuda.current_device())
        return torch.device(device)
    return torch.device("cpu")


def init_distributed(device: str | torch.device = "auto") -> DistEnv:
    """Read torchrun's environment, join the process group when there is more than one process.

    Args:
        device: the resolved ``torch.device`` (a :class:`lmforge.devices.Compute`'s), or a name: ``auto``,
            ``cpu``, ``cuda`` or ``cuda:N`` (``cuda`` under torchrun = ``cuda:LOCAL_RANK``).
    Returns:
        The :class:`DistEnv` of this process.
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", str(rank)))
    dev = device if isinstance(device, torch.device) else _pick_device(device, local_rank, world_size > 1)
    owns = False
    if world_size > 1:
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        if not dist.is_initialized():
            backend = "nccl" if dev.type == "cuda" else "gloo"
            kwargs = {"device_id": dev} if dev.type == "cuda" else {}
            dist.init_process_group(backend=backend, **kwargs)
            owns = True
            logger.debug("joined %s process group: rank %d of %d on %s", backend, rank, world_size, dev)
        rank, world_size = dist.get_rank(), dist.get_world_size()
    return DistEnv(rank=rank, world_size=world_size, local_rank=local_rank, device=dev, owns_group=owns)


def wrap_model(model: nn.Module, env: DistEnv, find_unused_parameters: bool = False) -> nn.Module:
    """Wrap ``model`` (already on ``env.device``) in ``DistributedDataParallel`` when distributed.

    DDP broadcasts rank 0's parameters at construction, so every rank starts from the same weights,
    and averages gradients over ranks in ``backward``.  ``find_unused_parameters`` is needed when the
    loss leaves some parameters out (e.g. BERT's NSP head with ``next_sentence=false``); it costs a
    graph traversal per step, so the Trainer turns it on only when a probe step finds such parameters.

    Buffers are not broadcast: lmforge's buffers are constants every rank builds identically from the
    config and tokenizer (ELMo's int16 character table, which gloo cannot even broadcast); a model with
    running statistics (BatchNorm) would keep them per rank, and rank 0's are the ones saved.
    """
    if not env.distributed:
        return model
    from torch.nn.parallel import DistributedDataParallel

    ids = [env.device.index] if env.device.type == "cuda" else None
    with warnings.catch_warnings():
        # torch 2.13 deprecates broadcast_buffers for forward_sync_buffers, which still syncs buffers once at
        # init (gloo cannot send ELMo's int16 table); its warning says to keep broadcast_buffers=False until
        # an init-time switch exists, so the warning is silenced here and nowhere else
        warnings.filterwarnings("ignore", message=".*broadcast_buffers.*", category=FutureWarning)
        return DistributedDataParallel(
            model, device_ids=ids, find_unused_parameters=find_unused_parameters, broadcast_buffers=False
        )


def any_rank(flag: bool, env: DistEnv) -> bool:
    """True on every rank when ``flag`` is True on at least one."""
    if not env.distributed:
        return flag
    t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=env.device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return bool(t.item())


def all_reduce_sum(t: torch.Tensor, env: DistEnv) -> torch.Tensor:
    """Sum a tensor over ranks (in place; returns it).  No-op for one process."""
    if env.distributed:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def broadcast_flag(flag: bool, env: DistEnv) -> bool:
    """Rank 0's boolean, on every rank (so all ranks stop at the same step)."""
    if not env.distributed:
        return flag
    t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=env.device)
    dist.broadcast(t, src=0)
    return bool(t.item())


def all_gather_objects(obj, env: DistEnv) -> list:
    """Every rank's ``obj`` (picklable, in memory only) as a list indexed by rank."""
    if not env.distributed:
        return [obj]
    out: list = [None] * env.world_size
    dist.all_gather_object(out, obj)
    return out


def barrier(env: DistEnv) -> None:
    if env.distributed:
        dist.barrier()


def cleanup(env: DistEnv, wait: bool = True) -> None:
    """Leave the process group if :func:`init_distributed` created it.

    Args:
        wait: first wait until every rank gets here. A rank that tears the group down while rank 0 still
            writes its last files (a checkpoint, the plot, the model card) can abort in gloo's shutdown
            ("terminate called without an active exception"), and torchrun then kills rank 0 as well.
            Pass ``False`` on an error path, where a peer may never arrive.
    """
    if env.owns_group and dist.is_initialized():
        if wait and env.distributed:
            dist.barrier()
        dist.destroy_process_group()
        env.owns_group = False
