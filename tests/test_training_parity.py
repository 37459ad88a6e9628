"""Training parity with PyTorch, end to end (acceptance test of issue 3).

A PyTorch model (an embedding or linear input layer, a two-layer bidirectional LSTM, a linear
head) is exported with ``torch.onnx.export``, turned into training artifacts by
``ortlstm.graphs.generate_artifacts`` and trained with SGD in onnxruntime-training; a deep copy
of the same model trains in PyTorch on the same batches. After every step the loss and every
parameter must agree to float32 tolerance. Scenarios: loss on every step's output, padded
batches of different lengths (``pack_padded_sequence``; the loss reads ``h_n`` alone),
``batch_first``, and frozen parameters (embedding and the first layer's recurrence weights).

Parameters are paired by value at step 0: each ONNX initializer must equal exactly one torch
parameter, its transpose, or an LSTM layer's W / R / B built by ``torch_conversion`` (exporters
rename and transpose weights, e.g. ``val_109``). What the exporters do, as observed with torch
2.13: the default (dynamo) exporter cannot export ``pack_padded_sequence``, so the padded
scenario uses ``dynamo=False``; both exporters write ``batch_first`` as transposes around
``layout=0`` LSTM nodes.

Without ``requires_grad``, ``generate_artifacts`` must train exactly the torch parameters (the
dynamo exporter adds a zero initial state as a float initializer). The trained model is then
exported for inference (its LSTMs stay ``LSTMTraining``) and run in
an ``InferenceSession``; set ``ORTLSTM_INFERENCE_PYTHON`` to a Python with plain onnxruntime
and ortlstm to run it there too.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper
import onnxruntime as ort
import pytest
from conftest import RNG_SEED
from ortlstm.ops import session_options
from torch_conversion import lstm_layer_onnx_weights, lstm_layer_sources

from ortlstm import graphs

torch = pytest.importorskip("torch")
try:
    import onnxruntime.training.artifacts as ort_artifacts
except ImportError:
    pytest.skip("needs onnxruntime-training", allow_module_level=True)

# Sizes: small, odd, no two alike, so that value matching cannot pair the wrong tensors.
VOCAB = 11
FEATURES = 3
INPUT_SIZE = 5
HIDDEN_SIZE = 7
CLASSES = 4
BATCH = 4
SEQ_LENGTH = 6
MAX_PADDED_LENGTH = 8  # padded batches have 2..8 steps, each sequence 1..steps valid ones
TRAINING_STEPS = 20
LEARNING_RATE = 0.5  # large, so that 20 steps move every parameter well beyond the tolerance

# float32 after up to 20 SGD steps: observed differences are about 1e-7.
FLOAT32_RTOL = 1e-4
FLOAT32_ATOL = 1e-5
# Every trained parameter must move by more than this, or the comparison would prove little.
MIN_TRAINED_CHANGE = 1e-3

INFERENCE_PYTHON_VARIABLE = "ORTLSTM_INFERENCE_PYTHON"


@dataclasses.dataclass(frozen=True)
class Scenario:
    """One model and data setup trained in both frameworks."""

    name: str
    tokens: bool  # input layer: Embedding of int64 tokens, else Linear of float features
    loss: str  # "cross_entropy" (labels) or "mse" (target)
    reads_h_n: bool = False  # head on the last layer's final hidden states, else on every step's output
    batch_first: bool = False
    padded: bool = False  # pack_padded_sequence with per-sequence lengths; the step count varies per batch
    frozen: tuple[str, ...] = ()  # torch parameter names not trained

    def __post_init__(self) -> None:
        if self.padded and not self.reads_h_n:
            raise ValueError(f"{self.name}: a padded scenario reads h_n (Net does not unpack the packed output)")


SCENARIOS = [
    Scenario("tokens_seq_first_y", tokens=True, loss="cross_entropy"),
    Scenario("tokens_padded_h_n", tokens=True, loss="cross_entropy", reads_h_n=True, padded=True),
    Scenario("features_batch_first_y", tokens=False, loss="mse", batch_first=True),
    Scenario(
        "features_padded_batch_first_h_n", tokens=False, loss="mse", reads_h_n=True, batch_first=True, padded=True
    ),
    Scenario(
        "tokens_frozen_embedding_R0_h_n",
        tokens=True,
        loss="cross_entropy",
        reads_h_n=True,
        frozen=("input_layer.weight", "lstm.weight_hh_l0", "lstm.weight_hh_l0_reverse"),
    ),
]

# The dynamo exporter fails on pack_padded_sequence (see test_dynamo_exporter_cannot_export_packed_sequences).
CASES = [
    pytest.param(scenario, exporter, id=f"{scenario.name}-{exporter}")
    for scenario in SCENARIOS
    for exporter in ("dynamo", "torchscript")
    if not (scenario.padded and exporter == "dynamo")
]


class Net(torch.nn.Module):
    """Input layer, two-layer bidirectional LSTM, linear head."""

    def __init__(self, scenario: Scenario):
        super().__init__()
        self.reads_h_n = scenario.reads_h_n
        self.batch_first = scenario.batch_first
        self.flatten = scenario.loss == "cross_entropy" and not scenario.reads_h_n
        if scenario.tokens:
            self.input_layer: torch.nn.Module = torch.nn.Embedding(VOCAB, INPUT_SIZE)
        else:
            self.input_layer = torch.nn.Linear(FEATURES, INPUT_SIZE)
        self.lstm = torch.nn.LSTM(
            INPUT_SIZE, HIDDEN_SIZE, num_layers=2, bidirectional=True, batch_first=scenario.batch_first
        )
        self.head = torch.nn.Linear(2 * HIDDEN_SIZE, CLASSES)

    def forward(self, x, lengths=None):
        """Logits: per step (flattened to rows for cross entropy), or per sequence from h_n."""
        inputs = self.input_layer(x)
        if lengths is not None:
            inputs = torch.nn.utils.rnn.pack_padded_sequence(
                inputs, lengths, batch_first=self.batch_first, enforce_sorted=False
            )
        y, (h_n, _) = self.lstm(inputs)
        if self.reads_h_n:
            return self.head(torch.cat([h_n[-2], h_n[-1]], dim=1))
        out = self.head(y)
        return out.reshape(-1, CLASSES) if self.flatten else out


def make_batch(scenario: Scenario, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Model inputs and the loss's labels / target, keyed by their ONNX input names."""
    steps = int(rng.integers(2, MAX_PADDED_LENGTH + 1)) if scenario.padded else SEQ_LENGTH
    shape = (BATCH, steps) if scenario.batch_first else (steps, BATCH)
    if scenario.tokens:
        batch = {"x": rng.integers(0, VOCAB, shape, dtype=np.int64)}
    else:
        batch = {"x": rng.standard_normal((*shape, FEATURES)).astype(np.float32)}
    if scenario.padded:
        batch["lengths"] = rng.integers(1, steps + 1, BATCH, dtype=np.int64)
    if scenario.reads_h_n:
        out_shape: tuple[int, ...] = (BATCH, CLASSES)
    else:
        out_shape = (*shape, CLASSES)
    if scenario.loss == "cross_entropy":
        batch["labels"] = rng.integers(0, CLASSES, int(np.prod(out_shape[:-1])), dtype=np.int64)
    else:
        batch["target"] = rng.standard_normal(out_shape).astype(np.float32)
    return batch


def model_inputs(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {name: value for name, value in batch.items() if name in ("x", "lengths")}


def torch_forward(net: Net, batch: dict[str, np.ndarray]):
    return net(*(torch.from_numpy(value) for value in model_inputs(batch).values()))


def torch_loss(net: Net, batch: dict[str, np.ndarray]):
    out = torch_forward(net, batch)
    if "labels" in batch:
        return torch.nn.functional.cross_entropy(out, torch.from_numpy(batch["labels"]))
    return torch.nn.functional.mse_loss(out, torch.from_numpy(batch["target"]))


def export(net: Net, scenario: Scenario, exporter: str, batch: dict[str, np.ndarray], path: Path) -> onnx.ModelProto:
    inputs = model_inputs(batch)
    kwargs: dict = {"dynamo": exporter == "dynamo"}
    if scenario.padded:  # the step count varies per batch
        kwargs["dynamic_axes"] = {"x": {1 if scenario.batch_first else 0: "steps"}}
    torch.onnx.export(
        net,
        tuple(torch.from_numpy(value) for value in inputs.values()),
        str(path),
        input_names=list(inputs),
        output_names=["logits"],
        **kwargs,
    )
    return onnx.load(str(path))


# ---------------------------------------------------------------------------------------------
# Pairing ONNX initializers with torch parameters


@dataclasses.dataclass(frozen=True)
class TorchSource:
    """How one ONNX initializer is computed from torch parameters."""

    description: str
    parameters: tuple[str, ...]
    value: Callable[[torch.nn.Module], np.ndarray]


def _parameter(net: torch.nn.Module, name: str) -> np.ndarray:
    return net.get_parameter(name).detach().numpy().copy()  # a snapshot: SGD updates the tensor in place


def _lstm_port(net: torch.nn.Module, module_name: str, layer: int, port: str) -> np.ndarray:
    return lstm_layer_onnx_weights(net.get_submodule(module_name), layer)[port]


def torch_sources(net: torch.nn.Module) -> list[TorchSource]:
    """Every way an exporter may write a parameter: as is, transposed, or as an LSTM layer's W / R / B."""
    sources = []
    for name, parameter in net.named_parameters():
        sources.append(TorchSource(name, (name,), lambda m, n=name: _parameter(m, n)))
        if parameter.ndim == 2:
            sources.append(TorchSource(f"{name}^T", (name,), lambda m, n=name: _parameter(m, n).T))
    for module_name, module in net.named_modules():
        if isinstance(module, torch.nn.LSTM):
            for layer in range(module.num_layers):
                for port, names in lstm_layer_sources(module, layer).items():
                    sources.append(
                        TorchSource(
                            f"{module_name} layer {layer} {port}",
                            tuple(f"{module_name}.{name}" for name in names),
                            lambda m, mn=module_name, k=layer, p=port: _lstm_port(m, mn, k, p),
                        )
                    )
    return sources


def pair_initializers(model: onnx.ModelProto, net: torch.nn.Module) -> dict[str, TorchSource]:
    """ONNX initializer name -> the torch source it equals; every torch parameter must be covered."""
    candidates = [(source, source.value(net)) for source in torch_sources(net)]
    pairs = {}
    for initializer in model.graph.initializer:
        array = onnx.numpy_helper.to_array(initializer)
        hits = [source for source, value in candidates if value.shape == array.shape and np.array_equal(value, array)]
        assert len(hits) <= 1, f"initializer {initializer.name} equals several torch tensors: {hits}"
        if hits:
            pairs[initializer.name] = hits[0]
    covered = {name for source in pairs.values() for name in source.parameters}
    missing = sorted({name for name, _ in net.named_parameters()} - covered)
    assert not missing, f"no ONNX initializer equals (a view of) torch parameters {missing}"
    return pairs


# ---------------------------------------------------------------------------------------------
# The two training runs


@dataclasses.dataclass
class TrainingRun:
    """Both runs of one case: per-step losses and parameters, and the ORT objects at the end."""

    case: str
    pairs: dict[str, TorchSource]
    trainable: list[str]
    frozen: list[str]
    initial: dict[str, np.ndarray]
    losses: list[tuple[float, float]] = dataclasses.field(default_factory=list)  # (ORT, torch) per step
    parameters: list[dict[str, tuple[np.ndarray, np.ndarray]]] = dataclasses.field(default_factory=list)
    module: object = None
    state: object = None
    net: Net | None = None
    artifacts: graphs.TrainingArtifacts | None = None
    last_batch: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)


def split_frozen(pairs: dict[str, TorchSource], frozen_parameters: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """ONNX initializer names (trained, frozen) for the torch parameters ``frozen_parameters``."""
    trainable, frozen = [], []
    for onnx_name, source in pairs.items():
        kinds = {name in frozen_parameters for name in source.parameters}
        assert len(kinds) == 1, f"{onnx_name} mixes frozen and trained torch parameters {source.parameters}"
        (frozen if kinds.pop() else trainable).append(onnx_name)
    return trainable, frozen


def ort_loss(scenario: Scenario):
    if scenario.loss == "cross_entropy":
        return ort_artifacts.LossType.CrossEntropyLoss
    return ort_artifacts.LossType.MSELoss


def train_both(scenario: Scenario, exporter: str, directory: Path) -> TrainingRun:
    rng = np.random.default_rng(RNG_SEED)
    torch.manual_seed(RNG_SEED)
    exported_net = Net(scenario)
    net = copy.deepcopy(exported_net)
    for name in scenario.frozen:
        net.get_parameter(name).requires_grad_(False)

    model = export(exported_net, scenario, exporter, make_batch(scenario, rng), directory / "model.onnx")
    pairs = pair_initializers(model, net)
    trainable, frozen = split_frozen(pairs, scenario.frozen)
    artifacts = graphs.generate_artifacts(
        model,
        requires_grad=trainable,
        frozen_params=frozen,
        loss=ort_loss(scenario),
        optimizer=ort_artifacts.OptimType.SGD,
        artifact_directory=directory / "artifacts",
    )
    module, optimizer, state = graphs.open_training(artifacts, intra_op_num_threads=1)
    optimizer.set_learning_rate(LEARNING_RATE)
    torch_optimizer = torch.optim.SGD([p for p in net.parameters() if p.requires_grad], lr=LEARNING_RATE)

    run = TrainingRun(
        case=f"{scenario.name}-{exporter} (seed {RNG_SEED})",
        pairs=pairs,
        trainable=trainable,
        frozen=frozen,
        initial={name: state.parameters[name].data.copy() for name in pairs},
        module=module,
        state=state,
        net=net,
        artifacts=artifacts,
    )
    module.train()
    for _ in range(TRAINING_STEPS):
        batch = make_batch(scenario, rng)
        ort_loss_value = module(*(batch[name] for name in module.input_names()))
        optimizer.step()
        module.lazy_reset_grad()

        torch_optimizer.zero_grad()
        loss = torch_loss(net, batch)
        loss.backward()
        torch_optimizer.step()

        run.losses.append((float(ort_loss_value), loss.item()))
        run.parameters.append(
            {name: (state.parameters[name].data.copy(), source.value(net)) for name, source in pairs.items()}
        )
        run.last_batch = batch
    return run


@pytest.fixture(scope="module")
def training_runs(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Scenario, str], TrainingRun]:
    """Trains each case once per module; the tests below read the same runs."""
    cache: dict[tuple[str, str], TrainingRun] = {}

    def get(scenario: Scenario, exporter: str) -> TrainingRun:
        key = (scenario.name, exporter)
        if key not in cache:
            cache[key] = train_both(scenario, exporter, tmp_path_factory.mktemp(f"{scenario.name}-{exporter}"))
        return cache[key]

    return get


# ---------------------------------------------------------------------------------------------
# Tests


def max_difference(run: TrainingRun) -> tuple[float, float]:
    """Largest |ORT - torch| over all steps: (parameters, loss)."""
    parameters = max(float(np.max(np.abs(a - b))) for step in run.parameters for a, b in step.values())
    loss = max(abs(a - b) for a, b in run.losses)
    return parameters, loss


@pytest.mark.parametrize(("scenario", "exporter"), CASES)
def test_parameters_match_torch_after_every_step(scenario, exporter, training_runs):
    run = training_runs(scenario, exporter)
    assert len(run.parameters) == TRAINING_STEPS
    steps = enumerate(zip(run.losses, run.parameters, strict=True), start=1)
    for step, ((ort_loss_value, torch_loss_value), parameters) in steps:
        np.testing.assert_allclose(
            ort_loss_value,
            torch_loss_value,
            rtol=FLOAT32_RTOL,
            atol=FLOAT32_ATOL,
            err_msg=f"{run.case}: loss of step {step}",
        )
        for name, (ort_value, torch_value) in parameters.items():
            np.testing.assert_allclose(
                ort_value,
                torch_value,
                rtol=FLOAT32_RTOL,
                atol=FLOAT32_ATOL,
                err_msg=f"{run.case}: {name} ({run.pairs[name].description}) after step {step}",
            )
    parameter_difference, loss_difference = max_difference(run)
    print(f"{run.case}: max |ORT - torch| parameters {parameter_difference:.3g}, loss {loss_difference:.3g}")


@pytest.mark.parametrize(("scenario", "exporter"), CASES)
def test_trained_parameters_moved_and_frozen_ones_did_not(scenario, exporter, training_runs):
    run = training_runs(scenario, exporter)
    assert {run.pairs[name].parameters for name in run.frozen} == {
        source.parameters for source in run.pairs.values() if set(source.parameters) <= set(scenario.frozen)
    }
    final = run.parameters[-1]
    for name in run.trainable:
        change = float(np.max(np.abs(final[name][0] - run.initial[name])))
        assert change > MIN_TRAINED_CHANGE, f"{run.case}: {name} moved only {change:.3g} in {TRAINING_STEPS} steps"
    for name in run.frozen:
        np.testing.assert_array_equal(final[name][0], run.initial[name], err_msg=f"{run.case}: frozen {name} changed")
        np.testing.assert_array_equal(final[name][1], run.initial[name], err_msg=f"{run.case}: torch {name} changed")


def export_inference_model(run: TrainingRun, path: Path) -> onnx.ModelProto:
    model = graphs.export_inference_model(run.artifacts, run.state, ["logits"], path)
    assert [value.name for value in model.graph.output] == ["logits"]
    assert any(node.op_type == "LSTMTraining" and node.domain == "ortlstm" for node in model.graph.node)
    assert not any(node.op_type in ("LSTM", "SoftmaxCrossEntropyLoss") for node in model.graph.node)
    return model


def torch_eval_logits(run: TrainingRun) -> np.ndarray:
    run.net.eval()
    with torch.no_grad():
        return torch_forward(run.net, run.last_batch).numpy()


@pytest.mark.parametrize(("scenario", "exporter"), CASES)
def test_trained_inference_model_matches_torch(scenario, exporter, training_runs, tmp_path):
    run = training_runs(scenario, exporter)
    path = tmp_path / "inference.onnx"
    export_inference_model(run, path)
    session = ort.InferenceSession(str(path), session_options(), providers=["CPUExecutionProvider"])
    (logits,) = session.run(None, model_inputs(run.last_batch))
    np.testing.assert_allclose(
        logits, torch_eval_logits(run), rtol=FLOAT32_RTOL, atol=FLOAT32_ATOL, err_msg=f"{run.case}: inference"
    )


_PLAIN_RUNTIME_SCRIPT = """
import sys
import numpy as np
import onnxruntime as ort
from ortlstm.ops import session_options
feeds = dict(np.load(sys.argv[2]))
session = ort.InferenceSession(sys.argv[1], session_options(), providers=["CPUExecutionProvider"])
np.save(sys.argv[3], session.run(None, feeds)[0])
print(ort.__version__)
"""


@pytest.mark.parametrize(
    ("scenario", "exporter"),
    [case for case in CASES if case.id in ("tokens_padded_h_n-torchscript", "features_batch_first_y-dynamo")],
)
def test_trained_inference_model_runs_in_plain_onnxruntime(scenario, exporter, training_runs, tmp_path):
    python = os.environ.get(INFERENCE_PYTHON_VARIABLE)
    if not python:
        pytest.skip(f"set {INFERENCE_PYTHON_VARIABLE} to a Python with plain onnxruntime and ortlstm installed")
    run = training_runs(scenario, exporter)
    path = tmp_path / "inference.onnx"
    export_inference_model(run, path)
    np.savez(tmp_path / "feeds.npz", **model_inputs(run.last_batch))
    # cwd outside the checkout: from its root, `import ortlstm` would find the source folder, not the install.
    result = subprocess.run(
        [python, "-c", _PLAIN_RUNTIME_SCRIPT, str(path), str(tmp_path / "feeds.npz"), str(tmp_path / "logits.npy")],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    assert result.returncode == 0, f"{python} failed:\n{result.stderr}"
    print(f"{run.case}: ran in onnxruntime {result.stdout.strip()}")
    np.testing.assert_allclose(
        np.load(tmp_path / "logits.npy"),
        torch_eval_logits(run),
        rtol=FLOAT32_RTOL,
        atol=FLOAT32_ATOL,
        err_msg=f"{run.case}: inference in {python}",
    )


@pytest.mark.xfail(strict=True, reason="torch 2.13's dynamo exporter cannot trace pack_padded_sequence")
def test_dynamo_exporter_cannot_export_packed_sequences(tmp_path):
    scenario = SCENARIOS[1]
    assert scenario.padded
    batch = make_batch(scenario, np.random.default_rng(RNG_SEED))
    export(Net(scenario), scenario, "dynamo", batch, tmp_path / "model.onnx")


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_default_requires_grad_is_the_torch_parameters(exporter, tmp_path):
    """Without requires_grad, every torch parameter trains, and nothing else.

    The dynamo exporter writes the zero initial state as a float initializer (fed to initial_h
    and initial_c of both layers); torch does not train it, and neither may the default.
    """
    scenario = SCENARIOS[0]
    torch.manual_seed(RNG_SEED)
    net = Net(scenario)
    batch = make_batch(scenario, np.random.default_rng(RNG_SEED))
    model = export(net, scenario, exporter, batch, tmp_path / "model.onnx")
    artifacts = graphs.generate_artifacts(model, loss=ort_loss(scenario), artifact_directory=tmp_path / "artifacts")
    _, _, state = graphs.open_training(artifacts)
    trained = {name for name, parameter in state.parameters if parameter.requires_grad}
    assert trained == set(pair_initializers(model, net))


def test_export_inference_model_names_unknown_outputs(training_runs, tmp_path):
    run = training_runs(SCENARIOS[0], "torchscript")
    with pytest.raises(ValueError, match=r"outputs \['no_such_value'\] are not values of the eval model"):
        graphs.export_inference_model(run.artifacts, run.state, ["no_such_value"], tmp_path / "model.onnx")


@pytest.mark.xfail(
    strict=True,
    raises=RuntimeError,
    reason="onnxruntime-training 1.19's export reloads the eval model without the custom-op library",
)
def test_onnxruntime_training_export_fails_on_custom_ops(training_runs, tmp_path):
    """Why ortlstm.graphs.export_inference_model exists."""
    run = training_runs(SCENARIOS[0], "torchscript")
    run.module.export_model_for_inferencing(str(tmp_path / "model.onnx"), ["logits"])
