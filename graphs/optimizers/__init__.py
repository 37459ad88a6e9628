"""torch.optim's SGD, Adam, AdamW, RMSprop, Adagrad and NAdam, clip_grad_norm_ and clip_grad_value_ as ONNX nodes.

One module per optimizer (``sgd``, ``adam`` with AdamW, ``rmsprop``, ``adagrad``, ``nadam``), each class
registered in one table (``OPTIMIZERS``, see ``base``) that ``optimizer_from_torch``, the
Trainer's checkpoints and the command line read; ``clip`` holds ``clip_grad_norm`` and
``clip_grad_value``, ``arithmetic`` torch's CPU arithmetic in standard ops. A new optimizer is one
module with one registered class (see ``register_optimizer``), imported here, plus its test rows.

Clipping, RMSprop, Adagrad and NAdam are standard ops. SGD, Adam and AdamW emit one ``ortlstm::SGDUpdate`` or
``ortlstm::AdamUpdate`` node per parameter by default (the ortlstm library's kernels: one pass
over the parameter, threaded, true fused multiply-adds; docs/ops.md#sgdupdate, #adamupdate), or
the same update in standard ops with ``implementation="onnx"`` (up to about 20 nodes per
parameter, float64 temporaries), which runs without the library. Both follow the description
below; ``Optimizer.emission`` is where the choice is made.

Each optimizer is a frozen dataclass with torch's hyperparameter names and defaults. The
learning rate and the step number are graph inputs, so a schedule changes them per run without
a rebuild:

- ``lr``: a 0-D (or one-element) float tensor, the learning rate of this update. It is cast to
  float64 inside, where the scalar arithmetic happens (see below); feeding it as float64 gives
  bit-for-bit torch's Python-float lr, float32 works too (the step size then differs from torch's
  by at most one float32 rounding).
- ``step``: a 0-D (or one-element) tensor, the 1-based number of this update (torch's
  ``state["step"]`` after its increment), int64 recommended: exact at any count (a float32
  counter stops counting at 2**24) and compared exactly for SGD's first-step momentum buffer.
  Any numeric type is accepted; it is cast to float64.

The per-update scalars (bias corrections, step size, decoupled decay factor) are computed in
float64, as torch computes them in Python floats, and rounded once to the parameter's type where
torch hands them to a tensor op; the tensor arithmetic then follows torch's single-tensor
(``foreach=False``) code path operation by operation, including where torch's CPU kernels fuse a
multiply-add (``add(alpha=)``, ``lerp``, ``addcmul``): with ``fused_multiply_add=True`` (the
default) those are computed in float64 and rounded once, which for float32 parameters is the fused
result. Measured: 13 of 23 recorded float32 trajectories bit-identical to torch 2.13 over 10 steps,
the rest within 1 ulp per step (clip_grad_norm's float32 sum order; ties in addcdiv).

The update ``exp_avg / (sqrt(v) / bc2 + eps)`` must reach the runtime as written: run no generic
algebraic optimizer over these nodes (one rewrote ``x / (sqrt(v) + eps)`` to ``x / sqrt(v)``).

Per-parameter state uses torch's ``state_dict`` names (``momentum_buffer``, ``exp_avg``,
``exp_avg_sq``, ``max_exp_avg_sq``, ``square_avg``, ``sum``), initialized as torch initializes
them. torch's per-parameter ``step`` is the ``step`` input. Protos only: nothing here runs a model.
"""

from __future__ import annotations

from ortlstm.graphs.optimizers.adagrad import Adagrad
from ortlstm.graphs.optimizers.adam import Adam, AdamW
from ortlstm.graphs.optimizers.base import (
    IMPLEMENTATIONS,
    OPTIMIZERS,
    Optimizer,
    OptimizerStep,
    ParamGroup,
    add_optimizer_step,
    as_param_groups,
    optimizer_from_torch,
    register_optimizer,
    resolve_groups,
)
from ortlstm.graphs.optimizers.clip import ClipGradNorm, ClipGradValue, clip_grad_norm, clip_grad_value
from ortlstm.graphs.optimizers.nadam import NAdam
from ortlstm.graphs.optimizers.rmsprop import RMSprop
from ortlstm.graphs.optimizers.sgd import SGD

__all__ = [
    "IMPLEMENTATIONS",
    "OPTIMIZERS",
    "SGD",
    "Adagrad",
    "Adam",
    "AdamW",
    "ClipGradNorm",
    "ClipGradValue",
    "NAdam",
    "Optimizer",
    "OptimizerStep",
    "ParamGroup",
    "RMSprop",
    "add_optimizer_step",
    "as_param_groups",
    "clip_grad_norm",
    "clip_grad_value",
    "optimizer_from_torch",
    "register_optimizer",
    "resolve_groups",
]
