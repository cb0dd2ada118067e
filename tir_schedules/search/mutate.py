"""``MutateKnob``: the evolutionary search's mutation for scan traces.

MetaSchedule's built-in mutators each own one kind of decision (tile sizes, unroll or
parallel annotations, compute locations, thread bindings) and find nothing to change in a
scan trace, whose decisions are plain ``sample_categorical``s feeding ``scanweaver.*``
annotations.  This one picks one of those samples at random and moves it to another of its
candidates, so a mutant differs from its parent in exactly one knob.
"""
import random

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.mutator import PyMutator

_SAMPLE = "SampleCategorical"


@derived_object
class MutateKnob(PyMutator):
    """Re-sample one ``SampleCategorical`` decision of a trace to a different candidate."""

    def _initialize_with_tune_context(self, context):
        pass

    def apply(self, trace, seed):
        rng = random.Random(int(seed))
        samples = [inst for inst in trace.insts
                   if inst.kind.name == _SAMPLE and len(inst.attrs[0]) > 1]
        if not samples:
            return None
        inst = rng.choice(samples)
        current = int(trace.get_decision(inst))
        choices = [i for i in range(len(inst.attrs[0])) if i != current]
        return trace.with_decision(inst, rng.choice(choices), remove_postproc=True)

    def clone(self):
        return MutateKnob()
