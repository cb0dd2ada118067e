"""xLSTM's mLSTM: an unrolled loop (``mlstm.py``) and the chunkwise form (``mlstm_chunked.py``)."""
