"""Pretrain the world model on a dataset's training tasks: ``python -m tir_schedules.world_model.pretrain``.

Fits the state normalization on the training tasks' initial programs, then runs the ranking
training (``train.fit``) and saves the weights (default: the package's ``pretrained.pt``).
"""
import argparse
import sys
import time
from pathlib import Path

import numpy as np

from .cost_model import WorldModelCostModel
from .train import fit

STEPS = 3000


def pretrain(tasks, steps=STEPS, seed=0, lr=3e-3, hidden=64):
    """A ``WorldModelCostModel`` trained on ``tasks`` (each with ``state`` and ``group``:
    ``dataset.TaskData``); returns ``(model, final mean loss, seconds)``."""
    model = WorldModelCostModel(hidden=hidden, seed=seed)
    model.set_normalization(np.stack([t.state for t in tasks]))
    start = time.time()
    loss = fit(model.net, [t.group for t in tasks], model.norm, steps, lr=lr, seed=seed)
    return model, loss, time.time() - start


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="bench/data/tuning", help="the dataset folder")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "pretrained.pt"))
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    from .dataset import load_tasks
    from .tuning import tuning_target
    tasks = load_tasks(args.data, tuning_target(), split="train")
    model, loss, secs = pretrain(tasks, args.steps, args.seed)
    model.save(args.out)
    print(f"[pretrain] {len(tasks)} tasks, {sum(t.group.n for t in tasks)} records, "
          f"loss {loss:.3f}, {secs:.1f} s -> {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
