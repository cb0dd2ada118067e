"""Matrix-state scans ``S_t = decay_t * S_{t-1} + k_t v_t^T``: per step on a chain
(``matrix.py``, with the readout stacks of ``stacks.py``), in whole-sequence form
(``matrix_lifted.py``), readout einsums split to show a matrix state (``einsum_split.py``),
and the scan's layout and emission (``matrix_layout.py``)."""
