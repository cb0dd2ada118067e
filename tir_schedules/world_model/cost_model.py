"""``WorldModelCostModel``: the latent-dynamics evaluator as a MetaSchedule cost model.

``predict`` encodes the task's initial program and each candidate's trace and rolls the
actions through the network (no lowering, no feature extraction of the scheduled program);
``update`` adds the measured candidates to a per-task buffer and fine-tunes on it for a few
steps (online, like ``XGBModel`` retrains); ``save``/``load`` keep weights, the state
normalization and the online buffer's size settings in one ``torch.save`` file.
"""
import numpy as np
import torch
from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.cost_model import PyCostModel

from .action_encoder import ACTION_DIM
from .featurize import Featurizer
from .hardware import HW_DIM
from .network import LatentDynamics
from .state_encoder import STATE_DIM
from .train import Group, fit, score

torch.set_num_threads(1)   # the tuning machine is shared; the model is tiny


@derived_object
class WorldModelCostModel(PyCostModel):
    """Latent-dynamics cost model.  ``path``: a file written by ``save`` (pretrained weights)."""

    def __init__(self, path=None, hidden=64, finetune_steps=40, finetune_lr=1e-3, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.net = LatentDynamics(STATE_DIM, ACTION_DIM, HW_DIM, hidden)
        self.norm = (torch.zeros(STATE_DIM), torch.ones(STATE_DIM))
        self.finetune_steps, self.finetune_lr, self.seed = finetune_steps, finetune_lr, seed
        self.features = Featurizer()
        self.online = {}     # task key -> [task tuple, action rows list, seconds list]
        self.net.eval()
        if path is not None:
            self.load(path)

    def load(self, path):
        blob = torch.load(path, weights_only=True)
        dims = {k: int(v) for k, v in blob["dims"].items()}
        if (dims["state_dim"], dims["action_dim"], dims["hw_dim"]) != (STATE_DIM, ACTION_DIM, HW_DIM):
            raise ValueError(f"{path}: model dims {dims} do not match this encoder "
                             f"({STATE_DIM}, {ACTION_DIM}, {HW_DIM})")
        self.net = LatentDynamics(dims["state_dim"], dims["action_dim"], dims["hw_dim"], dims["hidden"])
        self.net.load_state_dict(blob["state_dict"])
        self.net.eval()
        self.norm = (blob["mean"], blob["std"])

    def save(self, path):
        torch.save({"state_dict": self.net.state_dict(), "mean": self.norm[0], "std": self.norm[1],
                    "dims": dict(self.net.dims)}, path)

    def set_normalization(self, states):
        """State normalization from training states (rows of ``encode_state``)."""
        states = torch.as_tensor(np.asarray(states, np.float32))
        self.norm = (states.mean(0), states.std(0).clamp(min=1e-3) if len(states) > 1 else torch.ones(states.shape[1]))

    def update(self, context, candidates, results):
        if not candidates:
            return
        task, actions = self.features.candidates(context, candidates)
        entry = self.online.setdefault(task[0], [task, [], []])
        for rows, res in zip(actions, results):
            secs = [float(s) for s in res.run_secs] if res.run_secs else []
            if res.error_msg is None and secs and np.isfinite(np.median(secs)):
                entry[1].append(rows)
                entry[2].append(float(np.median(secs)))
        if len(entry[2]) >= 2 and self.finetune_steps > 0:
            group = Group(task[1], task[3], entry[1], entry[2])
            fit(self.net, [group], self.norm, self.finetune_steps, lr=self.finetune_lr,
                seed=self.seed + len(entry[2]))

    def predict(self, context, candidates):
        if not candidates:
            return np.zeros(0, dtype="float64")
        task, actions = self.features.candidates(context, candidates)
        s = score(self.net, task[1], task[3], actions, self.norm)
        return np.exp(np.clip(s - s.max(), -20.0, 0.0)).astype("float64")
