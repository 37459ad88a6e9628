"""Data-parallel training over MPI: every rank trains the same model on its shard of each global batch.

``DistributedTrainer`` wraps a ``Trainer`` on each rank (started by ``mpirun``/``srun``). A step
computes the rank's gradients with the Trainer's gradients model, all-reduces them in place (one
contiguous buffer per dtype, each rank's share weighted by its part of the loss's denominator),
and every rank runs the same apply model on the same sum: clipping, the non-finite guard and the
optimizer see the gradient of the global batch, and parameters and optimizer state stay bitwise
identical across ranks (checked by comparing a hash). It needs mpi4py (``pip install
'ortlstm[mpi]'``); never torch.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from ortlstm.graphs import losses
from ortlstm.training import NonFiniteStepError, Trainer


class DivergenceError(RuntimeError):
    """The ranks' training states differ: they no longer train one model."""


def _import_mpi() -> Any:
    try:
        from mpi4py import MPI
    except ModuleNotFoundError as error:
        raise ImportError("ortlstm.distributed needs mpi4py and an MPI: pip install 'ortlstm[mpi]'") from error
    return MPI


def shard(total: int, rank: int, size: int) -> slice:
    """The contiguous part of a global batch of ``total`` samples that ``rank`` of ``size`` trains on.

    Parts differ by at most one sample, the first ranks take the larger ones; a rank gets an
    empty slice when ``total < size``.

    Raises:
        ValueError: ``rank`` is not in ``[0, size)`` or ``total`` is negative.
    """
    if size < 1 or not 0 <= rank < size:
        raise ValueError(f"shard(): rank must be in [0, size={size}), got {rank}")
    if total < 0:
        raise ValueError(f"shard(): total must be >= 0 samples, got {total}")
    quotient, remainder = divmod(total, size)
    start = rank * quotient + min(rank, remainder)
    return slice(start, start + quotient + (rank < remainder))


def epoch_batches(
    num_samples: int, batch_size: int, *, epoch: int, seed: int = 0, shuffle: bool = True, drop_last: bool = False
) -> list[np.ndarray]:
    """The global batches of one epoch as sample indices: every sample once, the same on every rank.

    The order is a permutation seeded by ``(seed, epoch)`` (as torch's DistributedSampler seeds
    ``seed + epoch``), so every rank computes the same batches without communicating, and they do
    not depend on the number of ranks: a run resumed on another number of ranks sees the same data.
    Each rank trains ``batch[shard(len(batch), rank, size)]`` of each. Unlike DistributedSampler,
    nothing is repeated to pad the last batch: it is smaller (or dropped with ``drop_last``), and
    ``DistributedTrainer`` weights it exactly.

    Raises:
        ValueError: ``batch_size`` < 1, or ``num_samples`` or ``epoch`` < 0.
    """
    if batch_size < 1:
        raise ValueError(f"epoch_batches(): batch_size must be >= 1, got {batch_size}")
    if num_samples < 0 or epoch < 0:
        raise ValueError(f"epoch_batches(): num_samples and epoch must be >= 0, got {num_samples} and {epoch}")
    order = np.random.default_rng([seed, epoch]).permutation(num_samples) if shuffle else np.arange(num_samples)
    stop = num_samples - num_samples % batch_size if drop_last else num_samples
    return [order[start : min(start + batch_size, stop)] for start in range(0, stop, batch_size)]


def loss_weight(
    loss: losses.Loss,
    target: Any,
    batch_size: int,
    extra_targets: Mapping[str, Any],
    prediction_shape: Sequence[int] | None = None,
) -> float:
    """The denominator of the loss's ``'mean'`` on this batch: the share a rank's mean gradient carries.

    One process on the global batch divides the summed per-element losses by the global
    denominator; a rank divides by its own. Scaling each rank's gradient by ``own / global``
    before summing gives the global mean. The denominators follow torch, as the loss's table entry
    declares them (``Loss.mean_denominator``, see ``losses.MEANS``): the non-ignored targets' class
    weights (cross_entropy, nll_loss with class indices), the samples (ctc_loss: the entries of its
    ``lengths`` extra target), the batch (kl_div ``'batchmean'``, ``Loss.output()``: ``batch_size``),
    else the target's elements (only the ratio between ranks matters, so class probabilities need
    not divide by the classes), or, given the prediction's shape, the elements of the shape the
    target broadcasts to with it (a ``[1, C]`` target for a ``[rows, C]`` prediction counts
    ``rows * C``, as torch's mean does).

    Returns:
        1.0 for ``'sum'`` and ``'none'`` (their gradients add up across ranks unscaled).
    """
    denominator = loss.mean_denominator
    if denominator is None:
        return 1.0
    if denominator == "batch":
        return float(batch_size)
    target = np.asarray(target)
    if denominator == "samples" and loss.lengths is not None:
        return float(np.asarray(extra_targets[loss.lengths]).shape[0])
    if denominator == "class_weights" and target.dtype.kind in "iu":
        kept = target[target != loss.ignore_index]
        if loss.weight is None:
            return float(kept.size)
        return float(np.sum(np.asarray(loss.weight, np.float64)[kept]))
    if prediction_shape is not None:
        return float(np.prod(np.broadcast_shapes(tuple(prediction_shape), target.shape)))
    return float(target.size)


class DistributedTrainer:
    """A ``Trainer`` per rank that trains one model on the global batch, data-parallel over MPI.

    Each rank passes its shard of every global batch (``shard`` gives a contiguous one)::

        comm = MPI.COMM_WORLD
        trainer = DistributedTrainer(Trainer(model, loss=..., optimizer=..., threads=1))
        for x, y in global_batches:                      # the same order on every rank
            part = shard(len(x), comm.rank, comm.size)
            loss = trainer.step(x[part], target=y[part])  # the global batch's loss
        trainer.save("run.safetensors")                   # rank 0 writes it, atomically

    A step: the rank's gradients (the gradients model), scaled by its share of the loss's
    denominator (``loss_weight``: a ragged last batch still gives the global mean), one in-place
    all-reduce per dtype, then the Trainer's apply model on the sum: gradient clipping and the
    non-finite guard act on the global gradient, and every rank makes the same update. The result
    equals one process on the global batch up to float32 rounding of the summation order.

    Attributes:
        trainer: This rank's Trainer.
        comm: The communicator.
        check_every: Compare the ranks' state hashes every this many updates (0: never).
        reduced_bytes: Bytes all-reduced per step (the gradients).
        reduce_seconds: Time spent in the gradients' all-reduce, summed over steps.
    """

    def __init__(
        self,
        trainer: Trainer,
        comm: Any = None,
        *,
        check_every: int = 100,
        abort_on_exception: bool = True,
        collective_timeout: float | None = None,
    ) -> None:
        """Broadcasts rank 0's parameters, optimizer state and step counts to every rank.

        Args:
            trainer: This rank's Trainer, built the same way on every rank.
            comm: An mpi4py communicator (default: ``MPI.COMM_WORLD``).
            check_every: Compare a hash of the training state across ranks every this many
                updates (and after ``load``); ``DivergenceError`` on a difference. 0: never.
            abort_on_exception: ``install_abort_on_exception(comm)``: an exception that ends
                this process aborts every rank, so none waits forever in a collective.
            collective_timeout: Seconds this rank may wait in one collective (which includes
                waiting for the slowest rank's step) before it aborts every rank with
                ``MPI_Abort``, naming the collective: a rank that hangs without dying (a deadlock,
                a stalled file system) then ends the job too. None (default): wait forever.

        Raises:
            ValueError: A stateful trainer (its carried LSTM state is per rank), a bad
                ``check_every``, or ranks whose trainers differ in spec or parameters (on every rank).
        """
        if trainer.spec.stateful:
            raise ValueError(
                "DistributedTrainer: a stateful Trainer carries LSTM state per batch row, which data "
                "parallelism splits across ranks; build the Trainer with stateful=False"
            )
        if check_every < 0:
            raise ValueError(f"check_every must be >= 0 (0: never), got {check_every}")
        if collective_timeout is not None and not collective_timeout > 0:
            raise ValueError(f"collective_timeout must be > 0 seconds or None, got {collective_timeout}")
        self.trainer = trainer
        self.comm = _import_mpi().COMM_WORLD if comm is None else comm
        self.check_every = check_every
        if abort_on_exception:
            install_abort_on_exception(self.comm)
        self._watchdog = None if collective_timeout is None else _Watchdog(self.comm, collective_timeout)
        self._check_same_training()
        params = trainer.parameters
        # One contiguous gradient buffer per dtype, in the signature's order (the same on every rank).
        sizes: dict[np.dtype, int] = {}
        for value in params.values():
            sizes[value.dtype] = sizes.get(value.dtype, 0) + value.size
        self._buckets = {dtype: np.zeros(size, dtype) for dtype, size in sizes.items()}
        self._views: dict[str, np.ndarray] = {}
        offsets = dict.fromkeys(sizes, 0)
        for name in trainer.signature.params:
            value = params[name]
            start = offsets[value.dtype]
            self._views[name] = self._buckets[value.dtype][start : start + value.size].reshape(value.shape)
            offsets[value.dtype] += value.size
        self.reduced_bytes = sum(bucket.nbytes for bucket in self._buckets.values())
        self.reduce_seconds = 0.0
        self._broadcast_state()
        self.check_state()

    @property
    def rank(self) -> int:
        """This process's rank."""
        return int(self.comm.Get_rank())

    @property
    def size(self) -> int:
        """The number of ranks."""
        return int(self.comm.Get_size())

    # ---- state across ranks -------------------------------------------------------------------

    def _state(self) -> dict[str, np.ndarray]:
        """Parameters and optimizer state by the training models' input names (the signature's order)."""
        trainer, signature = self.trainer, self.trainer.signature
        values = trainer.parameters
        slots = trainer.optimizer_state
        state: dict[str, np.ndarray] = {}
        for name in signature.params:
            state[name] = values[name]
            state.update({signature.state[name][slot]: value for slot, value in slots[name].items()})
        return state

    def _check_same_training(self) -> None:
        """Refuses ranks whose trainers differ: same spec, parameters, shapes and types as rank 0."""
        trainer = self.trainer
        layout = [(name, value.dtype.str, value.shape) for name, value in self._state().items()]
        described = json.dumps([trainer.spec.to_json(), layout], sort_keys=True, default=str)
        with self._waiting("the comparison of the trainers"):
            digests = self.comm.allgather(hashlib.blake2b(described.encode(), digest_size=16).hexdigest())
        differing = [rank for rank, digest in enumerate(digests) if digest != digests[0]]
        if differing:
            raise ValueError(
                f"DistributedTrainer: the Trainer of rank(s) {differing} differs from rank 0's in its training spec "
                "(loss, optimizer, options) or its parameters' names, shapes or types; build the same Trainer on "
                "every rank"
            )

    def _broadcast_state(self) -> None:
        state = self._state()
        with self._waiting("the broadcast of rank 0's state"):
            for value in state.values():
                self.comm.Bcast(value, root=0)
            counts = self.comm.bcast((self.trainer.global_step, self.trainer.skipped_steps), root=0)
        self.trainer._assign(state)  # the Trainer's own setter of parameters and optimizer state
        self.trainer.global_step, self.trainer.skipped_steps = counts

    def state_digest(self) -> str:
        """A hash of this rank's parameters, optimizer state and step counts (hex)."""
        digest = hashlib.blake2b(digest_size=16)
        digest.update(f"{self.trainer.global_step}/{self.trainer.skipped_steps}".encode())
        for name, value in self._state().items():
            digest.update(name.encode())
            digest.update(np.ascontiguousarray(value).tobytes())
        return digest.hexdigest()

    def check_state(self) -> None:
        """Compares every rank's ``state_digest`` with rank 0's (a collective: every rank calls it).

        Raises:
            DivergenceError: On every rank, when some rank's state differs from rank 0's.
        """
        with self._waiting("the comparison of the state hashes"):
            digests = self.comm.allgather(self.state_digest())
        differing = [rank for rank, digest in enumerate(digests) if digest != digests[0]]
        if differing:
            raise DivergenceError(
                f"after update {self.trainer.global_step}: the parameters or optimizer state of rank(s) {differing} "
                f"differ from rank 0's (state hashes {digests}); the ranks no longer train one model. Was the "
                "trainer changed on one rank only, or did the MPI all-reduce give the ranks different sums?"
            )

    # ---- training -------------------------------------------------------------------------------

    def step(
        self, *batch: Any, target: Any = None, lr: float | None = None, weight: float | None = None, **named: Any
    ) -> Any:
        """One update on the global batch, of which this rank passes its shard (a collective).

        Args:
            *batch: This rank's shard of the model's inputs (may be empty on some ranks).
            target: This rank's shard of the labels.
            lr: The learning rate of this update (the same on every rank).
            weight: This shard's share of the loss's mean denominator (default: ``loss_weight``;
                0 for an empty shard); pass it when the rule does not fit your ``Loss.output()``.
            **named: Model inputs by name and the loss's other targets, as in ``Trainer.step``.

        Returns:
            The global batch's loss (a float), or ``(loss, *extra_outputs)`` with this rank's
            extra outputs.

        Raises:
            NonFiniteStepError: On every rank, when the global loss or the reduced gradient is
                not finite (``nonfinite="raise"``); nothing was updated.
        """
        trainer = self.trainer
        loss = trainer.spec.loss
        weight = self._weight(batch, target, named, "step()") if weight is None else weight
        local: Any = None
        if weight > 0:
            local = trainer.accumulate(*batch, target=target, **named)
        local_loss = local[0] if isinstance(local, tuple) else local
        mean = loss.reduction not in ("sum", "none")
        contribution = 0.0 if local_loss is None else float(np.sum(local_loss)) * (weight if mean else 1.0)
        totals = np.array([weight, contribution], np.float64)
        with self._waiting("the all-reduce of the loss (every rank's step)"):
            self.comm.Allreduce(self._in_place(), totals)
        total_weight, total_loss = float(totals[0]), float(totals[1])
        global_loss = total_loss / total_weight if mean and total_weight > 0 else total_loss
        if not np.isfinite(global_loss):
            trainer.zero_grad()
            self._refuse(global_loss, local_loss)
            return self._result(global_loss, local)
        gradients = trainer.accumulated_gradients
        scale = weight / total_weight if mean and total_weight > 0 else 1.0
        for name, view in self._views.items():
            if name in gradients:
                np.multiply(gradients[name], scale, out=view)
            else:
                view.fill(0)
        started = time.perf_counter()
        with self._waiting("the all-reduce of the gradients"):
            for bucket in self._buckets.values():
                self.comm.Allreduce(self._in_place(), bucket)
        self.reduce_seconds += time.perf_counter() - started
        trainer.zero_grad()
        trainer.apply(lr, gradients=self._views)
        if self.check_every and trainer.global_step % self.check_every == 0:
            self.check_state()
        return self._result(global_loss, local)

    def step_accumulated(self, micro_batches: Sequence[Mapping[str, Any]], lr: float | None = None) -> Any:
        """One update from several micro-batches of this rank's shard, with one all-reduce of the gradients.

        Each micro-batch (keywords as ``step`` takes them, ``target`` among them) runs its forward
        and backward alone (the memory of one micro-batch), its gradient is added to the rank's
        buffer scaled by its share of the global denominator (``loss_weight`` over every
        micro-batch of every rank, summed first in a two-number all-reduce), and the buffer is
        all-reduced once: the update of the concatenated global batch, up to float32 rounding of
        the summation order. One micro-batch gives exactly ``step``'s sums.

        Returns:
            The global batch's loss, or ``(loss, *extra_outputs)`` of this rank's last micro-batch.

        Raises:
            NonFiniteStepError: As ``step``.
        """
        trainer = self.trainer
        mean = trainer.spec.loss.reduction not in ("sum", "none")
        parts = [({k: v for k, v in named.items() if k != "target"}, named.get("target")) for named in micro_batches]
        weights = [self._weight((), target, rest, "step()") for rest, target in parts]
        totals = np.array([sum(weights), 0.0], np.float64)
        with self._waiting("the all-reduce of the micro-batches' weights"):
            self.comm.Allreduce(self._in_place(), totals)
        total_weight = float(totals[0])
        for view in self._views.values():
            view.fill(0)
        contribution, local, losses_seen = 0.0, None, []
        for (rest, target), weight in zip(parts, weights, strict=True):
            if weight <= 0:
                continue
            local = trainer.accumulate(target=target, **rest)
            local_loss = np.asarray(local[0] if isinstance(local, tuple) else local)
            losses_seen.append(local_loss)
            contribution += float(np.sum(local_loss)) * (weight if mean else 1.0)
            scale = weight / total_weight if mean and total_weight > 0 else 1.0
            for name, gradient in trainer.accumulated_gradients.items():
                self._views[name] += gradient * np.asarray(scale, gradient.dtype)
            trainer.zero_grad()
        totals = np.array([sum(weights), contribution], np.float64)
        with self._waiting("the all-reduce of the loss (every rank's step)"):
            self.comm.Allreduce(self._in_place(), totals)
        global_loss = float(totals[1] / totals[0]) if mean and totals[0] > 0 else float(totals[1])
        if not np.isfinite(global_loss):
            seen = np.concatenate([np.ravel(value) for value in losses_seen]) if losses_seen else None
            self._refuse(global_loss, seen)
            return self._result(global_loss, local)
        started = time.perf_counter()
        with self._waiting("the all-reduce of the gradients"):
            for bucket in self._buckets.values():
                self.comm.Allreduce(self._in_place(), bucket)
        self.reduce_seconds += time.perf_counter() - started
        trainer.apply(lr, gradients=self._views)
        if self.check_every and trainer.global_step % self.check_every == 0:
            self.check_state()
        return self._result(global_loss, local)

    def _weight(self, batch: Sequence[Any], target: Any, named: Mapping[str, Any], where: str) -> float:
        """``loss_weight`` of this rank's shard; 0 for an empty one.

        The shard is checked first, as the Trainer checks it (a target torch refuses fails here by
        name, not in the weight's arithmetic), and the prediction's shape it resolves weighs a
        target that broadcasts.
        """
        rows = _batch_rows(batch, named)
        if rows == 0:
            return 0.0
        feeds = self.trainer._feeds  # the Trainer's own checks of a batch
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the accumulate() that follows gives torch's warning once
            feeds.batch(batch, named, target, where)
        prediction = feeds.prediction.static_shape if feeds.prediction is not None else None
        ports = self.trainer.signature.extra_targets
        extras = {port: named[name] for port, name in ports.items() if name in named}
        return loss_weight(self.trainer.spec.loss, target, rows or 0, extras, prediction)

    def _waiting(self, what: str) -> contextlib.AbstractContextManager[None]:
        """Guards a collective with the watchdog (``collective_timeout``), if there is one."""
        return contextlib.nullcontext() if self._watchdog is None else self._watchdog.guard(what)

    def _in_place(self) -> Any:
        return None if isinstance(self.comm, OneProcess) else _import_mpi().IN_PLACE

    @staticmethod
    def _result(global_loss: float, local: Any) -> Any:
        return (global_loss, *local[1:]) if isinstance(local, tuple) else global_loss

    def _refuse(self, global_loss: float, local_loss: Any) -> None:
        """The non-finite guard on the global loss, decided alike on every rank."""
        trainer = self.trainer
        if trainer.nonfinite == "skip":
            trainer.skipped_steps += 1
            return
        with self._waiting("the exchange of non-finite losses"):
            ranks = self.comm.allgather(local_loss is not None and not bool(np.all(np.isfinite(local_loss))))
        raise NonFiniteStepError(
            f"step(): update {trainer.global_step + 1} refused, not finite: the global batch's loss is {global_loss} "
            f"(the loss of the shard of rank(s) {[rank for rank, bad in enumerate(ranks) if bad]} is not finite). "
            f"The parameters, the optimizer state and global_step ({trainer.global_step}) are unchanged on every "
            "rank. To skip such updates and count them in trainer.skipped_steps instead, pass "
            "Trainer(..., nonfinite='skip')",
            step=trainer.global_step + 1,
            loss=global_loss,
        )

    def evaluate(self, *batch: Any, target: Any = None, weight: float | None = None, **named: Any) -> float:
        """The global batch's loss, this rank passing its shard (a collective; no update)."""
        trainer = self.trainer
        loss = trainer.spec.loss
        weight = self._weight(batch, target, named, "evaluate()") if weight is None else weight
        local = trainer.evaluate(*batch, target=target, outputs=[], **named) if weight > 0 else 0.0
        mean = loss.reduction not in ("sum", "none")
        totals = np.array([weight, float(np.sum(local)) * (weight if mean else 1.0)], np.float64)
        with self._waiting("the all-reduce of the evaluation loss"):
            self.comm.Allreduce(self._in_place(), totals)
        return float(totals[1] / totals[0]) if mean and totals[0] > 0 else float(totals[1])

    # ---- checkpoints ----------------------------------------------------------------------------

    def save(self, path: str | Path) -> Path:
        """Rank 0 writes the Trainer checkpoint atomically (a collective: every rank calls it).

        ``Trainer.save`` writes it atomically (``checkpoint.atomic_write``: flushed and renamed over
        ``path``, so a crash leaves the previous checkpoint loadable, with an existing file's mode or
        the umask's). It is a plain ``Trainer`` checkpoint: any number of ranks, or one ``Trainer``,
        resumes from it.
        """
        path = Path(path)
        error: str | None = None
        if self.rank == 0:
            try:
                self.trainer.save(path)
            except Exception as failure:  # every rank must hear of it, or they would wait for rank 0
                error = f"{type(failure).__name__}: {failure}"
        with self._waiting("rank 0's checkpoint write"):
            error = self.comm.bcast(error, root=0)
        if error is not None:
            raise RuntimeError(f"save(): rank 0 could not write {path}: {error}")
        return path

    def load(self, path: str | Path) -> None:
        """Every rank loads the checkpoint (written with any number of ranks), then the states are compared."""
        self.trainer.load(path)
        self.check_state()

    def export(self, path: str | Path) -> None:
        """Rank 0 writes the trained original model (a collective)."""
        if self.rank == 0:
            self.trainer.export(path)
        with self._waiting("rank 0's export"):
            self.comm.Barrier()


class OneProcess:
    """The communicator of one process without MPI: what ``DistributedTrainer`` needs, doing nothing.

    ``ortlstm fit --accumulate K`` in one process runs the same micro-batch arithmetic as under
    ``mpirun`` (``DistributedTrainer.step_accumulated``) without mpi4py installed.
    """

    def Get_rank(self) -> int:  # mpi4py's names
        """The only rank."""
        return 0

    def Get_size(self) -> int:
        """One process."""
        return 1

    def Allreduce(self, send: Any, receive: Any) -> None:
        """In place: the sum over one process is the value."""

    def Bcast(self, value: Any, root: int = 0) -> None:
        """Rank 0's value is this one."""

    def Barrier(self) -> None:
        """Nothing to wait for."""

    def bcast(self, value: Any, root: int = 0) -> Any:
        """Rank 0's object is this one."""
        return value

    def allgather(self, value: Any) -> list[Any]:
        """Every rank's object: this one."""
        return [value]

    def Abort(self, code: int = 1) -> None:
        """Ends the process at once, as MPI_Abort ends the job."""
        os._exit(code)


def _batch_rows(batch: Sequence[Any], named: Mapping[str, Any]) -> int | None:
    """The leading dimension of the first batch input (None when the batch has no input)."""
    first = batch[0] if batch else next(iter(named.values()), None)
    if first is None:
        return None
    shape = np.shape(first)
    return int(shape[0]) if shape else None


# ---- faults: no rank waits forever for a dead one -----------------------------------------------


class _Watchdog:
    """A daemon thread that aborts every rank when one collective outlasts ``seconds``.

    MPI has no timeout on a collective, and a rank that hangs without dying stalls the others
    forever. ``MPI_Abort`` from this thread (mpi4py initializes MPI with thread support) ends the
    job while the main thread still waits.
    """

    def __init__(self, comm: Any, seconds: float) -> None:
        self._comm = comm
        self._seconds = seconds
        self._condition = threading.Condition()
        self._deadline: float | None = None
        self._what = ""
        threading.Thread(target=self._watch, name="ortlstm-collective-watchdog", daemon=True).start()

    @contextlib.contextmanager
    def guard(self, what: str) -> Iterator[None]:
        with self._condition:
            self._deadline, self._what = time.monotonic() + self._seconds, what
            self._condition.notify()
        try:
            yield
        finally:
            with self._condition:
                self._deadline = None

    def _watch(self) -> None:
        with self._condition:
            while True:
                if self._deadline is None:
                    self._condition.wait()
                    continue
                left = self._deadline - time.monotonic()
                if left > 0:
                    self._condition.wait(left)
                    continue
                sys.stderr.write(
                    f"ortlstm.distributed: rank {self._comm.Get_rank()} of {self._comm.Get_size()} waited "
                    f"{self._seconds:g} s (collective_timeout) in {self._what}: another rank hangs or is far "
                    "slower; aborting every rank (MPI_Abort)\n"
                )
                sys.stderr.flush()
                self._comm.Abort(1)
                return


_INSTALLED: list[Any] = []


def install_abort_on_exception(comm: Any) -> None:
    """An exception that would end this process prints it and calls ``MPI_Abort`` on ``comm``.

    Without it, the other ranks would wait in their next collective for this one forever. MPI
    ends every rank of the job; the launcher's exit status is non-zero. Installed once per
    process (the previous ``sys.excepthook`` runs first).
    """
    if _INSTALLED:
        return
    previous = sys.excepthook
    rank, size = comm.Get_rank(), comm.Get_size()

    def hook(kind: type[BaseException], value: BaseException, trace: TracebackType | None) -> None:
        try:
            previous(kind, value, trace)
        except Exception:
            traceback.print_exception(kind, value, trace)
        sys.stderr.write(
            f"ortlstm.distributed: rank {rank} of {size} stopped with {kind.__name__}; aborting every rank "
            "(MPI_Abort)\n"
        )
        sys.stderr.flush()
        comm.Abort(1)

    sys.excepthook = hook
    _INSTALLED.append(hook)
