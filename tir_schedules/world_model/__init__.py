"""A latent-dynamics ("compiler world model") cost model for MetaSchedule.

Candidates are scored by rolling their scheduling actions forward from the initial program in
a learned latent space (arXiv 2606.09312), not by featurizing each scheduled program:

- ``state_encoder``: features of the unscheduled PrimFunc (blocks, loops, traffic, ops);
- ``action_encoder``: one row per trace instruction (kind, decisions, loop extents touched);
- ``hardware``: target features; ``network``: encoder + GRU transition + head;
- ``train``: pairwise ranking within a task; ``cost_model``: ``WorldModelCostModel``;
- ``dataset``/``workloads``: tuning records and the tasks they come from;
- ``measure``: in-process builder/runner; ``metrics``: Kendall tau, top-k recall.
"""
from pathlib import Path

from .cost_model import WorldModelCostModel

# weights pretrained by ``python -m tir_schedules.world_model.pretrain`` (``make bench-dataset``),
# shipped inside the package
PRETRAINED = Path(__file__).resolve().parent / "pretrained.pt"

__all__ = ["WorldModelCostModel", "PRETRAINED"]
