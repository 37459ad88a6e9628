"""Greedy CTC decoding, edit distance, character error rate and sequence accuracy on hand-made cases."""

from __future__ import annotations

import numpy as np
import pytest

from ortlstm.metrics import character_error_rate, ctc_greedy_decode, edit_distance, sequence_accuracy


def one_hot_path(paths: list[list[int]], classes: int = 5, time_major: bool = True) -> np.ndarray:
    """Log-probabilities [T, N, C] whose argmax at each step is the path's class."""
    probs = np.full((len(paths), len(paths[0]), classes), 0.1 / (classes - 1))
    for row, path in enumerate(paths):
        probs[row, np.arange(len(path)), path] = 0.9
    log_probs = np.log(probs)
    return log_probs.transpose(1, 0, 2) if time_major else log_probs


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ([1, 1, 0, 1, 2, 2, 0], [1, 1, 2]),  # a blank separates the repeated 1
        ([1, 1, 1, 2, 2, 3, 3], [1, 2, 3]),  # runs merge
        ([0, 0, 0, 0, 0, 0, 0], []),  # all blank
        ([3, 0, 3, 0, 3, 0, 4], [3, 3, 3, 4]),
        ([0, 2, 0, 0, 2, 2, 4], [2, 2, 4]),
    ],
)
def test_greedy_decode_merges_repeats_and_drops_blanks(path: list[int], expected: list[int]) -> None:
    assert ctc_greedy_decode(one_hot_path([path])) == [expected]


def test_greedy_decode_takes_batch_major_probabilities_lengths_and_another_blank() -> None:
    paths = [[1, 1, 4, 2, 4, 2], [3, 4, 4, 3, 3, 1]]
    batch_major = np.exp(one_hot_path(paths, time_major=False))
    assert ctc_greedy_decode(batch_major, time_major=False) == [[1, 4, 2, 4, 2], [3, 4, 3, 1]]
    assert ctc_greedy_decode(batch_major, blank=4, time_major=False) == [[1, 2, 2], [3, 3, 1]]
    assert ctc_greedy_decode(batch_major, blank=4, time_major=False, input_lengths=[3, 0]) == [[1], []]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"scores": np.zeros((4, 5))}, r"scores must be 3-D \(T, N, C\) \(time_major=True\), got shape \[4, 5\]"),
        ({"scores": np.zeros((4, 2, 5)), "blank": 5}, r"blank 5 is not one of the 5 classes of scores \(T, N, C\)"),
        (
            {"scores": np.zeros((4, 2, 5)), "input_lengths": [4, 5]},
            r"input_lengths must hold one integer in \[0, T=4\] per sample, \[N=2\], got int64 \[2\]: \[4, 5\]",
        ),
        ({"scores": np.zeros((4, 2, 5)), "input_lengths": [4]}, r"\[N=2\], got int64 \[1\]"),
    ],
)
def test_greedy_decode_refuses_bad_input(arguments: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ctc_greedy_decode(**arguments)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("prediction", "reference", "distance"),
    [
        ("kitten", "sitting", 3),
        ("", "abc", 3),
        ("abc", "", 3),
        ("flaw", "lawn", 2),
        ("same", "same", 0),
        ([1, 2, 3], [1, 3], 1),
        ("ab", "ba", 2),
    ],
)
def test_edit_distance(prediction: str, reference: str, distance: int) -> None:
    assert edit_distance(prediction, reference) == distance
    assert edit_distance(reference, prediction) == distance


def test_character_error_rate_sums_edits_over_reference_characters() -> None:
    assert character_error_rate(["kitten", "abc"], ["sitting", "abc"]) == pytest.approx(3 / 10)
    assert character_error_rate([[1, 2, 2]], [[1, 2]]) == pytest.approx(1 / 2)
    assert character_error_rate(["abcd", ""], ["", "ab"]) == pytest.approx(6 / 2)  # above 1: insertions
    with pytest.raises(ValueError, match="2 predictions but 1 references: give one per sample"):
        character_error_rate(["a", "b"], ["a"])
    with pytest.raises(ValueError, match="the references hold no character"):
        character_error_rate(["a"], [""])


def test_sequence_accuracy() -> None:
    assert sequence_accuracy(["abc", "ab", ""], ["abc", "abd", ""]) == pytest.approx(2 / 3)
    assert sequence_accuracy([[1, 2]], [(1, 2)]) == 1.0
    with pytest.raises(ValueError, match="no sample"):
        sequence_accuracy([], [])


def test_decoded_sequences_feed_the_rates() -> None:
    decoded = ctc_greedy_decode(one_hot_path([[1, 0, 1, 2, 2, 0], [3, 3, 0, 4, 0, 0]]))
    assert decoded == [[1, 1, 2], [3, 4]]
    assert character_error_rate(decoded, [[1, 2], [3, 4]]) == pytest.approx(1 / 4)
    assert sequence_accuracy(decoded, [[1, 2], [3, 4]]) == pytest.approx(1 / 2)
