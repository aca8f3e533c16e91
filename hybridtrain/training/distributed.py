"""Distributed: the torchrun process group a training process is one rank of — rank, world size, local rank.

``torchrun --nproc_per_node=N`` (``python -m torch.distributed.run``) starts N copies of the
training program and tells each its place through ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and
``MASTER_ADDR``/``MASTER_PORT``. ``Distributed.from_env()`` reads them (``None`` for a single
process), ``process_group()`` joins the group with NCCL on CUDA and gloo on CPU, and the
``Trainer`` uses the rest: every rank takes its contiguous shard of each global batch
(``shard``), ``DistributedDataParallel`` all-reduces the gradients (``wrap``), the batch loss
is summed over ranks (``all_sum``), a stop request is agreed on by all ranks (``any``), and
only rank 0 (``is_main``) writes checkpoints and results.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn


@dataclass(frozen=True)
class Distributed:
    """One rank of a torchrun job: ``rank`` of ``world_size``, ``local_rank`` on its host."""

    rank: int
    world_size: int
    local_rank: int = 0

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size or self.local_rank < 0:
            raise ValueError(f"invalid rank {self.rank} / local rank {self.local_rank} of world size {self.world_size}")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Distributed | None:
        """The rank torchrun started this process as, or ``None`` when it runs alone (no or 1 ``WORLD_SIZE``)."""
        env = os.environ if env is None else env
        world = int(env.get("WORLD_SIZE", "1"))
        if world <= 1:
            return None
        return cls(rank=int(env["RANK"]), world_size=world, local_rank=int(env.get("LOCAL_RANK", "0")))

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that writes checkpoints, results and progress lines."""
        return self.rank == 0

    def device(self) -> torch.device:
        """This rank's GPU (``cuda:<local_rank>``) when CUDA is visible, else the CPU."""
        if torch.cuda.is_available():
            return torch.device("cuda", self.local_rank)
        return torch.device("cpu")

    def backend(self) -> str:
        return "nccl" if torch.cuda.is_available() else "gloo"

    @contextmanager
    def process_group(self) -> Iterator[Distributed]:
        """Join the group (rendezvous from torchrun's environment) for the duration of the block."""
        if torch.cuda.is_available():
            torch.cuda.set_device(self.local_rank)
        dist.init_process_group(self.backend(), rank=self.rank, world_size=self.world_size)
        try:
            yield self
        finally:
            dist.destroy_process_group()

    def shard(self, batch: torch.Tensor) -> torch.Tensor:
        """This rank's contiguous part of a global batch of row indices (sizes differ by at most one)."""
        return torch.tensor_split(batch, self.world_size)[self.rank]

    def wrap(self, model: nn.Module) -> nn.Module:
        """``model`` under DistributedDataParallel: gradients are averaged over the ranks in backward."""
        from torch.nn.parallel import DistributedDataParallel  # lazy: heavy (torch)

        param = next(model.parameters())
        ids = [param.device.index] if param.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)

    def all_sum(self, value: torch.Tensor) -> float:
        """The sum of a scalar over all ranks (every rank gets the same number)."""
        total = value.detach().reshape(1).to(torch.float64).clone()
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        return float(total.item())

    def any(self, flag: bool) -> bool:
        """True on every rank when ``flag`` is True on at least one (an all-reduce of the maximum)."""
        value = torch.tensor([1 if flag else 0], dtype=torch.int32)
        if dist.get_backend() == "nccl":
            value = value.cuda()
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return bool(value.item())

    def barrier(self) -> None:
        dist.barrier()
