# sparse_join.py — what a torch DistributedOptimizer with sparse gradients
# tells the ranks that had joined (Note [Sparse gradients and join]); rides
# on join() itself (collectives Note [Join reports]), no traffic of its own.
"""Note [Sparse gradients and join]
---------------------------------
Gradients agreed sparse (an nn.Embedding(sparse=True), without
sparse_as_dense=True) travel by allgather, and only allreduce can run while
a rank has joined (the joined rank contributes identities to allreduces
only). The ranks still training fail such a step at once, with the core's
"allgather ... cannot run while rank 1 has called join()". The joined rank
was not told: it waited in join() until the others joined too (and then
returned as if nothing happened) or ended their program, when it raised
"shutdown() was called on rank 0 before this collective ran", naming no
cause (2 ranks, rank 1 joining after 2 of 4 steps; found by an audit).

Now a rank whose step was refused so remembers it, and the next join()
carries that as a report (its value: 1 + its rank; every rank gets the
maximum): when join() returns, every rank raises GradflowError naming the
rank and the cause. If a peer ends its program instead of joining, the
joined rank's join() error gets a note naming its own optimizers'
allgathered gradients. The report resets at every join(), so the next
epoch starts clean if the program catches the error.
"""
from __future__ import annotations

from typing import List

from .. import collectives
from .._runtime import GradflowError, rank

# The start of the core's refusal (native request_validation.cc); checked by
# test_collectives.py::test_join_with_distributed_optimizer (join_torch_script.py).
_REFUSAL = "has called join() (only allreduce can"


def _allgathered(s) -> List[str]:
    """The wrapper's parameters whose gradients travel by allgather. A state
    whose construction raised half-way (e.g. a second wrapping refused) is
    still in _LIVE until collected, without its settings: none."""
    if getattr(s, "sparse_as_dense", True) or getattr(s, "solo", False) or not s.sparse:
        return []
    cut = len(s.prefix) + 1
    return [s.names[i][cut:] for i in sorted(s.sparse)]


class _Report:
    """collectives.join_reports' entry (Note [Join reports])."""

    def __init__(self) -> None:
        self.value_now = 0  # 1 + this rank once a step was refused since the last join()

    def record(self, s, errors) -> None:
        """synchronize() drained `errors` in a step of the wrapper `s`."""
        if any(_REFUSAL in str(e) for e in errors):
            self.value_now = 1 + rank()

    def value(self) -> int:
        return self.value_now

    def check(self, maximum: int) -> None:
        self.value_now = 0
        if maximum:
            raise GradflowError(
                f"gradflow: join(): the ranks still training (rank {maximum - 1} among them) "
                "could not step a DistributedOptimizer while a rank had joined: its sparse "
                "gradients travel by allgather, which cannot run while a rank has joined (only "
                "allreduce can), so those steps failed there. Pass sparse_as_dense=True to "
                "DistributedOptimizer to use join() with sparse gradients (Note [Sparse "
                "gradients and join])")

    def note(self) -> str:
        from .optimizer_state import _LIVE  # noqa: PLC0415 - imports this module
        names = [f"{s.prefix} {tuple(_allgathered(s))}" for s in list(_LIVE) if _allgathered(s)]
        if not names:
            return ""
        return (" (this rank's " + ", ".join(names) + " allgathers sparse gradients, which "
                "cannot run while a rank has joined: any step the other ranks ran after this "
                "rank joined failed there; pass sparse_as_dense=True to DistributedOptimizer "
                "to use join() with sparse gradients)")


REPORT = _Report()
collectives.join_reports.append(REPORT)
