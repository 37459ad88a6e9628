// Dimensions of one LSTM call and the index arithmetic of every tensor layout. The adapter fills
// LstmDims after validating all shapes (ort/lstm_validation.cc, which also bounds every product of
// dims below, so none of them can overflow int64); the math trusts it. This file holds the project's one
// memory-layout diagram; other files point here.
//
//   T = seq_length, N = batch_size, I = input_size, H = hidden_size, D = num_directions
//
//   tensor            layout=0                    layout=1                  row (t, b) / (d, b)
//   X                 [T, N, I]                   [N, T, I]                 XRow(t, b)
//   HAll, CAll        [T, D, N, H]                [N, T, D, H]              SeqRow(t, d, b)
//   IOFC              [T, D, N, 4H]  (i o f c)    [N, T, D, 4H]             SeqRow(t, d, b)
//   initial_h/c, Ht   [D, N, H]                   [N, D, H]                 StateRow(d, b)
//   W [D, 4H, I], R [D, 4H, H] (rows i o f c), B [D, 8H] (Wb iofc, Rb iofc), P [D, 3H] (i o f)
//
//   Internal scratch (per direction) follows X's row order, so that X, the gates and their
//   gradients share one row index and whole-sequence GEMMs need no copies:
//
//     gates / grad_gates  [T*N, 4H]   row XRow(t, b)
//     hidden_prev         [T*N, H]    row XRow(t, b)  (H_{t-1} as seen by step t)
//
//   Within one step t, the N rows of an X-ordered matrix are BatchStride() rows apart:
//   contiguous for layout=0, seq_length rows apart for layout=1 (a GEMM leading dimension).
#pragma once

#include <cstdint>

namespace ortlstm {

struct LstmDims {
  int64_t seq_length = 0;
  int64_t batch_size = 0;
  int64_t input_size = 0;
  int64_t hidden_size = 0;
  int64_t num_directions = 1;
  int64_t layout = 0;
  int64_t gates = 4;  // gates of the cell: 4 for the LSTM (i o f c), 3 for the GRU (z r h)

  int64_t GateWidth() const { return gates * hidden_size; }

  // Row of X (and of every X-ordered scratch matrix) for time t, batch entry b.
  int64_t XRow(int64_t t, int64_t b) const { return layout == 0 ? t * batch_size + b : b * seq_length + t; }
  // Distance in rows between batch entries b and b+1 of one step in an X-ordered matrix.
  int64_t BatchStride() const { return layout == 0 ? 1 : seq_length; }
  // Row of HAll / CAll / IOFC for time t, direction d, batch entry b.
  int64_t SeqRow(int64_t t, int64_t d, int64_t b) const {
    return layout == 0 ? (t * num_directions + d) * batch_size + b : (b * seq_length + t) * num_directions + d;
  }
  // Row of initial_h / initial_c / Ht / Ct for direction d, batch entry b.
  int64_t StateRow(int64_t d, int64_t b) const {
    return layout == 0 ? d * batch_size + b : b * num_directions + d;
  }
  int64_t Rows() const { return seq_length * batch_size; }
};

}  // namespace ortlstm
