// The scanweaver dialect: the custom stages of the MLIR realization (IRDL, MLIR 22 syntax).
// Operands/results are builtin tensors; combines and step functions are symbol references to
// func.func bodies in the same module (IRDL ops cannot be region terminators).
irdl.dialect @scanweaver {
  // Stage 1: the recurrence as found, its step function @step: h' = f(h, x_t) spelled out.
  irdl.operation @scan {
    %a = irdl.base "!builtin.tensor"
    %b = irdl.base "!builtin.tensor"
    %h0 = irdl.base "!builtin.tensor"
    %states = irdl.base "!builtin.tensor"
    %last = irdl.base "!builtin.tensor"
    %sym = irdl.base "#builtin.symbol_ref"
    %axis = irdl.base "#builtin.integer"
    %reverse = irdl.base "#builtin.integer"
    irdl.operands(a: %a, b: %b, h0: optional %h0)
    irdl.results(states: optional %states, last: optional %last)
    irdl.attributes {"step" = %sym, "axis" = %axis, "reverse" = %reverse}
  }
  irdl.operation @selective_scan {
    %u = irdl.base "!builtin.tensor"
    %delta = irdl.base "!builtin.tensor"
    %A = irdl.base "!builtin.tensor"
    %B = irdl.base "!builtin.tensor"
    %C = irdl.base "!builtin.tensor"
    %D = irdl.base "!builtin.tensor"
    %z = irdl.base "!builtin.tensor"
    %bias = irdl.base "!builtin.tensor"
    %h0 = irdl.base "!builtin.tensor"
    %out = irdl.base "!builtin.tensor"
    %last = irdl.base "!builtin.tensor"
    %sym = irdl.base "#builtin.symbol_ref"
    %softplus = irdl.base "#builtin.integer"
    %groups = irdl.base "#builtin.integer"
    irdl.operands(u: %u, delta: %delta, a: %A, b: %B, c: %C, d: optional %D, z: optional %z,
                  delta_bias: optional %bias, h0: optional %h0)
    irdl.results(out: %out, last_state: optional %last)
    irdl.attributes {"step" = %sym, "delta_softplus" = %softplus, "groups" = %groups}
  }
  // Selective only: per (batch, channel, state) the pair (exp(delta*A), delta*B*u).
  irdl.operation @discretize {
    %tensor1 = irdl.base "!builtin.tensor"
    %tensor2 = irdl.base "!builtin.tensor"
    %tensor3 = irdl.base "!builtin.tensor"
    %tensor4 = irdl.base "!builtin.tensor"
    %tensor5 = irdl.base "!builtin.tensor"
    %tensor6 = irdl.base "!builtin.tensor"
    %tensor7 = irdl.base "!builtin.tensor"
    %int8 = irdl.base "#builtin.integer"
    %int9 = irdl.base "#builtin.integer"
    irdl.operands(u: %tensor1, delta: %tensor2, a: %tensor3, b: %tensor4, delta_bias: optional %tensor5)
    irdl.results(decay: %tensor6, drive: %tensor7)
    irdl.attributes {"softplus" = %int8, "groups" = %int9}
  }
  // Selective only: y = sum_n C*h (+ D*u) (* silu(z)).
  irdl.operation @readout {
    %tensor7 = irdl.base "!builtin.tensor"
    %tensor1 = irdl.base "!builtin.tensor"
    %tensor2 = irdl.base "!builtin.tensor"
    %tensor3 = irdl.base "!builtin.tensor"
    %tensor4 = irdl.base "!builtin.tensor"
    %tensor5 = irdl.base "!builtin.tensor"
    %int8 = irdl.base "#builtin.integer"
    irdl.operands(states: %tensor1, c: %tensor2, u: %tensor3, d: optional %tensor4, z: optional %tensor7)
    irdl.results(out: %tensor5)
    irdl.attributes {"groups" = %int8}
  }
  // Stage 2: normalized h_t = a_t*h_{t-1} + b_t over (lane, t); the maps give each operand's
  // flat offset (broadcast of a explicit as stride 0, L the symbol); f32 accumulation.
  irdl.operation @affine_scan {
    %tensor1 = irdl.base "!builtin.tensor"
    %tensor2 = irdl.base "!builtin.tensor"
    %tensor3 = irdl.base "!builtin.tensor"
    %tensor4 = irdl.base "!builtin.tensor"
    %tensor5 = irdl.base "!builtin.tensor"
    %int6 = irdl.base "#builtin.integer"
    %int7 = irdl.base "#builtin.integer"
    %map8 = irdl.base "#builtin.affine_map"
    %map9 = irdl.base "#builtin.affine_map"
    %ty10 = irdl.base "#builtin.type"
    %ty11 = irdl.base "#builtin.type"
    irdl.operands(a: %tensor1, b: %tensor2, h0: optional %tensor3)
    irdl.results(states: %tensor4, last: %tensor5)
    irdl.attributes {"lanes" = %int6, "reverse" = %int7, "a_map" = %map8, "b_map" = %map9,
                     "element" = %ty10, "accumulate" = %ty11}
  }
  // Stage 3: inclusive prefixes of pairs under combine (associative), identity (1, 0).
  irdl.operation @assoc_scan {
    %tensor1 = irdl.base "!builtin.tensor"
    %tensor2 = irdl.base "!builtin.tensor"
    %tensor3 = irdl.base "!builtin.tensor"
    %tensor4 = irdl.base "!builtin.tensor"
    %sym5 = irdl.base "#builtin.symbol_ref"
    %arr6 = irdl.base "#builtin.array"
    %int7 = irdl.base "#builtin.integer"
    %map8 = irdl.base "#builtin.affine_map"
    %map9 = irdl.base "#builtin.affine_map"
    irdl.operands(a: %tensor1, u: %tensor2)
    irdl.results(prefix_a: %tensor3, prefix_u: %tensor4)
    irdl.attributes {"combine" = %sym5, "identity" = %arr6, "reverse" = %int7, "a_map" = %map8, "b_map" = %map9}
  }
  // h_t = P_t applied to h0 (states, last state).
  irdl.operation @apply_prefix {
    %map1 = irdl.base "#builtin.affine_map"
    %ty2 = irdl.base "#builtin.type"
    %tensor3 = irdl.base "!builtin.tensor"
    %tensor4 = irdl.base "!builtin.tensor"
    %tensor5 = irdl.base "!builtin.tensor"
    %tensor6 = irdl.base "!builtin.tensor"
    %tensor7 = irdl.base "!builtin.tensor"
    irdl.attributes {"states_map" = %map1, "element" = %ty2}
    irdl.operands(prefix_a: %tensor3, prefix_u: %tensor4, h0: optional %tensor5)
    irdl.results(states: %tensor6, last: %tensor7)
  }
  // Stage 4: Blelloch per tile of `tile` pairs with `threads` threads (2 pairs each).
  irdl.operation @blelloch_up {
    %tensor1 = irdl.base "!builtin.tensor"
    %tensor2 = irdl.base "!builtin.tensor"
    %tensor3 = irdl.base "!builtin.tensor"
    %tensor4 = irdl.base "!builtin.tensor"
    %tensor5 = irdl.base "!builtin.tensor"
    %tensor6 = irdl.base "!builtin.tensor"
    %sym7 = irdl.base "#builtin.symbol_ref"
    %int8 = irdl.base "#builtin.integer"
    %int9 = irdl.base "#builtin.integer"
    %int10 = irdl.base "#builtin.integer"
    %int11 = irdl.base "#builtin.integer"
    %map12 = irdl.base "#builtin.affine_map"
    %map13 = irdl.base "#builtin.affine_map"
    irdl.operands(a: %tensor1, u: %tensor2)
    irdl.results(tree_a: %tensor3, tree_u: %tensor4, total_a: %tensor5, total_u: %tensor6)
    irdl.attributes {"combine" = %sym7, "tile" = %int8, "threads" = %int9, "levels" = %int10,
                     "reverse" = %int11, "a_map" = %map12, "b_map" = %map13}
  }
  irdl.operation @blelloch_down {
    %tensor1 = irdl.base "!builtin.tensor"
    %tensor2 = irdl.base "!builtin.tensor"
    %tensor3 = irdl.base "!builtin.tensor"
    %tensor4 = irdl.base "!builtin.tensor"
    %sym5 = irdl.base "#builtin.symbol_ref"
    %int6 = irdl.base "#builtin.integer"
    %int7 = irdl.base "#builtin.integer"
    %int8 = irdl.base "#builtin.integer"
    irdl.operands(tree_a: %tensor1, tree_u: %tensor2)
    irdl.results(exclusive_a: %tensor3, exclusive_u: %tensor4)
    irdl.attributes {"combine" = %sym5, "tile" = %int6, "threads" = %int7, "levels" = %int8}
  }
  // The carry entering each tile: tile totals folded sequentially from h0.
  irdl.operation @tile_carry {
    %tensor1 = irdl.base "!builtin.tensor"
    %tensor2 = irdl.base "!builtin.tensor"
    %tensor3 = irdl.base "!builtin.tensor"
    %tensor4 = irdl.base "!builtin.tensor"
    %tensor5 = irdl.base "!builtin.tensor"
    irdl.operands(total_a: %tensor1, total_u: %tensor2, h0: optional %tensor3)
    irdl.results(carry_in: %tensor4, last: %tensor5)
  }
  // states = (exclusive prefix o own pair) applied to the tile's carry.
  irdl.operation @apply_tile_prefix {
    %tensor1 = irdl.base "!builtin.tensor"
    %tensor2 = irdl.base "!builtin.tensor"
    %tensor3 = irdl.base "!builtin.tensor"
    %tensor4 = irdl.base "!builtin.tensor"
    %tensor5 = irdl.base "!builtin.tensor"
    %tensor6 = irdl.base "!builtin.tensor"
    %sym7 = irdl.base "#builtin.symbol_ref"
    %map8 = irdl.base "#builtin.affine_map"
    %ty9 = irdl.base "#builtin.type"
    irdl.operands(exclusive_a: %tensor1, exclusive_u: %tensor2, a: %tensor3, u: %tensor4, carry_in: %tensor5)
    irdl.results(states: %tensor6)
    irdl.attributes {"combine" = %sym7, "states_map" = %map8, "element" = %ty9}
  }
}
