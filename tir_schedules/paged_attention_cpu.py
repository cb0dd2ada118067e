"""CPU attention kernels for TVM's paged KV cache (``TIRPagedKVCache``), in the signatures of
its own CPU kernels: the causal prefill over the new tokens ("ragged") and the decode over the
pages.  TVM's CPU ones run on one core, one query row, head and key at a time, scalar: at a
4096-token prompt they took 7.6x transformers' prefill time.

Here (sequence, KV head, query tile) tasks run in parallel, the query heads of a KV head's
group side by side (a key or value row is read once for all of them), and keys in blocks:
scores as Q K^T in 2 x 32 register blocks against keys staged transposed (vector lanes along
the keys; once per sequence in the prefill, per page in the decode), one online-softmax
rescale per block, P V accumulated along D in 2 x 32 register blocks.  ``lse`` (log2 units) as TVM's
kernels give it, for the cache's merges.  No rotary embedding (the cache is made with
``RopeMode.NONE``: the model applies its own); a call asking for it fails its assert.

``window`` (sliding-window attention, as transformers masks it): a query at position p sees
the keys at p - window + 1 .. p.  The cache keeps every key (no eviction: the caller makes
it without TVM's sliding-window support); the kernels skip the blocks before the window and
mask the rest.  0: no window.
"""
from tvm import tirx
from tvm.script import tirx as T

from .fast_math import LOG2E, exp2

F32 = "float32"
NEG = -3.0e38            # the running max before any key: exp2(NEG - m) is 0 for any real m
EMPTY_LSE = -5.0e4       # TVM's lse of a row with no keys
CACHE_KERNELS = ("tir_attention_", "kv_cache_")
LANES = 8                # partial maxima and sums: one AVX2 vector
NO_WINDOW = 1 << 30      # a window no sequence reaches (what ``window=0`` means)


@T.macro(hygienic=False)
def _softmax_block(s, o, m, total, part, r, low, lim, width, D):
    """Row ``r``'s scores ``s[r, :width]`` (log2 units, those in ``low .. lim - 1`` real) as
    probabilities against the new running max ``m[r]``, ``total[r]`` and ``o[r]`` rescaled to
    it: the online softmax over one key block, maxima and sums in vector lanes."""
    for c in T.vectorized(width):
        s[r, c] = T.if_then_else(c < lim and c >= low, s[r, c], T.float32(NEG))
    for i in T.vectorized(LANES):
        part[i] = m[r]
    for cb in T.serial(width // LANES):
        for i in T.vectorized(LANES):
            part[i] = T.max(part[i], s[r, cb * LANES + i])
    for i in T.serial(LANES - 1):
        part[0] = T.max(part[0], part[i + 1])
    for c in T.vectorized(width):
        s[r, c] = T.if_then_else(c < lim and c >= low, exp2(s[r, c] - part[0]), T.float32(0))
    total[r] = total[r] * exp2(m[r] - part[0])
    for d in T.vectorized(D):
        o[r, d] = o[r, d] * exp2(m[r] - part[0])
    m[r] = part[0]
    for i in T.vectorized(LANES):
        part[i] = T.float32(0)
    for cb in T.serial(width // LANES):
        for i in T.vectorized(LANES):
            part[i] = part[i] + s[r, cb * LANES + i]
    for i in T.serial(LANES):
        total[r] = total[r] + part[i]


@T.macro(hygienic=False)
def _start_rows(m, total, o, rows, D):
    """The online softmax before any key: no max yet, nothing summed."""
    for r in T.serial(rows):
        m[r] = T.float32(NEG)
        total[r] = T.float32(0)
        for d in T.vectorized(D):
            o[r, d] = T.float32(0)


@T.macro(hygienic=False)
def _finish_row(o, m, total, r, output, lse, token, head, dtype, D):
    """Row ``r`` normalized into ``output[token, head]`` and its ``lse`` (a row that saw no
    key: zeros and TVM's ``EMPTY_LSE``)."""
    for d in T.vectorized(D):
        output[token, head, d] = T.Cast(
            dtype, T.if_then_else(total[r] > T.float32(0), o[r, d] / total[r], T.float32(0)))
    lse[token, head] = T.if_then_else(total[r] > T.float32(0), m[r] + T.log2(total[r]), T.float32(EMPTY_LSE))


def ragged_prefill(kv_heads, q_heads, head_dim, dtype, q_tile=16, k_tile=64, window=0):
    """``batch_prefill_ragged_kv``: attention of each sequence's new queries on its new keys
    and values (causal: query i of n sees keys up to kv_len - n + i, and with a ``window``
    none before kv_len - n + i - window + 1)."""
    G, D, TQ, TK, W = q_heads // kv_heads, head_dim, q_tile, k_tile, window or NO_WINDOW
    DB = 32 if D % 32 == 0 else D   # value columns of a register block
    R = -(-TQ * G // 2) * 2  # rows of a task: TQ queries x G heads (even: padded with zero queries)

    @T.prim_func(s_tir=True)
    def batch_prefill_ragged_kv(var_q: T.handle, var_q_indptr: T.handle, var_k: T.handle, var_v: T.handle,
                                var_kv_indptr: T.handle, var_q_rope_position: T.handle,
                                var_k_rope_pos_offset: T.handle, var_output: T.handle, var_lse: T.handle,
                                causal: T.int32, rotary_mode: T.int32, rope_scale: T.float32,
                                rope_theta: T.float32, sm_scale: T.float32):
        T.func_attr({"tirx.is_scheduled": True, "tirx.noalias": True})
        batch_size, qo_len, kv_len = T.int32(), T.int32(), T.int32()
        q_off, kv_off, qr_off, kr_off = T.int32(), T.int32(), T.int32(), T.int32()
        q = T.match_buffer(var_q, (qo_len, q_heads, D), dtype)
        q_indptr = T.match_buffer(var_q_indptr, (batch_size + 1,), "int32", elem_offset=q_off)
        k = T.match_buffer(var_k, (kv_len, kv_heads, D), dtype)
        v = T.match_buffer(var_v, (kv_len, kv_heads, D), dtype)
        kv_indptr = T.match_buffer(var_kv_indptr, (batch_size + 1,), "int32", elem_offset=kv_off)
        T.match_buffer(var_q_rope_position, (qo_len,), "int32", elem_offset=qr_off)
        T.match_buffer(var_k_rope_pos_offset, (batch_size,), "int32", elem_offset=kr_off)
        output = T.match_buffer(var_output, (qo_len, q_heads, D), dtype)
        lse = T.match_buffer(var_lse, (qo_len, q_heads), F32)
        assert rotary_mode == 0, "ScanWeaver's paged attention kernels apply no rotary embedding"
        # a sequence's keys transposed once, for all its query tiles (zeros past its end)
        k_t = T.alloc_buffer((kv_heads, D, kv_len + TK), F32)

        for b in T.serial(batch_size):
            q0: T.let[T.int32] = q_indptr[b]
            n_q: T.let[T.int32] = q_indptr[b + 1] - q0
            k0: T.let[T.int32] = kv_indptr[b]
            n_k: T.let[T.int32] = kv_indptr[b + 1] - k0
            tiles: T.let[T.int32] = (n_q + TQ - 1) // TQ
            for hd in T.parallel(kv_heads * D):
                for c in T.serial(n_k + TK):
                    k_t[hd // D, hd % D, c] = T.if_then_else(
                        c < n_k, T.Cast(F32, k[k0 + T.min(c, n_k - 1), hd // D, hd % D]), T.float32(0))
            # tiles paired first-with-last: contiguous halves of the tasks get equal causal work
            for task in T.parallel(kv_heads * tiles):
                with T.sblock("tile"):
                    T.reads()      # opaque: regions read through the lets below are not inferred
                    T.writes()
                    qs = T.sblock_alloc_buffer((R, D), F32, scope="local")
                    o = T.sblock_alloc_buffer((R, D), F32, scope="local")
                    s = T.sblock_alloc_buffer((R, TK), F32, scope="local")
                    m = T.sblock_alloc_buffer((R,), F32, scope="local")
                    total = T.sblock_alloc_buffer((R,), F32, scope="local")
                    part = T.sblock_alloc_buffer((LANES,), F32, scope="local")
                    h: T.let[T.int32] = task % kv_heads
                    pair: T.let[T.int32] = task // kv_heads
                    t: T.let[T.int32] = T.if_then_else(pair % 2 == 0, pair // 2, tiles - 1 - pair // 2)
                    i0: T.let[T.int32] = t * TQ
                    rows: T.let[T.int32] = T.min(TQ, n_q - i0) * G
                    # keys the tile's last query sees
                    seen: T.let[T.int32] = T.if_then_else(causal > 0, T.min(n_k, n_k - n_q + i0 + rows // G), n_k)
                    for r, d in T.grid(R, D):
                        qs[r, d] = T.if_then_else(r < rows, T.Cast(F32, q[q0 + i0 + T.min(r, rows - 1) // G, h * G + r % G, d]),
                                                  T.float32(0)) * sm_scale * T.float32(LOG2E)
                    _start_rows(m, total, o, R, D)
                    # the first key block the tile's first query sees
                    skip: T.let[T.int32] = T.if_then_else(causal > 0, T.max(0, n_k - n_q + i0 - W + 1) // TK, 0)
                    for j in T.serial(skip, (seen + TK - 1) // TK):
                        j0: T.let[T.int32] = j * TK
                        cols: T.let[T.int32] = T.min(TK, seen - j0)
                        # register blocks of 2 rows x 32 keys (accumulators held across d)
                        for rb, cb in T.grid(R // 2, TK // 32):
                            with T.sblock("scores"):
                                acc = T.sblock_alloc_buffer((2, 32), F32, scope="local")
                                for rr in T.unroll(2):
                                    for c in T.vectorized(32):
                                        acc[rr, c] = T.float32(0)
                                for d in T.serial(D):
                                    for rr in T.unroll(2):
                                        for c in T.vectorized(32):
                                            acc[rr, c] = acc[rr, c] + qs[rb * 2 + rr, d] * k_t[h, d, j0 + cb * 32 + c]
                                for rr in T.unroll(2):
                                    for c in T.vectorized(32):
                                        s[rb * 2 + rr, cb * 32 + c] = acc[rr, c]
                        for r in T.serial(rows):
                            # keys this query sees, counted from j0
                            lim: T.let[T.int32] = T.min(cols, T.if_then_else(causal > 0, n_k - n_q + i0 + r // G + 1, n_k) - j0)
                            low: T.let[T.int32] = T.if_then_else(causal > 0, n_k - n_q + i0 + r // G - W + 1 - j0, 0)
                            _softmax_block(s, o, m, total, part, r, low, lim, TK, D)
                        for rb, db in T.grid(R // 2, D // DB):
                            with T.sblock("values"):
                                acc = T.sblock_alloc_buffer((2, DB), F32, scope="local")
                                for rr in T.unroll(2):
                                    for d in T.vectorized(DB):
                                        acc[rr, d] = o[rb * 2 + rr, db * DB + d]
                                for c in T.serial(cols):
                                    for rr in T.unroll(2):
                                        for d in T.vectorized(DB):
                                            acc[rr, d] = acc[rr, d] + s[rb * 2 + rr, c] * T.Cast(F32, v[k0 + j0 + c, h, db * DB + d])
                                for rr in T.unroll(2):
                                    for d in T.vectorized(DB):
                                        o[rb * 2 + rr, db * DB + d] = acc[rr, d]
                    for r in T.serial(rows):
                        _finish_row(o, m, total, r, output, lse, q0 + i0 + r // G, h * G + r % G, dtype, D)

    return batch_prefill_ragged_kv


def paged_decode(kv_heads, q_heads, head_dim, dtype, page_size=16, window=0):
    """``batch_decode_paged_kv_cpu``: one query per sequence (the last token of its pages) on
    all its pages, or with a ``window`` on the last ``window`` keys; a page is a key block.
    (The pages are the sequence's keys in order: the cache evicts none.)"""
    G, D, P, W = q_heads // kv_heads, head_dim, page_size, window or NO_WINDOW

    @T.prim_func(s_tir=True)
    def batch_decode_paged_kv(Q_handle: T.handle, pages_handle: T.handle, page_table_indptr_handle: T.handle,
                              page_table_values_handle: T.handle, var_length_info: T.handle,
                              k_rope_pos_offset_handle: T.handle, q_rope_position_handle: T.handle,
                              output_handle: T.handle, lse_handle: T.handle, rotary_mode: T.int32,
                              rope_scale: T.float32, rope_theta: T.float32, sm_scale: T.float32):
        T.func_attr({"tirx.is_scheduled": True, "tirx.noalias": True})
        B, nnz_pages, max_num_pages = T.int32(), T.int32(), T.int32()
        ind_off, val_off, kr_off, qr_off, len_off = T.int32(), T.int32(), T.int32(), T.int32(), T.int32()
        Q = T.match_buffer(Q_handle, (B, q_heads, D), dtype)
        pages = T.match_buffer(pages_handle, (max_num_pages, 2, kv_heads, P, D), dtype)
        page_indptr = T.match_buffer(page_table_indptr_handle, (B + 1,), "int32", elem_offset=ind_off)
        page_values = T.match_buffer(page_table_values_handle, (nnz_pages,), "int32", elem_offset=val_off)
        last_page_len = T.match_buffer(var_length_info, (B,), "int32", elem_offset=len_off)
        T.match_buffer(k_rope_pos_offset_handle, (B,), "int32", elem_offset=kr_off)
        T.match_buffer(q_rope_position_handle, (B,), "int32", elem_offset=qr_off)
        output = T.match_buffer(output_handle, (B, q_heads, D), dtype)
        lse = T.match_buffer(lse_handle, (B, q_heads), F32)
        assert rotary_mode == 0, "ScanWeaver's paged attention kernels apply no rotary embedding"

        for task in T.parallel(B * kv_heads):
            with T.sblock("sequence_head"):
                T.reads()
                T.writes()
                qs = T.sblock_alloc_buffer((G, D), F32, scope="local")
                o = T.sblock_alloc_buffer((G, D), F32, scope="local")
                s = T.sblock_alloc_buffer((G, P), F32, scope="local")
                kt = T.sblock_alloc_buffer((D, P), F32, scope="local")
                m = T.sblock_alloc_buffer((G,), F32, scope="local")
                total = T.sblock_alloc_buffer((G,), F32, scope="local")
                part = T.sblock_alloc_buffer((LANES,), F32, scope="local")
                b: T.let[T.int32] = task // kv_heads
                h: T.let[T.int32] = task % kv_heads
                first: T.let[T.int32] = page_indptr[b]
                n_pages: T.let[T.int32] = page_indptr[b + 1] - first
                # the first key the query sees
                lo: T.let[T.int32] = T.max(0, (n_pages - 1) * P + last_page_len[b] - W)
                for g, d in T.grid(G, D):
                    qs[g, d] = T.Cast(F32, Q[b, h * G + g, d]) * sm_scale * T.float32(LOG2E)
                _start_rows(m, total, o, G, D)
                for p in T.serial(lo // P, n_pages):
                    page: T.let[T.int32] = page_values[first + p]
                    cols: T.let[T.int32] = T.if_then_else(p == n_pages - 1, last_page_len[b], P)
                    for c, d in T.grid(P, D):
                        kt[d, c] = T.Cast(F32, pages[page, 0, h, c, d])
                    for g in T.serial(G):
                        for c in T.vectorized(P):
                            s[g, c] = T.float32(0)
                        for d in T.serial(D):
                            for c in T.vectorized(P):
                                s[g, c] = s[g, c] + qs[g, d] * kt[d, c]
                        _softmax_block(s, o, m, total, part, g, lo - p * P, cols, P, D)
                        for c in T.serial(cols):
                            for d in T.vectorized(D):
                                o[g, d] = o[g, d] + s[g, c] * T.Cast(F32, pages[page, 1, h, c, d])
                for g in T.serial(G):
                    _finish_row(o, m, total, g, output, lse, b, h * G + g, dtype, D)

    return batch_decode_paged_kv


def replace_cache_kernels(mod, kv_heads, q_heads, head_dim, dtype, page_size=16, window=0):
    """``mod`` (holding ``TIRPagedKVCache``'s CPU kernels) with the ragged prefill and the
    decode kernels above in their places, under the same names."""
    kernels = {"tir_attention_prefill_ragged_cpu": ragged_prefill(kv_heads, q_heads, head_dim, dtype, window=window),
               "tir_attention_decode_cpu": paged_decode(kv_heads, q_heads, head_dim, dtype, page_size, window)}
    for gv, func in list(mod.functions_items()):
        if gv.name_hint in kernels:
            mod[gv] = kernels[gv.name_hint].with_attr("global_symbol", gv.name_hint)
        elif gv.name_hint.startswith(CACHE_KERNELS) and isinstance(func, tirx.PrimFunc):
            mod[gv] = func.with_attr("tirx.noalias", True)
    return mod
