"""``ortlstm demo-chars``: a character-level language model trained with stateful truncated BPTT.

The text is the Python reference documentation that ships inside every Python (``pydoc_data``,
about 460,000 characters). It is cut into parallel streams; each step reads the next window of
every stream and starts each stream from the LSTM state the previous window ended in, without a
gradient through the boundary (``Trainer(stateful=True)``): what torch users write with
``state = tuple(s.detach() for s in state)``. The model is built as an ONNX model with a
standard ``LSTM`` node (no torch), trained in plain onnxruntime, exported, and sampled one
character at a time in onnxruntime without the ortlstm library.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

UNKNOWN = "?"
VOCABULARY = "\n" + "".join(chr(code) for code in range(32, 127))  # printable ASCII and newlines


@dataclasses.dataclass
class CharLmResult:
    """What a run measured."""

    train_losses: list[float]
    validation_loss: float
    samples: list[str]
    seconds: float
    model: Path | None


def load_text() -> str:
    """The Python reference documentation topics, in a fixed order, as printable ASCII."""
    topics = importlib.import_module("pydoc_data.topics").topics
    text = "\n".join(topics[key] for key in sorted(topics))
    allowed = set(VOCABULARY)
    return "".join(char if char in allowed else UNKNOWN for char in text)


def encode(text: str) -> np.ndarray:
    """Character -> index in ``VOCABULARY`` (int64)."""
    index = {char: position for position, char in enumerate(VOCABULARY)}
    return np.fromiter((index[char] for char in text), dtype=np.int64, count=len(text))


def build_char_lm(hidden_size: int, embedding_size: int, seed: int) -> Any:
    """The model: tokens ``[steps, streams]`` -> Gather (embedding) -> LSTM -> Gemm -> logits ``[steps * streams, V]``.

    Initialized as torch's nn.Embedding (N(0, 1)), nn.LSTM and nn.Linear (U(-1/sqrt(H), 1/sqrt(H))).
    """
    onnx = importlib.import_module("onnx")
    helper, numpy_helper = onnx.helper, onnx.numpy_helper
    rng = np.random.default_rng(seed)
    vocabulary, bound = len(VOCABULARY), 1.0 / np.sqrt(hidden_size)
    values = {
        "embedding.weight": rng.standard_normal((vocabulary, embedding_size)),
        "lstm.W": rng.uniform(-bound, bound, (1, 4 * hidden_size, embedding_size)),
        "lstm.R": rng.uniform(-bound, bound, (1, 4 * hidden_size, hidden_size)),
        "lstm.B": rng.uniform(-bound, bound, (1, 8 * hidden_size)),
        "head.weight": rng.uniform(-bound, bound, (vocabulary, hidden_size)),
        "head.bias": rng.uniform(-bound, bound, (vocabulary,)),
    }
    initializers = [numpy_helper.from_array(value.astype(np.float32), name) for name, value in values.items()]
    initializers.append(numpy_helper.from_array(np.asarray([-1, hidden_size], np.int64), "rows_by_hidden"))
    initializers.append(numpy_helper.from_array(np.asarray([1], np.int64), "direction_axis"))
    nodes = [
        helper.make_node("Gather", ["embedding.weight", "tokens"], ["embedded"]),  # [steps, streams, E]
        helper.make_node("LSTM", ["embedded", "lstm.W", "lstm.R", "lstm.B"], ["Y"], hidden_size=hidden_size),
        helper.make_node("Squeeze", ["Y", "direction_axis"], ["hidden"]),  # [steps, streams, H]
        helper.make_node("Reshape", ["hidden", "rows_by_hidden"], ["rows"]),  # [steps * streams, H]
        helper.make_node("Gemm", ["rows", "head.weight", "head.bias"], ["logits"], transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "char_lm",
        [helper.make_tensor_value_info("tokens", onnx.TensorProto.INT64, ["steps", "streams"])],
        [helper.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, [None, vocabulary])],
        initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def sample(
    session: Any, carried: dict[str, str], hidden_size: int, prompt: str, length: int, temperature: float, rng: Any
) -> str:
    """Generates ``length`` characters after ``prompt``, one at a time, carrying the LSTM state.

    Args:
        session: Runs the model with its state as inputs and outputs (``with_carried_state``).
        carried: Initial-state input -> the output that holds its next value.
        hidden_size: The LSTM's hidden size.
        prompt: The text to continue (at least one character).
        length: Characters to generate.
        temperature: Divides the logits before sampling.
        rng: A NumPy generator.
    """
    outputs = ["logits", *carried.values()]
    state = {name: np.zeros((1, 1, hidden_size), np.float32) for name in carried}
    logits = np.zeros((1, len(VOCABULARY)), np.float32)
    text = prompt
    for position, token in enumerate([*encode(prompt), *[-1] * length]):
        if position >= len(prompt):
            scaled = logits[0].astype(np.float64) / temperature
            probabilities = np.exp(scaled - scaled.max())
            token = int(rng.choice(len(VOCABULARY), p=probabilities / probabilities.sum()))
            text += VOCABULARY[token]
        logits, *final = session.run(outputs, {"tokens": np.asarray([[token]], np.int64), **state})
        state = dict(zip(carried, final, strict=True))
    return text


def _train_windows(
    trainer: Any, columns: np.ndarray, seq_length: int, steps: int, log_every: int, result: CharLmResult
) -> None:
    """Steps through consecutive windows of every stream (``columns``: [position, stream]).

    The LSTM state is carried from one window to the next, and back to zero at the start of the streams.
    """
    tqdm = importlib.import_module("tqdm")
    windows = (len(columns) - 1) // seq_length
    with tqdm.tqdm(total=steps, desc="training", leave=False, disable=not sys.stdout.isatty()) as bar:
        for step in range(steps):
            window = step % windows
            if window == 0:
                trainer.reset_state()  # back to the start of every stream
            first = window * seq_length
            inputs = columns[first : first + seq_length]
            targets = columns[first + 1 : first + seq_length + 1].reshape(-1)
            loss = trainer.step(inputs, target=targets)
            result.train_losses.append(loss)
            bar.set_postfix(loss=f"{loss:.3f}", refresh=False)
            bar.update()
            if (step + 1) % log_every == 0 or step + 1 == steps:
                recent = float(np.mean(result.train_losses[-log_every:]))
                bar.write(f"step {step + 1:4d}: loss {recent:.3f} ({recent / math.log(2):.2f} bits per character)")


def run_char_lm(
    steps: int = 400,
    seq_length: int = 64,
    streams: int = 32,
    hidden_size: int = 128,
    embedding_size: int = 32,
    learning_rate: float = 0.005,
    seed: int = 0,
    threads: int = 2,
    temperature: float = 0.7,
    output: Path | None = Path("ortlstm_chars.onnx"),
    log_every: int = 100,
    precision: str = "32-true",
) -> CharLmResult:
    """Trains the character model with stateful truncated BPTT and samples from the exported model.

    Args:
        steps: Optimizer updates (one window of every stream each).
        seq_length: Characters per window (the truncation length).
        streams: Parallel streams (the batch).
        hidden_size: LSTM hidden size.
        embedding_size: Character embedding size.
        learning_rate: AdamW's (no weight decay), cosine-annealed to 0; gradients clipped to norm 1.
        seed: Seeds the weights and the sampling.
        threads: ONNX Runtime intra-op threads.
        temperature: Sampling temperature.
        output: Where to write the trained model (None: not written).
        log_every: Print the loss every this many steps.
        precision: The Trainer's ``precision`` (``"32-true"`` or ``"bf16-mixed"``).

    Returns:
        Losses, the held-out loss, samples and timing.
    """
    start = time.perf_counter()
    ort = importlib.import_module("onnxruntime")
    losses = importlib.import_module("ortlstm.graphs.losses")
    optimizers = importlib.import_module("ortlstm.graphs.optimizers")
    training = importlib.import_module("ortlstm.training")
    tokens = encode(load_text())
    held_out = tokens[-(len(tokens) // 20) :]
    tokens = tokens[: len(tokens) - len(held_out)]
    stream_length = len(tokens) // streams
    columns = tokens[: stream_length * streams].reshape(streams, stream_length).T  # [position, stream]
    print(
        f"character LM on {len(tokens):,} characters of Python's reference documentation: {streams} streams, "
        f"windows of {seq_length}, LSTM hidden_size={hidden_size}, stateful truncated BPTT, onnxruntime "
        f"{ort.__version__}"
    )

    def cosine(done: int) -> float:
        return learning_rate * 0.5 * (1.0 + math.cos(math.pi * done / steps))

    trainer = training.Trainer(
        build_char_lm(hidden_size, embedding_size, seed),
        loss=losses.Loss.cross_entropy(),
        optimizer=optimizers.AdamW(lr=learning_rate, weight_decay=0.0),
        lr=cosine,
        clip_grad_norm=1.0,
        stateful=True,
        threads=threads,
        precision=precision,
    )
    result = CharLmResult([], 0.0, [], 0.0, None)
    _train_windows(trainer, columns, seq_length, steps, log_every, result)
    usable = (len(held_out) - 1) // seq_length * seq_length
    held_out_inputs = held_out[:usable].reshape(-1, seq_length).T  # [seq_length, windows]
    held_out_targets = held_out[1 : usable + 1].reshape(-1, seq_length).T.reshape(-1)
    result.validation_loss = float(trainer.evaluate(held_out_inputs, target=held_out_targets))
    print(f"held-out loss: {result.validation_loss:.3f} (windows of {seq_length} from a zero state)")

    exported = trainer.export(output)
    stepper, carried = training.with_carried_state(exported)
    names = {state.initial_h: state.final_h for state in carried} | {
        state.initial_c: state.final_c for state in carried
    }
    # Sampled in onnxruntime without the ortlstm library: the exported model has standard ops only.
    session = ort.InferenceSession(stepper.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(seed)
    for prompt in ("The ", "def "):
        result.samples.append(sample(session, names, hidden_size, prompt, 160, temperature, rng))
    result.model = output
    result.seconds = time.perf_counter() - start
    return result
