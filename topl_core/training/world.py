"""Data-parallel training across processes: the same `train` under `accelerate launch --num_processes N` (or
torchrun), one process per device or CPU share.

Each optimizer step's micro-batches are the same in every world size (data order is a function of seed and step);
rank r computes the micro-batches j with j % world_size == r, the unit-weighted gradients are summed over the ranks
and divided by the step's total units, so every rank takes the same optimizer step as one process would (up to the
order of float additions). Only rank 0 writes the run directory. A single process is the world of size 1: the same
code, with collectives that do nothing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the one process that writes the run directory and reports progress."""
        return self.rank == 0

    @classmethod
    def current(cls) -> "World":
        """This process's place, from the launcher's environment (WORLD_SIZE, RANK, MASTER_ADDR / MASTER_PORT);
        joins the process group the first time (gloo on CPU, nccl on GPUs)."""
        size = int(os.environ.get("WORLD_SIZE", "1"))
        if size <= 1:
            return cls()
        import torch.distributed as dist

        if not dist.is_initialized():
            if torch.cuda.is_available():  # one GPU per local rank: "cuda" in the config means this rank's own
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        return cls(dist.get_rank(), dist.get_world_size())

    def mine(self, index: int) -> bool:
        """Whether this rank computes micro-batch `index` of a step."""
        return index % self.size == self.rank

    def sum_grads(self, params: list[torch.nn.Parameter]) -> None:
        """Every parameter's gradient summed over the ranks (a rank that computed nothing contributes zeros)."""
        if self.size == 1:
            return
        import torch.distributed as dist

        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad)

    def gather(self, items: list) -> list:
        """All ranks' items (each rank's list), concatenated in rank order."""
        if self.size == 1:
            return items
        import torch.distributed as dist

        out: list = [None] * self.size
        dist.all_gather_object(out, items)
        return [x for part in out for x in part]

    def any(self, flag: bool) -> bool:
        """True on every rank when any rank says so (a stop request seen by rank 0 stops them all)."""
        if self.size == 1:
            return flag
        import torch.distributed as dist

        t = torch.tensor([int(flag)])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())

    def barrier(self) -> None:
        if self.size > 1:
            import torch.distributed as dist

            dist.barrier()
