"""Embedding of scheduling actions: one fixed-length row per trace instruction.

A row holds the instruction kind (one-hot over MetaSchedule's instruction vocabulary), its
decisions or literal values (split factors, categorical choice, annotation value), the extents
of the loops it touches, a hashed annotation key and string value, and its position.  Loop
extents come from a small symbolic replay: ``GetLoops`` on a block of the initial program gives
its loop extents, ``Split`` gives the factors, ``Fuse`` the product -- so an action on loop
``l17`` says how long ``l17`` is, which the raw trace does not (the paper's "referential
ambiguity").  All magnitudes are ``log2(1 + x) / 10``.
"""
import json
import math
import re
import zlib

import numpy as np

from .trace_json import search_part

KINDS = ("GetSBlock", "GetLoops", "GetChildBlocks", "GetProducers", "GetConsumers",
         "SamplePerfectTile", "SamplePartitionedTile", "SampleCategorical",
         "SampleComputeLocation", "Split", "Fuse", "Reorder", "Parallel", "Vectorize", "Unroll",
         "Bind", "CacheRead", "CacheWrite", "ReIndex", "ComputeAt", "ReverseComputeAt",
         "ComputeInline", "ReverseComputeInline", "DecomposeReduction", "RFactor",
         "Annotate", "Unannotate", "TransformLayout", "Blockize", "Tensorize", "StorageAlign",
         "SetScope", "Pad", "AddUnitLoop")
KIND_INDEX = {k: i for i, k in enumerate(KINDS)}
N_VALUES = 4          # decision / literal value slots
N_KEY_BUCKETS = 16    # annotation keys (meta_schedule.*, scanweaver.<knob>, pragmas)
N_STR_BUCKETS = 8     # string values (tiling structure, scanweaver.schedule names, scopes)
_OFF_VALUES = len(KINDS) + 1
_OFF_LOOPS = _OFF_VALUES + N_VALUES + 1
_OFF_KEY = _OFF_LOOPS + 4
_OFF_STR = _OFF_KEY + N_KEY_BUCKETS
ACTION_DIM = _OFF_STR + N_STR_BUCKETS + 1
MAX_ACTIONS = 96      # traces are cut here (MetaSchedule CPU traces have ~15-60 search insts)

_RV = re.compile(r"^[blv]\d+$")


def _lg(x):
    return math.log2(1.0 + abs(float(x))) / 10.0


def _bucket(text, n):
    return zlib.crc32(str(text).encode()) % n


def _is_rv(x):
    return isinstance(x, str) and _RV.match(x) is not None


def _flat(xs):
    for x in xs:
        if isinstance(x, list):
            yield from _flat(x)
        else:
            yield x


class _Replay:
    """Symbolic values of random variables: loop extents for ``l*``, sampled ints for ``v*``."""

    def __init__(self, loop_extents):
        self.loop_extents = loop_extents   # {block name: [extents]} of the initial program
        self.block_name, self.loop, self.value = {}, {}, {}

    def step(self, kind, inputs, attrs, outputs, decision):
        """Update the symbol table; return (values, touched loop extents, key, string value)."""
        values, key, text = [], None, None
        if kind == "GetSBlock":
            self.block_name[outputs[0]] = attrs[0]
        elif kind == "GetLoops":
            extents = self.loop_extents.get(self.block_name.get(inputs[0]), [])
            for i, out in enumerate(outputs):
                self.loop[out] = extents[i] if i < len(extents) and len(extents) == len(outputs) else 0
        elif kind in ("SamplePerfectTile", "SamplePartitionedTile") and decision is not None:
            values = [int(v) for v in decision]
            self.value.update(zip(outputs, values))
        elif kind == "SampleCategorical" and decision is not None:
            idx = int(decision)
            chosen = attrs[0][idx] if idx < len(attrs[0]) else idx
            values = [chosen, idx / max(1, len(attrs[0]) - 1)]
            if outputs:
                self.value[outputs[0]] = chosen
        elif kind == "SampleComputeLocation" and decision is not None:
            values = [int(decision) + 1]
        elif kind == "Split":
            factors = [self.value.get(x, x) if not isinstance(x, int) else x for x in inputs[1:]]
            extent = self.loop.get(inputs[0], 0)
            known = [f for f in factors if isinstance(f, int)]
            for out, f in zip(outputs, factors):
                if isinstance(f, int):
                    self.loop[out] = f
                else:   # the one inferred factor
                    self.loop[out] = extent // max(1, math.prod(known)) if extent else 0
            values = [f for f in factors if isinstance(f, int)]
        elif kind == "Fuse":
            if outputs:
                self.loop[outputs[0]] = math.prod(self.loop.get(x, 0) for x in inputs if _is_rv(x))
        elif kind == "Annotate":
            key = attrs[0] if attrs else None
            val = inputs[1] if len(inputs) > 1 else None
            if _is_rv(val):
                val = self.value.get(val, 0)
            if isinstance(val, str):
                text = val.strip('"')
            elif isinstance(val, (int, float)):
                values = [val]
        elif kind == "Unannotate":
            key = attrs[0] if attrs else None
        elif kind in ("CacheRead", "CacheWrite", "SetScope"):
            text = next((a for a in attrs if isinstance(a, str)), None)
            values = [a for a in attrs if isinstance(a, int)]
        touched = [self.loop.get(x, 0) for x in _flat(inputs) if isinstance(x, str) and x.startswith("l")]
        return values, touched, key, text


def encode_actions(trace_json, loop_extents):
    """``float32[n, ACTION_DIM]`` for the search part of a trace (see module docstring).

    ``trace_json``: plain trace JSON (``trace_json.trace_to_json`` or a database record);
    ``loop_extents``: ``state_encoder.block_loop_extents`` of the task's initial program."""
    insts, decisions = search_part(trace_json)
    insts = insts[:MAX_ACTIONS]
    rows = np.zeros((len(insts), ACTION_DIM), dtype=np.float32)
    replay = _Replay(loop_extents)
    for i, (kind, inputs, attrs, outputs) in enumerate(insts):
        values, touched, key, text = replay.step(kind, inputs, attrs, outputs, decisions.get(i))
        row = rows[i]
        row[KIND_INDEX.get(kind, len(KINDS))] = 1.0
        for j, v in enumerate(values[:N_VALUES]):
            row[_OFF_VALUES + j] = _lg(v)
        row[_OFF_VALUES + N_VALUES] = len(values) / N_VALUES
        if touched:
            row[_OFF_LOOPS] = _lg(touched[0])
            row[_OFF_LOOPS + 1] = _lg(touched[-1])
            row[_OFF_LOOPS + 2] = _lg(math.prod(t for t in touched if t > 0) if any(touched) else 0)
            row[_OFF_LOOPS + 3] = len(touched) / 8.0
        if key is not None:
            row[_OFF_KEY + _bucket(key, N_KEY_BUCKETS)] = 1.0
        if text is not None:
            row[_OFF_STR + _bucket(text, N_STR_BUCKETS)] = 1.0
        row[-1] = i / MAX_ACTIONS
    return rows


def trace_signature(trace_json):
    """A string identifying a trace's search part (for caching features of repeated candidates)."""
    insts, decisions = search_part(trace_json)
    return json.dumps([insts, sorted(decisions.items())], separators=(",", ":"))
