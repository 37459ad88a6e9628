"""Makes an exported model ready for differentiation: the rewrites before the train step is built.

Real exports arrive with weights in ``Constant`` nodes (spox, paddle2onnx), integer shape
arithmetic that is static once the model's fixed dims are known (torch's dynamo export with
``optimize=False`` computes LSTM weight slices from ``Shape``), ``If`` nodes whose branch is
chosen by an input the user fixes (a sample rate), output shapes declared wrongly, and
standard ``LSTM`` nodes. ``prepare_model`` runs ``pipeline.REWRITES``, each a function of its
own on one ``state.Preparation``, in this order:

- ``convert_old_opset``: an ai.onnx opset older than 15 (CastLike's, which the losses emit) is
  converted to 17 by ``onnx.version_converter`` (the opset-12 recognizers paddle2onnx and torch
  1.9 wrote; an LSTM converts from opset 7 on, onnx has no adapter from LSTM-1), its IR version
  raised to one that opset needs; weights keep their names, so the trained values go back into
  the model as shipped; a domain imported more than once at one version (models chained with
  ``onnx.compose.merge_models``) is imported once first;
- ``dequantize_int8`` (``dequantize``): the int8 patterns onnxruntime.quantization.quantize_dynamic
  writes (com.microsoft ``DynamicQuantizeLSTM``, ``DynamicQuantizeLinear`` + ``MatMulInteger`` /
  ``ConvInteger``) are the float ops they were made from, each int8 weight dequantized into a
  float32 initializer that is always a candidate (ddddocr's default model);
- ``make_dynamic_dims_symbolic``: input dims an exporter declared as -1 or 0 (paddle2onnx's
  batch) are symbolic: only a positive static dim fixes a size;
- ``fix_inputs``: each fixed input is an initializer, each fixed input shape is declared on its
  input;
- ``drop_declared_shapes``: declared output shapes and intermediate ``value_info`` are dropped
  (shape inference redoes them; an exporter's wrong declaration is never trusted for labels or
  losses);
- ``free_export_dims`` (``fixed_dims``): the batch (and an RNN's sequence length) that
  torch.onnx.export fixed by default is symbolic wherever nothing depends on it: the Reshape
  constants, Expands and zero initial states that carry it are made to follow it; a dim some node
  still depends on stays fixed, recorded with that node for the input check's message;
- ``choose_candidates``: the candidates for training by default are what torch trains: with a
  torch export's metadata, the initializers that are torch parameters or were folded from them
  (``export_metadata``), never buffers or an exporter's constants (a zero initial state); without
  it, the float initializers of rank >= 1 (0-D ones are an exporter's literals, an epsilon or a
  zero state to expand);
- what torch's exporters fold away (``torch_folds``): ``untie_merged_parameters`` (equal-valued
  parameters an exporter merged into one tensor get one trained copy each), ``rebuild_folded_parameters``
  (an initializer folded from parameters the graph also trains is recomputed from them, or refused;
  TorchScript's folded transpose of a tied weight too),
  ``read_padding_rows`` (an embedding's ``padding_idx`` from dynamo's metadata; its row gets no
  gradient), ``warn_fused_batchnorms`` (a BatchNorm folded into its Conv is warned about);
- ``fold_constants`` (``folding``): float ``Constant`` tensors are initializers, so they can be
  trained like any other (candidates when of rank >= 1 and not many elements of one value:
  TorchScript's and paddle2onnx's zero initial states); ``If`` nodes whose condition is constant
  are replaced by the chosen branch's nodes, nested ones too (names the branch defines are
  renamed where they would collide); nodes computing from constants only are folded into
  initializers when they read no candidate parameter (so a weight sliced from a parameter stays
  differentiable), and ``Shape``/``Size`` of a value whose shape is static become constants, and
  so do ``Gather(Shape(x), k)`` where dim ``k`` of ``x`` is static and ``Size(Shape(x))`` where
  the rank of ``x`` is known (the rank and dim checks exporters write around squeezes, whatever
  the dynamic dims);
- ``resolve_sequences``: reads of sequences whose structure is static (``SequenceAt`` of a
  ``SplitToSequence`` at a constant position: torch.split / torch.chunk exported with
  ``optimize=False``) are tensor ops (``sequences.resolve_static_sequences``);
- ``drop_dead_values``: nodes and initializers no output needs go (``emit.graph_utils.prune_to_outputs``);
- ``convert_lstms``: ONNX ``LSTM`` nodes are ortlstm ``LSTMTraining`` nodes (``convert``);
- ``convert_grus``: ONNX ``GRU`` nodes are ortlstm ``GRUTraining`` nodes (``convert_gru``);
- ``convert_rnns``: ONNX ``RNN`` nodes are ortlstm ``RNNTraining`` nodes (``convert_rnn``);
- ``drop_pow_exponents``: never a candidate, a value read only as a ``Pow`` exponent;
- ``untie_running_statistics``: a candidate that a ``BatchNormalization`` also reads as its
  running mean or variance gets its own constant copy there (onnxscript's optimizer merges equal
  initializers: a zero bias and a zero running mean become one, and training the bias must not
  move the statistic);
- ``declare_output_shapes``: each output declares the shape inference computes, so the model
  passes ``onnx.checker``.

An ``If`` left in the main graph gets advice on what decides it (``advice``). Protos only;
folding uses ``onnx.reference``.
"""

from __future__ import annotations

from ortlstm.graphs.prepare.dequantize import dequantize_model
from ortlstm.graphs.prepare.pipeline import REWRITES, prepare_model
from ortlstm.graphs.prepare.rewrites import CONVERTED_BELOW, CONVERTED_OPSET
from ortlstm.graphs.prepare.state import PreparedModel

__all__ = ["CONVERTED_BELOW", "CONVERTED_OPSET", "REWRITES", "PreparedModel", "dequantize_model", "prepare_model"]
