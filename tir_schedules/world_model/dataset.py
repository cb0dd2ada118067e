"""The tuning dataset: per task, its family/params (to rebuild the initial program), its split,
and measured records ``{"trace": trace JSON, "secs": [run seconds]}``; gzip-compressed JSON.

``load_groups`` turns it into training groups (``train.Group``) and keeps what the evaluation
needs (the rebuilt module and the raw records) next to them.
"""
import gzip
import json

import numpy as np

from . import workloads
from .featurize import Featurizer
from .train import Group

VERSION = 1


def save(path, data):
    with gzip.open(path, "wt", encoding="utf-8") as f:
        json.dump(data, f, separators=(",", ":"))


def load(path):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        data = json.load(f)
    if data.get("version") != VERSION:
        raise ValueError(f"{path}: dataset version {data.get('version')!r}, expected {VERSION}")
    return data


def valid_records(task):
    return [r for r in task["records"] if r["secs"] and np.isfinite(np.median(r["secs"]))]


class TaskData:
    """One task of the dataset, featurized: ``group`` (tensors), ``records``, ``mod``."""

    def __init__(self, task, target, featurizer):
        self.name, self.family, self.split = task["name"], task["family"], task["split"]
        self.params = task["params"]
        self.mod = workloads.module(self.family, self.params)
        self.records = valid_records(task)
        key, state, extents, hw = featurizer.task(self.mod, target)
        self.state, self.hw = state, hw
        self.actions = [featurizer.actions(r["trace"], extents) for r in self.records]
        self.secs = np.array([float(np.median(r["secs"])) for r in self.records])
        self.group = Group(state, hw, self.actions, self.secs)


def load_tasks(path, target):
    """All tasks of a dataset file as ``TaskData``, featurized for ``target``."""
    data = load(path)
    featurizer = Featurizer()
    return [TaskData(t, target, featurizer) for t in data["tasks"] if len(valid_records(t)) >= 2]
