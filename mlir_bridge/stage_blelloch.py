"""Stage 4: the associative scan as Blelloch tiles: ``blelloch_up`` (upsweep to tile totals),
``blelloch_down`` (exclusive prefixes), ``tile_carry`` (totals folded from h0, sequential over
tiles) and ``apply_tile_prefix``.  Tile size and thread count are fixed here, for the kernel."""
from dataclasses import dataclass

from . import emit
from .emit import tensor_type
from .kernel_common import threads_for
from .stage_assoc import emit_stage


@dataclass(frozen=True)
class BlellochStage:
    spec: object
    form: str
    layout: object
    threads: int
    tile: int
    text: str


def lower(assoc_stage, threads=None):
    """AssocStage -> BlellochStage (text verified); ``tile = 2*threads`` pairs per tile."""
    layout = assoc_stage.layout
    threads = threads or threads_for(layout.length)
    tile = 2 * threads
    ntiles = None if layout.length is None else -(-layout.length // tile)
    levels = tile.bit_length() - 1

    def scan_ops(b, a, x, h0, states_t, last_t, elem, maps):
        tree_t = tensor_type((layout.lanes, ntiles, tile), "f32")
        tot_t = tensor_type((layout.lanes, ntiles), "f32")
        common = {"combine": emit.attr_sym("scanweaver_combine"), "tile": emit.attr_int(tile),
                  "threads": emit.attr_int(threads), "levels": emit.attr_int(levels)}
        ta, tu, tot_a, tot_u = b.op("scanweaver.blelloch_up", [a, x], [tree_t, tree_t, tot_t, tot_t], attrs={
            **common, "reverse": emit.attr_bool(layout.reverse), "a_map": maps[0], "b_map": maps[1]})
        ea, eu = b.op("scanweaver.blelloch_down", [ta, tu], [tree_t, tree_t], attrs=common)
        carry, last = b.op("scanweaver.tile_carry", [tot_a, tot_u] + ([h0] if h0 is not None else []),
                           [tot_t, last_t])
        states = b.op("scanweaver.apply_tile_prefix", [ea, eu, a, x, carry], [states_t], attrs={
            "combine": emit.attr_sym("scanweaver_combine"), "states_map": maps[1], "element": elem})
        return states, last
    text = emit_stage(assoc_stage, "blelloch stage", scan_ops)
    return BlellochStage(assoc_stage.spec, assoc_stage.form, layout, threads, tile, text)
