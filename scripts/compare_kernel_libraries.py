"""Compares every output of the recurrent training ops between two builds of the kernel library.

A refactor of the C++ time loop must leave the ops' outputs as they were: this runs
LSTMTraining + LSTMGrad, GRUTraining + GRUGrad and RNNTraining + RNNGrad (tanh and relu) over a
matrix of configurations (sizes of bench_lstm.py, peepholes, sequence_lens, clip, input_forget,
non-default activations, layout 1, reverse and bidirectional, float32 and float64, 1 and 2
threads) with one library per process, and reports per configuration whether the two libraries
agree bitwise, or else the largest difference in units of the dtype's epsilon times the output's
scale. Usage (each library in a
process of its own, since both register the same domain):

    python scripts/compare_kernel_libraries.py run --library OLD.so --out old.npz
    python scripts/compare_kernel_libraries.py run --library NEW.so --out new.npz
    python scripts/compare_kernel_libraries.py compare old.npz new.npz
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator

import numpy as np

Config = tuple[str, str, dict[str, object]]  # (name, op family, settings)

_SIZES = {
    "S": (16, 8, 64, 64),
    "M": (64, 32, 256, 256),
    "B1": (256, 1, 128, 128),
    "wide": (8, 2, 32, 512),  # one step big enough to cut into blocks of hidden units
    "empty": (4, 0, 8, 16),  # no batch entries: every gradient of a weight is zero
}


def configs() -> Iterator[Config]:
    """Every configuration compared, for the three cells, at 1 and 2 threads."""
    variants: list[tuple[str, dict[str, object]]] = [
        ("S", {}),
        ("M", {}),
        ("B1", {}),
        ("wide", {}),
        ("M-bidir", {"size": "M", "direction": "bidirectional"}),
        ("wide-bidir", {"size": "wide", "direction": "bidirectional"}),
        ("S-reverse", {"size": "S", "direction": "reverse"}),
        ("S-lens", {"size": "S", "lens": True}),
        ("M-lens-bidir", {"size": "M", "lens": True, "direction": "bidirectional"}),
        ("S-clip", {"size": "S", "clip": 0.5}),
        ("S-layout1", {"size": "S", "layout": 1}),
        ("S-layout1-bidir-lens", {"size": "S", "layout": 1, "direction": "bidirectional", "lens": True}),
        ("S-activations", {"size": "S", "activations": True}),
        ("S-f64", {"size": "S", "dtype": "float64"}),
        ("wide-f64-lens", {"size": "wide", "dtype": "float64", "lens": True}),
        ("S-omitted", {"size": "S", "omit": True}),  # no grad_HAll / grad_Ct; dW and dR only
        ("wide-bidir-omitted", {"size": "wide", "direction": "bidirectional", "omit": True}),
        ("empty", {}),
        ("empty-bidir", {"size": "empty", "direction": "bidirectional"}),
    ]
    for threads in (1, 2):
        for name, settings in variants:
            base = {"size": name, "threads": threads, **settings}
            yield f"lstm {name} t{threads}", "lstm", base
            yield f"lstm {name}+peepholes t{threads}", "lstm", {**base, "peepholes": True}
            if name == "S":
                yield f"lstm {name}+input_forget t{threads}", "lstm", {**base, "input_forget": 1}
            for lbr in (1, 0):
                yield f"gru {name} lbr{lbr} t{threads}", "gru", {**base, "lbr": lbr}
            if name != "S-activations":  # the RNN's one activation: tanh and relu in every row
                for nonlinearity in ("Tanh", "Relu"):
                    yield f"rnn {name} {nonlinearity.lower()} t{threads}", "rnn", {**base, "rnn": nonlinearity}


def _run_config(family: str, settings: dict[str, object]) -> dict[str, np.ndarray]:
    import onnxruntime as ort
    from onnx import TensorProto, helper

    import ortlstm.ops
    from ortlstm.ops import schema

    steps, batch, inputs, hidden = _SIZES[str(settings["size"])]
    layout = int(settings.get("layout", 0))  # type: ignore[call-overload]
    dtype = np.dtype(str(settings.get("dtype", "float32")))
    direction = str(settings.get("direction", "forward"))
    d = 2 if direction == "bidirectional" else 1
    gates = {"lstm": 4, "gru": 3, "rnn": 1}[family]
    rng = np.random.default_rng(7)
    scale = 1.0 / np.sqrt(hidden)
    x_shape = (steps, batch, inputs) if layout == 0 else (batch, steps, inputs)
    state = (d, batch, hidden) if layout == 0 else (batch, d, hidden)
    seq = (steps, d, batch, hidden) if layout == 0 else (batch, steps, d, hidden)
    feeds: dict[str, np.ndarray] = {
        "X": rng.standard_normal(x_shape).astype(dtype),
        "W": rng.uniform(-scale, scale, (d, gates * hidden, inputs)).astype(dtype),
        "R": rng.uniform(-scale, scale, (d, gates * hidden, hidden)).astype(dtype),
        "B": rng.uniform(-scale, scale, (d, 2 * gates * hidden)).astype(dtype),
        "initial_h": rng.standard_normal(state).astype(dtype),
    }
    if settings.get("lens"):
        feeds["sequence_lens"] = rng.integers(0, steps + 1, batch).astype(np.int32)
        feeds["sequence_lens"][0] = steps
    if family == "lstm":
        feeds["initial_c"] = rng.standard_normal(state).astype(dtype)
        if settings.get("peepholes"):
            feeds["P"] = rng.uniform(-scale, scale, (d, 3 * hidden)).astype(dtype)
    attributes: dict[str, object] = {"hidden_size": hidden, "direction": direction, "layout": layout}
    if "clip" in settings:
        attributes["clip"] = float(settings["clip"])  # type: ignore[arg-type]
    if "input_forget" in settings:
        attributes["input_forget"] = int(settings["input_forget"])  # type: ignore[call-overload]
    if "lbr" in settings:
        attributes["linear_before_reset"] = int(settings["lbr"])  # type: ignore[call-overload]
    if "rnn" in settings:
        attributes["activations"] = [str(settings["rnn"])] * d
    if settings.get("activations"):
        names = ["HardSigmoid", "Softsign", "Relu"] if family == "lstm" else ["HardSigmoid", "Softsign"]
        attributes["activations"] = names * d
    forward_op = {"lstm": "LSTMTraining", "gru": "GRUTraining", "rnn": "RNNTraining"}[family]
    grad_op = {"lstm": "LSTMGrad", "gru": "GRUGrad", "rnn": "RNNGrad"}[family]
    elem = TensorProto.FLOAT if dtype == np.float32 else TensorProto.DOUBLE

    def session(op_type: str, present: list[str], requested: list[str] | None = None) -> ort.InferenceSession:
        op = schema.op_by_name(op_type)
        outputs = [n for n in schema.output_names(op) if requested is None or n in requested]
        node = ortlstm.ops.make_node(op_type, {n: n for n in present}, {n: n for n in outputs}, **attributes)
        info = [
            helper.make_tensor_value_info(n, TensorProto.INT32 if n == "sequence_lens" else elem, None) for n in present
        ]
        graph = helper.make_graph(
            [node], op_type, info, [helper.make_tensor_value_info(n, elem, None) for n in outputs]
        )
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(schema.DOMAIN, schema.OPSET_VERSION)],
            ir_version=10,
        )
        threads = int(settings["threads"])  # type: ignore[call-overload]
        options = ortlstm.ops.session_options(intra_op_num_threads=threads)
        return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])

    forward_inputs = [p.name for p in schema.op_by_name(forward_op).inputs if p.name in feeds]
    forward_values = session(forward_op, forward_inputs).run(None, {n: feeds[n] for n in forward_inputs})
    forward = dict(zip(schema.output_names(schema.op_by_name(forward_op)), forward_values, strict=True))
    grads = {**feeds, **forward, "grad_HAll": rng.standard_normal(seq).astype(dtype)}
    grads["grad_Ht"] = rng.standard_normal(state).astype(dtype)
    if family == "lstm":
        grads["grad_Ct"] = rng.standard_normal(state).astype(dtype)
    if settings.get("omit"):  # the gradient ops' optional inputs and outputs left out
        grads.pop("grad_HAll")
        grads.pop("grad_Ct", None)
    grad_inputs = [p.name for p in schema.op_by_name(grad_op).inputs if p.name in grads]
    grad_names = list(schema.output_names(schema.op_by_name(grad_op)))
    if settings.get("omit"):
        grad_names = [n for n in grad_names if n in ("dW", "dR")]
    backward = session(grad_op, grad_inputs, grad_names).run(None, {n: grads[n] for n in grad_inputs})
    results = {f"fwd.{k}": v for k, v in forward.items()}
    results.update({f"bwd.{k}": v for k, v in zip(grad_names, backward, strict=True)})
    return results


def run(library: str, out: str) -> None:
    """Runs every configuration with `library` and saves all outputs to `out` (npz)."""
    import ortlstm.ops.library

    ortlstm.ops.library.library_path = lambda: library  # type: ignore[assignment]
    saved: dict[str, np.ndarray] = {}
    for name, family, settings in configs():
        for key, value in _run_config(family, settings).items():
            saved[f"{name}|{key}"] = value
    np.savez(out, **saved)


def compare(old: str, new: str) -> int:
    """Prints one line per configuration: bitwise, or the largest difference in eps x scale."""
    a = np.load(old)
    b = np.load(new)
    status = 0
    names = list(dict.fromkeys(key.split("|")[0] for key in a.files))
    for name in names:
        worst = 0.0
        where = ""
        for key in (k for k in a.files if k.startswith(name + "|")):
            x, y = a[key], b[key]
            if x.shape != y.shape:
                print(f"{name}: {key} shape {x.shape} vs {y.shape}")
                status = 1
                continue
            if x.tobytes() == y.tobytes():
                continue
            scale = max(float(np.max(np.abs(x))), 1e-30)
            ulps = float(np.max(np.abs(x.astype(np.float64) - y))) / (np.finfo(x.dtype).eps * scale)
            if ulps > worst:
                worst, where = ulps, key.split("|")[1]
        print(f"{name}: " + ("bitwise" if not where else f"differs, max {worst:.1f} eps x max|out| ({where})"))
        status |= 0 if not where or name.startswith(("gru", "rnn")) else 1
    return status


def main() -> int:
    """Runs the sub-command; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run_parser = sub.add_parser("run")
    run_parser.add_argument("--library", required=True)
    run_parser.add_argument("--out", required=True)
    compare_parser = sub.add_parser("compare")
    compare_parser.add_argument("old")
    compare_parser.add_argument("new")
    args = parser.parse_args()
    if args.command == "run":
        run(args.library, args.out)
        return 0
    return compare(args.old, args.new)


if __name__ == "__main__":
    sys.exit(main())
