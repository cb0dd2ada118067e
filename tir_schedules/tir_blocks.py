"""Reading a PrimFunc's blocks: each with the extents of its enclosing loops (what the world
model's state encoder counts), and whether a kernel only moves data (what ``sw.tune`` leaves to
the rules)."""
from tvm import s_tir, tirx


def const_int(expr, default=1):
    """``expr`` as an int where it is a constant, else ``default`` (a symbolic extent)."""
    return int(expr.value) if isinstance(expr, tirx.IntImm) else int(expr) if isinstance(expr, int) else default


def blocks_with_loops(func):
    """``[(block, [enclosing loop extents]), ...]`` for every non-root block, in program order."""
    out = []

    def walk(node, loops):
        if isinstance(node, tirx.For):
            walk(node.body, loops + [const_int(node.extent)])
        elif isinstance(node, s_tir.SBlockRealize):
            block = node.block
            if block.name_hint != "root":
                out.append((block, loops))
            walk(block.body, loops)
        elif isinstance(node, tirx.SeqStmt):
            for stmt in node.seq:
                walk(stmt, loops)
        elif isinstance(node, tirx.IfThenElse):
            walk(node.then_case, loops)
            if node.else_case is not None:
                walk(node.else_case, loops)
        elif hasattr(node, "body") and node.body is not None:
            walk(node.body, loops)

    walk(func.body, [])
    return out


def only_moves_data(func):
    """True for a reshape / transpose / split / broadcast kernel: every block stores a load of
    another buffer, with no reduction."""
    for block, _ in blocks_with_loops(func):
        if any(iv.iter_type != tirx.IterVar.DataPar for iv in block.iter_vars):
            return False
        if not (isinstance(block.body, tirx.BufferStore)
                and type(block.body.value).__name__ in ("BufferLoad", "TensorLoad")):
            return False
    return True
