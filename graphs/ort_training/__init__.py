"""The onnxruntime-training 1.19.2 path's graphs: its artifacts and the LSTMGrad/GRUGrad/RNNGrad registration.

- ``gradient``: registers the recurrent ops' gradients (LSTMGrad, GRUGrad, RNNGrad, wired from
  ``ops/schema.py``) with onnxruntime-training's gradient builder, and imports that runtime with a
  clear message when it is not installed.
- ``artifacts``: ``generate_artifacts`` around onnxruntime-training's generator (what it cannot do
  for LSTMs, repaired), ``open_training`` and ``export_inference_model``.

The only modules of ``ortlstm.graphs`` that import onnxruntime (``onnxruntime.training``, lazily);
``ortlstm.ort_training`` is the run-time half (its checkpoints read into the Trainer).
"""

from __future__ import annotations
