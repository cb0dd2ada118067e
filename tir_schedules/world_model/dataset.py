"""The tuning dataset: one gzip-compressed JSON file per task in a folder (``bench/data/tuning``).

A task file holds what rebuilds its initial program (``family`` and ``params``, or a model
kernel's TVMScript, ``script``: ``workloads.task_module``), its ``split`` ("train" or
"heldout") and its measured records ``{"trace": trace JSON, "secs": [run seconds] or null,
"round": r}``.  ``load_tasks`` turns a folder into featurized ``TaskData``: training groups
(``train.Group``) with the rebuilt module and the raw records next to them.
"""
import glob
import gzip
import json
import os

import numpy as np

from . import workloads
from .featurize import Featurizer
from .train import Group

VERSION = 2


def save(path, data):
    with gzip.open(path, "wt", encoding="utf-8") as f:
        json.dump(data, f, separators=(",", ":"))


def load(path):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        data = json.load(f)
    if data.get("version") != VERSION:
        raise ValueError(f"{path}: dataset version {data.get('version')!r}, expected {VERSION}")
    return data


def task_files(folder):
    """The task files of a dataset folder, in name order."""
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"{folder}: no such dataset folder (make it with `python -m bench.tuning_dataset`)")
    return sorted(glob.glob(os.path.join(folder, "*.json.gz")))


def valid_records(task):
    return [r for r in task["records"] if r["secs"] and np.isfinite(np.median(r["secs"]))]


class TaskData:
    """One task of the dataset, featurized: ``group`` (tensors), ``records``, ``mod``."""

    def __init__(self, task, target, featurizer):
        self.name, self.family, self.split = task["name"], task["family"], task["split"]
        self.params = task["params"]
        self.mod = workloads.task_module(task)
        self.records = valid_records(task)
        _, state, extents, hw = featurizer.task(self.mod, target)
        self.state, self.hw = state, hw
        self.actions = [featurizer.actions(r["trace"], extents) for r in self.records]
        self.secs = np.array([float(np.median(r["secs"])) for r in self.records])
        self.group = Group(state, hw, self.actions, self.secs)


def load_tasks(folder, target, split=None):
    """The tasks of a dataset folder with at least two measured records, as ``TaskData``
    featurized for ``target``; only those of ``split`` when given."""
    featurizer = Featurizer()
    tasks = (load(p) for p in task_files(folder))
    return [TaskData(t, target, featurizer) for t in tasks
            if (split is None or t["split"] == split) and len(valid_records(t)) >= 2]
