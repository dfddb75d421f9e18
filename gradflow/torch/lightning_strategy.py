# lightning_strategy.py — PyTorch Lightning binding (public as
# gradflow.lightning): GradflowStrategy (data-parallel
# training with gradflow's torch DistributedOptimizer) and GradflowEnvironment
# (tells Lightning the rank/size that gradflowrun or mpiexec gave this process,
# so Lightning spawns nothing). A thin adapter: every collective goes through
# gradflow.torch; no communication logic here.
"""PyTorch Lightning strategy for gradflow (the successor of Lightning 1.x's
``HorovodStrategy``)::

    import lightning.pytorch as pl            # or: import pytorch_lightning as pl
    from gradflow.lightning import GradflowStrategy

    trainer = pl.Trainer(strategy=GradflowStrategy(), accelerator="cpu", devices=1)
    trainer.fit(model, train_loader)          # gradflowrun -np 4 python train.py

One process per rank, started by ``gradflowrun`` / ``mpiexec`` / ``srun``;
``devices=1`` (each process drives one device). The strategy

* wraps every optimizer of ``configure_optimizers`` in
  :func:`gradflow.torch.DistributedOptimizer` (options pass through:
  compression, sparse_ratio, use_pool, bucket_mb, ...; Lightning's
  ``accumulate_grad_batches`` becomes ``backward_passes_per_step``, the
  GradScaler of Lightning's 16-bit AMP plugin becomes ``grad_scaler``), and
  waits for the reduced gradients right after backward, before Lightning's
  gradient clipping and the optimizer step;
* broadcasts parameters and optimizer state (where some rank has any) from
  rank 0 before training;
* gives Lightning a ``DistributedSampler`` split (``num_replicas=size``,
  ``rank=rank``), ``reduce`` / ``all_gather`` / ``broadcast`` / ``barrier``
  over gradflow collectives (so ``self.log(..., sync_dist=True)`` averages
  across ranks), and writes checkpoints on rank 0 only.

Unlike Lightning 1.x's HorovodStrategy, the learning rate is *not* scaled by
the number of ranks (as in Lightning's DDPStrategy): scale it yourself.
Which Lightning: ``lightning.pytorch`` (package ``lightning``) if importable,
else ``pytorch_lightning``; :func:`strategy_classes` picks one explicitly.
"""
from __future__ import annotations

import contextlib
import importlib
from typing import Any, Dict, Optional, Tuple

import torch

from .. import _runtime
from ..collectives import Average, Max, Min, Sum
from ..compression import Compression
from ..settings_check import native_sparse_ratio, pool_bucket_bytes

__all__ = ["GradflowStrategy", "GradflowEnvironment", "strategy_classes"]

_PACKAGES = {  # trainer package -> its fabric (environments, distributed helpers)
    "lightning.pytorch": "lightning.fabric",
    "pytorch_lightning": "lightning_fabric",
}
_built: Dict[str, Tuple[type, type]] = {}


def _reduce_op(reduce_op: Any) -> Tuple[int, bool]:
    """Lightning's reduce_op (None/'mean'/'avg'/'sum'/'max'/'min', or a
    torch.distributed.ReduceOp) -> (gradflow op, is a mean)."""
    if reduce_op is None:
        return Average, True
    if isinstance(reduce_op, str):
        key = reduce_op.lower()
    else:  # torch.distributed.ReduceOp (or its RedOpType) prints like "RedOpType.SUM"
        key = str(getattr(reduce_op, "name", reduce_op)).rsplit(".", 1)[-1].lower()
    table = {"mean": (Average, True), "avg": (Average, True), "sum": (Sum, False),
             "max": (Max, False), "min": (Min, False)}
    if key not in table:
        raise ValueError(f"gradflow.lightning: unsupported reduce_op {reduce_op!r}; use 'mean', "
                         "'sum', 'max', 'min' or the matching torch.distributed.ReduceOp")
    return table[key]


class _ScaleGradient(torch.autograd.Function):
    """Identity forward; the gradient multiplied by `factor`."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, factor: int) -> torch.Tensor:
        ctx.factor = factor
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[torch.Tensor, None]:
        return grad * ctx.factor, None


def _no_group(group: Any, what: str) -> None:
    if group is None:
        return
    world = getattr(getattr(torch.distributed, "group", None), "WORLD", None)
    if world is None or group is not world:
        raise ValueError(f"gradflow.lightning: {what} over a process group is not supported "
                         f"(got group={group!r}); gradflow reduces over all ranks")


def _build(package: str) -> Tuple[type, type]:
    strategies = importlib.import_module(package + ".strategies")
    environments = importlib.import_module(_PACKAGES[package] + ".plugins.environments")
    import gradflow.torch as gf  # imported late: this module is imported by gradflow.lightning

    class GradflowEnvironment(environments.ClusterEnvironment):
        """Lightning ClusterEnvironment reporting gradflow's rank and size.
        Processes are created externally (gradflowrun, mpiexec, srun), so
        Lightning's launcher spawns none; gradflow is initialised on first use."""

        def __init__(self) -> None:
            _runtime.init()

        @property
        def creates_processes_externally(self) -> bool:
            return True

        @property
        def main_address(self) -> str:  # torch.distributed is not used: no rendezvous
            return "127.0.0.1"

        @property
        def main_port(self) -> int:
            return 0

        @staticmethod
        def detect() -> bool:
            return _runtime.is_initialized()

        def world_size(self) -> int:
            return _runtime.size()

        def set_world_size(self, size: int) -> None:
            if size != _runtime.size():  # Lightning asks for devices * num_nodes processes
                raise ValueError(
                    f"gradflow.lightning: Lightning expects {size} processes but gradflow runs "
                    f"{_runtime.size()}; start one process per rank with gradflowrun/mpiexec and "
                    "pass devices=1, num_nodes=1 to the Trainer")

        def global_rank(self) -> int:
            return _runtime.rank()

        def set_global_rank(self, rank: int) -> None:
            pass  # fixed by the launcher

        def local_rank(self) -> int:
            return _runtime.local_rank()

        def node_rank(self) -> int:
            return _runtime.cross_rank()

        def validate_settings(self, num_devices: int, num_nodes: int) -> None:
            if num_devices != 1 or num_nodes != 1:
                raise ValueError(
                    "gradflow.lightning: use Trainer(devices=1, num_nodes=1): each process started "
                    f"by gradflowrun/mpiexec is one rank (got devices={num_devices}, "
                    f"num_nodes={num_nodes})")

    class GradflowStrategy(strategies.ParallelStrategy):
        """Data-parallel training over gradflow. Keyword arguments other than
        Lightning's (accelerator, checkpoint_io, precision_plugin) go to
        :func:`gradflow.torch.DistributedOptimizer`; ``backward_passes_per_step``
        is taken from the Trainer's ``accumulate_grad_batches``."""

        strategy_name = "gradflow"

        def __init__(self, compression: Any = Compression.none, op: int = Average,
                     gradient_predivide_factor: float = 1.0, sparse_ratio: Optional[float] = None,
                     use_pool: bool = True, bucket_mb: Optional[float] = None,
                     sparse_as_dense: bool = False, accelerator: Any = None,
                     checkpoint_io: Any = None, precision_plugin: Any = None) -> None:
            # Checked here, where the user passed them, not first in setup()
            # when DistributedOptimizer gets them (settings_check.py).
            native_sparse_ratio(sparse_ratio, "GradflowStrategy")
            pool_bucket_bytes(bucket_mb, "GradflowStrategy")
            env = GradflowEnvironment()
            super().__init__(accelerator=accelerator, parallel_devices=None,
                             cluster_environment=env, checkpoint_io=checkpoint_io,
                             precision_plugin=precision_plugin)
            # Lightning's connector sets Trainer(num_nodes=...) here only if
            # the attribute exists; set_world_ranks refuses anything but 1.
            self.num_nodes = 1
            self._optimizer_kwargs = dict(
                compression=compression, op=op, gradient_predivide_factor=gradient_predivide_factor,
                sparse_ratio=sparse_ratio, use_pool=use_pool, bucket_mb=bucket_mb,
                sparse_as_dense=sparse_as_dense)

        # ---------------------------------------------------------- topology
        @property
        def root_device(self) -> torch.device:
            devices = self.parallel_devices or [torch.device("cpu")]
            if devices[0].type == "cuda":  # one GPU per rank on its node (not run here)
                return torch.device("cuda", self.local_rank)
            return devices[0]

        @property
        def is_distributed(self) -> bool:  # makes Lightning insert a DistributedSampler
            return True

        @property
        def distributed_sampler_kwargs(self) -> Dict[str, Any]:
            return {"num_replicas": self.world_size, "rank": self.global_rank}

        def set_world_ranks(self) -> None:
            assert self.cluster_environment is not None
            if self.parallel_devices is not None:
                self.cluster_environment.validate_settings(len(self.parallel_devices),
                                                           getattr(self, "num_nodes", 1))
            # Lightning's rank_zero_* helpers (logging, warnings) read these.
            importlib.import_module(package + ".utilities.rank_zero").rank_zero_only.rank = \
                self.global_rank
            with contextlib.suppress(ImportError):
                from lightning_utilities.core.rank_zero import rank_zero_only as utils_rzo
                utils_rzo.rank = self.global_rank

        def setup_environment(self) -> None:
            _runtime.init()
            super().setup_environment()

        def model_to_device(self) -> None:
            assert self.model is not None
            self.model.to(self.root_device)

        # ---------------------------------------------------------- training
        def setup(self, trainer: Any) -> None:
            super().setup(trainer)
            if trainer.state.fn != "fit":  # validate/test/predict: nothing to train
                return
            module = self.lightning_module
            gf.broadcast_parameters(module.state_dict(), root_rank=0)
            # LR schedulers from configure_optimizers keep the unwrapped
            # optimizer: it shares param_groups and state with the wrapped one,
            # and the step-counting patch torch's scheduler put on it (copied
            # along by DistributedOptimizer) runs the same update on that
            # shared state (tests/parallel/lightning_script.py checks it).
            # Lightning's AMP plugin ("16-mixed", or MixedPrecision(scaler=))
            # owns the GradScaler: the optimizer gets it as grad_scaler=, so
            # CSC residuals stay in unscaled units (DistributedOptimizer's
            # grad_scaler; a Lightning user has no other way to pass it).
            kwargs = dict(self._optimizer_kwargs)
            scaler = getattr(self.precision_plugin, "scaler", None)
            if scaler is not None:
                kwargs["grad_scaler"] = scaler
            # Optimizer state is broadcast only where some rank has any: on
            # a fresh fit every state is empty, and broadcast_optimizer_state
            # would then take Horovod's initialising step on zero gradients
            # (Adam's step count 1, AdamW's weight decay applied once) that
            # Lightning's DDPStrategy does not take (a resumed fit loads its
            # state on every rank after this setup).
            empty = [len(opt.state) == 0 for opt in self.optimizers]
            everyone = gf.allgather_object(empty, name="gradflow.lightning.optimizer_state")
            wrapped = []
            for i, opt in enumerate(self.optimizers):
                if not all(rank_empty[i] for rank_empty in everyone):
                    gf.broadcast_optimizer_state(opt, root_rank=0)
                if hasattr(opt, "_gradflow"):
                    wrapped.append(opt)  # the user wrapped it already
                    continue
                mine = {id(p) for group in opt.param_groups for p in group["params"]}
                named = [(n, p) for n, p in module.named_parameters() if id(p) in mine]
                wrapped.append(gf.DistributedOptimizer(
                    opt, named_parameters=named,
                    backward_passes_per_step=trainer.accumulate_grad_batches, **kwargs))
            self.optimizers = wrapped

        def optimizer_step(self, optimizer: Any, closure: Any, model: Any = None,
                           **kwargs: Any) -> Any:
            """Lightning's closure runs training_step and backward inside
            optimizer.step(); the reduced gradients are waited for at the end
            of the closure, so gradient clipping and the step see them."""
            gopt = getattr(optimizer, "_optimizer", optimizer)  # LightningOptimizer -> torch
            module = model if model is not None else self.lightning_module
            if not hasattr(gopt, "_gradflow") or not getattr(module, "automatic_optimization",
                                                              True):
                # Manual optimization: the user's manual_backward() ran before
                # opt.step() and its gradients were reduced when it returned
                # (as under DDP); Lightning's closure runs no backward, so
                # there is nothing to wait for in it. Synchronizing there
                # raised "no backward pass produced a gradient" at every
                # opt.step() (found by the 2026-11-28 combination audit).
                return super().optimizer_step(optimizer, closure, model, **kwargs)

            def closure_then_synchronize() -> Any:
                out = closure()
                gopt.synchronize()
                return out

            with gopt.skip_synchronize():
                return super().optimizer_step(optimizer, closure_then_synchronize, model, **kwargs)

        # ---------------------------------------------------------- collectives
        def reduce(self, tensor: Any, group: Any = None, reduce_op: Any = "mean") -> Any:
            """Reduce a tensor across ranks (mean by default; sum, max, min)."""
            if not isinstance(tensor, torch.Tensor):
                return tensor
            _no_group(group, "reduce")
            op, mean = _reduce_op(reduce_op)
            if mean and not tensor.is_floating_point():
                tensor = tensor.float()  # the mean of integers is not an integer
            return gf.allreduce(tensor, op=op)

        def all_gather(self, tensor: torch.Tensor, group: Any = None,
                       sync_grads: bool = False) -> torch.Tensor:
            """Stack every rank's tensor (same shape everywhere) into
            (world_size, *shape), as Lightning's DDPStrategy returns. With
            sync_grads=True the result is differentiable as DDP's: the
            gradient of rank r's tensor is the sum over ranks of the
            gradient of row r (every rank must run that backward)."""
            _no_group(group, "all_gather")
            if sync_grads:
                # gradflow's allgather averages row r's gradient over the
                # ranks (Horovod's rule); DDP's (torch.distributed.nn's
                # all_gather) sums it.
                return gf.allgather(_ScaleGradient.apply(tensor, self.world_size).unsqueeze(0))
            return gf.allgather(tensor.detach().unsqueeze(0))

        def broadcast(self, obj: Any, src: int = 0) -> Any:
            return gf.broadcast_object(obj, root_rank=src)

        def barrier(self, name: Optional[str] = None) -> None:
            gf.barrier()

        def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
            total = int(gf.allreduce(torch.tensor([int(bool(decision))]), op=Sum).item())
            return total == self.world_size if all else total > 0

    for cls in (GradflowStrategy, GradflowEnvironment):  # readable reprs and error messages
        cls.__module__, cls.__qualname__ = "gradflow.lightning", cls.__name__
    return GradflowStrategy, GradflowEnvironment


def strategy_classes(package: str = "auto") -> Tuple[type, type]:
    """(GradflowStrategy, GradflowEnvironment) built on ``package``:
    "lightning.pytorch", "pytorch_lightning", or "auto" (the first importable).
    A Trainer only accepts a strategy from its own package."""
    if package == "auto":
        errors = []
        for name in _PACKAGES:
            try:
                return strategy_classes(name)
            except ImportError as e:
                errors.append(f"{name}: {e}")
        raise ImportError("gradflow.lightning needs PyTorch Lightning 2.x: pip install "
                          "'gradflow[lightning]' (or lightning / pytorch-lightning); "
                          + "; ".join(errors))
    if package not in _PACKAGES:
        raise ValueError(f"gradflow.lightning: package must be 'auto' or one of "
                         f"{sorted(_PACKAGES)}, got {package!r}")
    if package not in _built:
        _built[package] = _build(package)
    return _built[package]


GradflowStrategy, GradflowEnvironment = strategy_classes("auto")
