"""Data-parallel training across processes: the same `train` under `accelerate launch --num_processes N` (or
torchrun), one process per device or CPU share.

Each optimizer step's micro-batches are the same in every world size (data order is a function of seed and step);
rank r computes the micro-batches j with j % world_size == r, the unit-weighted gradients are summed over the ranks
and divided by the step's total units, so every rank takes the same optimizer step as one process would (up to the
order of float additions). Only rank 0 writes the run directory. A single process is the world of size 1: the same
code, with collectives that do nothing.

FSDP (accelerate's `distributed_type: FSDP`, i.e. ACCELERATE_USE_FSDP=true; or TOPL_FSDP=1 under torchrun): each
decoder layer is sharded across the ranks with torch's FSDP2 (`fully_shard`), so a rank holds 1/N of the frozen base
layers and of the LoRA; the embeddings, final norm and head stay whole on every rank. The step is the same: FSDP
reduce-scatters the LoRA gradients (their mean; multiplied back to the sum here), and every rank runs the same
number of forward passes (a rank with fewer micro-batches runs one with weight 0), as the layers' all-gathers need.
Checkpoints and the final adapter hold whole tensors (`full`), so a run resumes with or without FSDP, on any world
size; validation and checkpoints run on every rank under FSDP (their all-gathers), rank 0 alone writes.
"""

from __future__ import annotations

import atexit
import os
from dataclasses import dataclass

import torch

from ..models.architecture import decoder_layers

FSDP_ENV = ("ACCELERATE_USE_FSDP", "TOPL_FSDP")  # accelerate's switch, and ours for torchrun


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    fsdp: bool = False  # decoder layers sharded across the ranks (FSDP2) instead of a whole copy on each

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
            # leave the group before the interpreter tears down: a gloo group left to exit-time destructors while
            # the other rank has gone can abort ("terminate called without an active exception", seen once in CI
            # when a stopped two-process run exited)
            atexit.register(lambda: dist.is_initialized() and dist.destroy_process_group())
        fsdp = any(os.environ.get(k, "").lower() in ("1", "true") for k in FSDP_ENV)
        return cls(dist.get_rank(), dist.get_world_size(), fsdp)

    def mine(self, index: int) -> bool:
        """Whether this rank computes micro-batch `index` of a step."""
        return index % self.size == self.rank

    def passes(self, n: int) -> int:
        """How many forward passes this rank runs for a step of n micro-batches: its own, or under FSDP the most
        any rank has (every rank's layers all-gather together)."""
        mine = len(range(self.rank, n, self.size))
        return -(-n // self.size) if self.fsdp else mine

    def shard(self, model: torch.nn.Module) -> None:
        """Under FSDP, shard every decoder layer (frozen weights and LoRA) across the ranks; otherwise nothing."""
        if not self.fsdp:
            return
        from torch.distributed.fsdp import fully_shard

        for layer in decoder_layers(model):
            fully_shard(layer)

    def sum_grads(self, params: list[torch.nn.Parameter]) -> None:
        """Every parameter's gradient summed over the ranks (a rank that computed nothing contributes zeros). A
        sharded parameter's gradient arrives reduce-scattered as the ranks' mean: multiplied back to the sum."""
        if self.size == 1:
            return
        import torch.distributed as dist
        from torch.distributed.tensor import DTensor

        for p in params:
            if isinstance(p, DTensor):
                if p.grad is not None:
                    p.grad.mul_(self.size)
                continue
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad)

    def clip_grad_norm(self, params: list[torch.nn.Parameter], max_norm: float) -> float:
        """torch.nn.utils.clip_grad_norm_ over whole and sharded gradients alike: the norm of every gradient
        together (a shard's squares summed over the ranks), all scaled by min(1, max_norm / norm)."""
        if not self.fsdp:
            return float(torch.nn.utils.clip_grad_norm_(params, max_norm))
        import torch.distributed as dist
        from torch.distributed.tensor import DTensor

        grads = [p.grad for p in params if p.grad is not None]
        sharded = torch.zeros((), dtype=torch.float64)
        whole = torch.zeros((), dtype=torch.float64)
        for g in grads:
            if isinstance(g, DTensor):
                sharded += g.to_local().double().pow(2).sum().cpu()
            else:
                whole += g.double().pow(2).sum().cpu()
        dist.all_reduce(sharded)
        norm = float((sharded + whole).sqrt())
        scale = max_norm / (norm + 1e-6)
        if scale < 1:
            for g in grads:
                g.mul_(scale)
        return norm

    def full(self, t: torch.Tensor) -> torch.Tensor:
        """A tensor whole on this rank (a shard's all-gather: every rank must call it, in the same order)."""
        from torch.distributed.tensor import DTensor

        return t.full_tensor() if isinstance(t, DTensor) else t

    def place(self, whole: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """`whole` laid out as `like`: this rank's shard when `like` is sharded (from a checkpoint's whole tensor)."""
        from torch.distributed.tensor import DTensor, distribute_tensor

        if isinstance(like, DTensor):
            return distribute_tensor(whole.to(like.device, like.dtype), like.device_mesh, like.placements)
        return whole

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
