"""RNNTraining + RNNGrad against nn.RNN, tanh and relu: ``bench_lstm.py --cells rnn,rnn_relu``.

Kept as a short name: the RNN rows are bench_lstm.py's now (issue 32 item 7), at its configs, in its
interleaved rounds and report, with the GEMM limit and the target (RNN/torch <= 0.9). There is no
com.microsoft RNN training op (reported n/a). Every option of bench_lstm.py applies, and the old ones still
work (bench_cells.short_name_argv); a ``--cells`` given here wins. Run it with the training environment to have torch:

    .venvs/train/bin/python benchmarks/bench_rnn.py --threads 1 --configs S,M

This script only measures; it never builds or changes the kernels.
"""

from __future__ import annotations

import sys

import bench_lstm
from bench_cells import short_name_argv

if __name__ == "__main__":
    if sys.argv[1:3] != ["--cells", "rnn,rnn_relu"]:  # not again when bench_lstm re-executes this script
        sys.argv[1:] = short_name_argv(sys.argv[1:], "rnn,rnn_relu")
    bench_lstm.main()
