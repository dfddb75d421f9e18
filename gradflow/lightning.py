# gradflow/lightning.py — public name of the PyTorch Lightning binding:
# `from gradflow.lightning import GradflowStrategy`. Re-exports only; the
# strategy lives in gradflow/torch/lightning_strategy.py (torch is imported
# only under gradflow/torch/).
"""PyTorch Lightning strategy for gradflow: see
:mod:`gradflow.torch.lightning_strategy` (GradflowStrategy, GradflowEnvironment,
strategy_classes). Raises ImportError naming the package to install when
neither ``lightning`` nor ``pytorch-lightning`` is importable."""
from .torch.lightning_strategy import GradflowEnvironment, GradflowStrategy, strategy_classes

__all__ = ["GradflowStrategy", "GradflowEnvironment", "strategy_classes"]
