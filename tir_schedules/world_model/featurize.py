"""From tasks and traces to the network's tensors, with caches for the search's repeats.

A task contributes its initial-state vector, loop extents and hardware vector once; a trace
its action rows (cached by the trace's search-part signature: the evolutionary search scores
the same candidates many times).
"""
import numpy as np
import torch

from .action_encoder import ACTION_DIM, encode_actions, trace_signature
from .hardware import encode_hardware
from .state_encoder import block_loop_extents, encode_state, state_key
from .trace_json import trace_to_json


class Featurizer:
    def __init__(self, max_cached_traces=50000):
        self.tasks, self.traces, self.max_cached = {}, {}, max_cached_traces

    def task(self, mod, target):
        """``(key, state vector, loop extents, hardware vector)`` of a task."""
        key = (state_key(mod), str(target))
        if key not in self.tasks:
            self.tasks[key] = (key, encode_state(mod), block_loop_extents(mod), encode_hardware(target))
        return self.tasks[key]

    def actions(self, trace_json, loop_extents):
        sig = trace_signature(trace_json)
        rows = self.traces.get(sig)
        if rows is None:
            rows = encode_actions(trace_json, loop_extents)
            if len(self.traces) >= self.max_cached:
                self.traces.clear()
            self.traces[sig] = rows
        return rows

    def candidates(self, context, candidates):
        """Task tuple and action rows of MetaSchedule ``MeasureCandidate``s."""
        task = self.task(context.mod, context.target)
        return task, [self.actions(trace_to_json(c.sch.trace), task[2]) for c in candidates]


def pad(action_list):
    """``(actions [B,T,A], mask [B,T])`` float32 tensors from per-trace rows."""
    width = max(1, max(len(a) for a in action_list))
    acts = np.zeros((len(action_list), width, ACTION_DIM), dtype=np.float32)
    mask = np.zeros((len(action_list), width), dtype=np.float32)
    for i, a in enumerate(action_list):
        acts[i, :len(a)] = a
        mask[i, :len(a)] = 1.0
    return torch.from_numpy(acts), torch.from_numpy(mask)
