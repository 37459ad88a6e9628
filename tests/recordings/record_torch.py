"""Records PyTorch optimizer trajectories and loss values/gradients for the torch-free parity tests.

Run with the training environment, which has torch:

    .venvs/train/bin/python tests/recordings/record_torch.py

It rewrites ``optimizers.npz`` and ``losses.npz`` next to this file (``--only losses`` writes
one). Each holds a ``configs`` entry (JSON: every case's torch arguments, which the tests turn
into ortlstm's builders) and the arrays, keyed ``<case>/<dtype>/...``. Everything is seeded, but
torch's results differ in the last bit between machines and runs (rerun here, the unchanged
script moved 17 float64 loss values and 320 gradient elements of the recording), so a case
already recorded keeps its recorded values: adding a case changes no other (``--rerecord``
recomputes them all). ``tests/test_optimizers.py``, ``tests/test_losses.py`` and
``tests/test_loss_gradients.py`` read them without torch.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

HERE = pathlib.Path(__file__).resolve().parent
SEED = 20240612
STEPS = 10
PARAM_SHAPES = ((3, 4), (5,), (2, 3, 2))
"""Small shapes: torch runs its scalar loops on them (fewer elements than two SIMD vectors)."""
WIDE_SHAPE = (4, 9)
"""Added in the cases marked ``wide``: 36 elements, so torch's vectorized (FMA) loops run too."""
DTYPES = {"float32": torch.float32, "float64": torch.float64}


def lr_factor(step_index: int) -> float:
    """The schedule, not monotonic: step k (0-based) uses the base lr times this factor."""
    return 0.55 + 0.45 * math.cos(1.7 * step_index)


# ---- optimizers --------------------------------------------------------------------------------

SGD_LR = 0.05
ADAM_LR = 0.01
RMSPROP_LR = 0.01
ADAGRAD_LR = 0.05
NADAM_LR = 0.01
CLIP2 = {"max_norm": 3.5, "norm_type": 2.0}
CLIPINF = {"max_norm": 1.5, "norm_type": "inf"}

OPTIMIZER_CASES: list[dict[str, Any]] = [
    {"name": "sgd_plain", "optimizer": "SGD", "kwargs": {"lr": SGD_LR}},
    {"name": "sgd_momentum", "optimizer": "SGD", "kwargs": {"lr": SGD_LR, "momentum": 0.9}},
    {"name": "sgd_dampening", "optimizer": "SGD", "kwargs": {"lr": SGD_LR, "momentum": 0.9, "dampening": 0.5}},
    {
        "name": "sgd_nesterov",
        "optimizer": "SGD",
        "kwargs": {"lr": SGD_LR, "momentum": 0.9, "nesterov": True},
        "wide": True,
    },
    {"name": "sgd_weight_decay", "optimizer": "SGD", "kwargs": {"lr": SGD_LR, "weight_decay": 0.05}},
    {
        "name": "sgd_momentum_weight_decay_maximize",
        "optimizer": "SGD",
        "kwargs": {"lr": SGD_LR, "momentum": 0.8, "weight_decay": 0.05, "maximize": True},
        "wide": True,
    },
    {"name": "sgd_clip2", "optimizer": "SGD", "kwargs": {"lr": SGD_LR, "momentum": 0.9}, "clip": CLIP2},
    {"name": "sgd_clipinf", "optimizer": "SGD", "kwargs": {"lr": SGD_LR}, "clip": {**CLIPINF, "max_norm": 2.3}},
    {
        "name": "sgd_groups",
        "optimizer": "SGD",
        "kwargs": {"lr": SGD_LR, "momentum": 0.9, "weight_decay": 0.05},
        "groups": [{"params": [0, 2], "weight_decay": 0.0}, {"params": [1], "lr_scale": 0.3, "nesterov": True}],
    },
    {"name": "adam_default", "optimizer": "Adam", "kwargs": {"lr": ADAM_LR}},
    {"name": "adam_weight_decay", "optimizer": "Adam", "kwargs": {"lr": ADAM_LR, "weight_decay": 0.1}},
    {"name": "adam_amsgrad", "optimizer": "Adam", "kwargs": {"lr": ADAM_LR, "amsgrad": True}},
    {
        "name": "adam_amsgrad_weight_decay_maximize",
        "optimizer": "Adam",
        "kwargs": {"lr": ADAM_LR, "amsgrad": True, "weight_decay": 0.1, "maximize": True},
        "wide": True,
    },
    {"name": "adam_betas_eps", "optimizer": "Adam", "kwargs": {"lr": ADAM_LR, "betas": [0.5, 0.99], "eps": 1e-3}},
    {"name": "adam_clip2", "optimizer": "Adam", "kwargs": {"lr": ADAM_LR}, "clip": {**CLIP2, "max_norm": 4.965}},
    {
        "name": "adam_clipinf",
        "optimizer": "Adam",
        "kwargs": {"lr": ADAM_LR, "amsgrad": True},
        "clip": {**CLIPINF, "max_norm": 2.285},
    },
    {
        "name": "adam_groups",
        "optimizer": "Adam",
        "kwargs": {"lr": ADAM_LR, "weight_decay": 0.1},
        "groups": [{"params": [0, 2], "weight_decay": 0.0}, {"params": [1, 3], "lr_scale": 0.3, "amsgrad": True}],
        "wide": True,
    },
    {"name": "adamw_default", "optimizer": "AdamW", "kwargs": {"lr": ADAM_LR}},
    {
        "name": "adamw_weight_decay_amsgrad",
        "optimizer": "AdamW",
        "kwargs": {"lr": ADAM_LR, "weight_decay": 0.3, "amsgrad": True},
        "wide": True,
    },
    {"name": "adamw_maximize", "optimizer": "AdamW", "kwargs": {"lr": ADAM_LR, "maximize": True}},
    {
        "name": "adamw_clip2",
        "optimizer": "AdamW",
        "kwargs": {"lr": ADAM_LR, "weight_decay": 0.1},
        "clip": {**CLIP2, "max_norm": 5.1},
        "wide": True,
    },
    {"name": "adamw_clipinf", "optimizer": "AdamW", "kwargs": {"lr": ADAM_LR}, "clip": CLIPINF},
    {
        "name": "adamw_groups_clip2",
        "optimizer": "AdamW",
        "kwargs": {"lr": ADAM_LR, "weight_decay": 0.1},
        "groups": [{"params": [0, 2], "weight_decay": 0.0}, {"params": [1], "lr_scale": 0.3}],
        "clip": {**CLIP2, "max_norm": 4.965},
    },
    {"name": "rmsprop_default", "optimizer": "RMSprop", "kwargs": {"lr": RMSPROP_LR}},
    {
        "name": "rmsprop_momentum_weight_decay",
        "optimizer": "RMSprop",
        "kwargs": {"lr": RMSPROP_LR, "momentum": 0.9, "weight_decay": 0.05},
        "wide": True,
    },
    {
        "name": "rmsprop_alpha_eps_maximize",
        "optimizer": "RMSprop",
        "kwargs": {"lr": RMSPROP_LR, "alpha": 0.3, "eps": 1e-3, "maximize": True},
        "wide": True,
    },
    {
        "name": "rmsprop_groups_clip2",
        "optimizer": "RMSprop",
        "kwargs": {"lr": RMSPROP_LR, "momentum": 0.5},
        "groups": [{"params": [0, 2], "momentum": 0.0}, {"params": [1], "lr_scale": 0.3, "weight_decay": 0.1}],
        "clip": CLIP2,
    },
    {"name": "adagrad_default", "optimizer": "Adagrad", "kwargs": {"lr": ADAGRAD_LR}},
    {
        "name": "adagrad_lr_decay_initial_accumulator_weight_decay",
        "optimizer": "Adagrad",
        "kwargs": {"lr": ADAGRAD_LR, "lr_decay": 0.1, "initial_accumulator_value": 0.5, "weight_decay": 0.05},
        "wide": True,
    },
    {
        "name": "adagrad_eps_maximize_groups",
        "optimizer": "Adagrad",
        "kwargs": {"lr": ADAGRAD_LR, "eps": 1e-3, "maximize": True},
        "groups": [{"params": [0, 3], "lr_scale": 0.5}, {"params": [1, 2], "weight_decay": 0.02}],
        "wide": True,
    },
    {"name": "nadam_default", "optimizer": "NAdam", "kwargs": {"lr": NADAM_LR}},
    {"name": "nadam_weight_decay", "optimizer": "NAdam", "kwargs": {"lr": NADAM_LR, "weight_decay": 0.1}, "wide": True},
    {
        "name": "nadam_decoupled_weight_decay",
        "optimizer": "NAdam",
        "kwargs": {"lr": NADAM_LR, "weight_decay": 0.1, "decoupled_weight_decay": True},
        "wide": True,
    },
    {
        "name": "nadam_momentum_decay_betas_eps_maximize",
        "optimizer": "NAdam",
        "kwargs": {"lr": NADAM_LR, "momentum_decay": 0.3, "betas": [0.8, 0.99], "eps": 1e-3, "maximize": True},
    },
    {
        # mu_product falls below 2**-54 at step 8: steps 9 and 10 read the last entry of its table.
        "name": "nadam_short_momentum",
        "optimizer": "NAdam",
        "kwargs": {"lr": NADAM_LR, "betas": [0.01, 0.999]},
    },
    {
        "name": "nadam_groups_clip2",
        "optimizer": "NAdam",
        "kwargs": {"lr": NADAM_LR, "weight_decay": 0.05, "decoupled_weight_decay": True},
        "groups": [{"params": [0, 2], "weight_decay": 0.0}, {"params": [1], "lr_scale": 0.3, "betas": [0.5, 0.9]}],
        "clip": CLIP2,
    },
]


def param_shapes(case: dict[str, Any]) -> tuple[tuple[int, ...], ...]:
    """The shapes of a case's parameters."""
    return (*PARAM_SHAPES, WIDE_SHAPE) if case.get("wide") else PARAM_SHAPES


def flat(tensors: list[torch.Tensor]) -> np.ndarray:
    """The tensors' values, flattened and concatenated (the tests split them by PARAM_SHAPES)."""
    return np.concatenate([t.detach().numpy().reshape(-1) for t in tensors])


def objective(params: list[torch.Tensor], coefs: list[tuple[torch.Tensor, ...]]) -> torch.Tensor:
    """A fixed smooth function of the parameters; its gradients feed the optimizers."""
    total = params[0].new_zeros(())
    coupling = params[0].new_zeros(())
    for p, (a, b, c) in zip(params, coefs, strict=False):
        total = total + (a * torch.sin(p)).sum() + 0.02 * (b * p**4).sum()
        coupling = coupling + (c * p).sum()
    return total + 0.02 * coupling**2


def record_optimizer_case(case: dict[str, Any], dtype_name: str, arrays: dict[str, np.ndarray]) -> dict[str, float]:
    dtype = DTYPES[dtype_name]
    rng = np.random.default_rng(SEED)
    shapes = param_shapes(case)
    inits = [rng.standard_normal(shape) for shape in shapes]
    coefs64 = [tuple(rng.standard_normal(shape) for _ in range(3)) for shape in shapes]
    params = [torch.tensor(init, dtype=dtype, requires_grad=True) for init in inits]
    coefs = [tuple(torch.tensor(c, dtype=dtype) for c in triple) for triple in coefs64]
    base_lr = case["kwargs"]["lr"]
    kwargs = dict(case["kwargs"])
    if "betas" in kwargs:
        kwargs["betas"] = tuple(kwargs["betas"])
    groups = case.get("groups")
    if groups:
        torch_groups = []
        for group in groups:
            overrides = {key: value for key, value in group.items() if key not in ("params", "lr_scale")}
            overrides["lr"] = base_lr * group.get("lr_scale", 1.0)
            torch_groups.append({"params": [params[i] for i in group["params"]], **overrides})
        group_base_lrs = [g["lr"] for g in torch_groups]
    else:
        torch_groups = [{"params": params}]
        group_base_lrs = [base_lr]
    optimizer = getattr(torch.optim, case["optimizer"])(torch_groups, foreach=False, **kwargs)
    prefix = f"{case['name']}/{dtype_name}"
    arrays[f"{prefix}/param_init"] = flat(params)
    lrs, norms, clipped = [], [], 0
    grads, values, states = [], [], {}
    for k in range(STEPS):
        factor = lr_factor(k)
        for group, group_lr in zip(optimizer.param_groups, group_base_lrs, strict=False):
            group["lr"] = group_lr * factor
        lrs.append(base_lr * factor)
        optimizer.zero_grad()
        objective(params, coefs).backward()
        grads.append(flat([p.grad for p in params]))
        if "clip" in case:
            clip = case["clip"]
            norm_type = math.inf if clip["norm_type"] == "inf" else clip["norm_type"]
            total = torch.nn.utils.clip_grad_norm_(params, clip["max_norm"], norm_type)
            norms.append(total.item())
            clipped += int(total.item() > clip["max_norm"])
        optimizer.step()
        values.append(flat(params))
        slots = sorted({slot for p in params for slot in optimizer.state[p] if slot != "step"})
        for slot in slots:
            # A slot some parameters lack (amsgrad in one group only) is recorded as NaN there.
            states.setdefault(slot, []).append(
                flat([optimizer.state[p].get(slot, torch.full_like(p, math.nan)) for p in params])
            )
    arrays[f"{prefix}/grad"] = np.stack(grads)
    arrays[f"{prefix}/param"] = np.stack(values)
    for slot, trajectory in states.items():
        arrays[f"{prefix}/state/{slot}"] = np.stack(trajectory)
    arrays[f"{prefix}/lr"] = np.asarray(lrs, dtype=np.float64)
    if norms:
        arrays[f"{prefix}/total_norm"] = np.asarray(norms).astype(dtype_name)
    return {"clipped_steps": clipped}


def recorded_optimizers(path: pathlib.Path) -> tuple[dict[str, dict[str, Any]], dict[str, np.ndarray]]:
    """``(case name -> case, key -> array)`` of a recording of ``STEPS`` steps (({}, {}) if none)."""
    if not path.exists():
        return {}, {}
    stored = np.load(path)
    meta = json.loads(str(stored["configs"]))
    if meta["steps"] != STEPS:
        return {}, {}
    return {case["name"]: case for case in meta["cases"]}, {key: stored[key] for key in stored.files}


def record_optimizers(rerecord: bool = False) -> None:
    """Writes optimizers.npz; a case already recorded (same name and settings) keeps its arrays.

    As for the losses: torch's last bits vary between machines and runs, so adding a case must not
    rewrite the trajectories the tests already pin. ``rerecord`` recomputes every case.
    """
    previous, stored = ({}, {}) if rerecord else recorded_optimizers(HERE / "optimizers.npz")
    arrays: dict[str, np.ndarray] = {}
    cases = [{**case, "param_shapes": param_shapes(case)} for case in OPTIMIZER_CASES]
    kept = 0
    for case in cases:
        if previous.get(case["name"]) == json.loads(json.dumps(case)):
            arrays.update({key: value for key, value in stored.items() if key.startswith(f"{case['name']}/")})
            kept += 1
            continue
        for dtype_name in DTYPES:
            info = record_optimizer_case(case, dtype_name, arrays)
            if "clip" in case:
                print(f"{case['name']} {dtype_name}: clipping active in {info['clipped_steps']}/{STEPS} steps")
    meta = {"steps": STEPS, "cases": cases, "torch": torch.__version__}
    np.savez_compressed(HERE / "optimizers.npz", configs=np.asarray(json.dumps(meta)), **arrays)
    print(f"{len(cases)} optimizer cases ({kept} kept as recorded)")


# ---- losses ------------------------------------------------------------------------------------

CLASS_WEIGHT = [0.5, 2.0, 1.0, 0.25, 3.0]
POS_WEIGHT = [0.5, 2.0, 1.0, 4.0, 0.75]
BCE_WEIGHT = [1.5, 0.5, 1.0, 2.0, 0.25]
REDUCTIONS = ("mean", "sum", "none")


def make_loss_data(rng: np.random.Generator) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """The shared inputs (``data``: input/target arrays in float64) and the loss cases over them."""
    data: dict[str, dict[str, Any]] = {}
    cases: list[dict[str, Any]] = []
    for shape_name, shape in (("2d", (4, 5)), ("3d", (3, 5, 4)), ("1d", (5,))):
        logits = rng.standard_normal(shape) * 2.0
        target_shape = (shape[0], *shape[2:]) if len(shape) > 1 else ()
        valid = rng.integers(0, shape[-1] if len(shape) == 1 else shape[1], size=target_shape)
        ignored_default = np.array(valid, copy=True)
        ignored_custom = np.array(valid, copy=True)
        if len(shape) == 1:
            ignored_default = np.asarray(-100)
            ignored_custom = np.asarray(1)
        else:
            flat_default = ignored_default.reshape(-1)
            flat_default[::3] = -100
            flat_custom = ignored_custom.reshape(-1)
            flat_custom[1::3] = 1
        for variant, target, ignore_index in (
            ("valid", valid, None),
            ("ignored", ignored_default, None),
            ("ignorecustom", ignored_custom, 1),
        ):
            key = f"index_{shape_name}_{variant}"
            data[key] = {"input": logits, "target": np.asarray(target, dtype=np.int64)}
            for kind in ("cross_entropy", "nll_loss"):
                smoothings = (0.0, 0.1) if kind == "cross_entropy" else (0.0,)
                for smoothing in smoothings:
                    for weighted in (False, True):
                        for reduction in REDUCTIONS:
                            kwargs: dict[str, Any] = {"reduction": reduction}
                            if ignore_index is not None:
                                kwargs["ignore_index"] = ignore_index
                            if smoothing:
                                kwargs["label_smoothing"] = smoothing
                            if weighted:
                                kwargs["weight"] = CLASS_WEIGHT
                            name = f"{kind}_{key}_ls{smoothing}_{'w' if weighted else 'nw'}_{reduction}"
                            cases.append({"name": name, "kind": kind, "data": key, "kwargs": kwargs})
        probs = rng.random(shape) + 0.05
        probs = probs / probs.sum(axis=1 if len(shape) > 1 else 0, keepdims=True)
        key = f"prob_{shape_name}"
        data[key] = {"input": logits, "target": probs}
        for smoothing in (0.0, 0.2):
            for weighted in (False, True):
                for reduction in REDUCTIONS:
                    kwargs = {"reduction": reduction}
                    if smoothing:
                        kwargs["label_smoothing"] = smoothing
                    if weighted:
                        kwargs["weight"] = CLASS_WEIGHT
                    name = f"cross_entropy_{key}_ls{smoothing}_{'w' if weighted else 'nw'}_{reduction}"
                    cases.append({"name": name, "kind": "cross_entropy", "data": key, "kwargs": kwargs})
    for shape_name, shape in (("2d", (4, 5)), ("3d", (3, 2, 5))):
        key = f"regression_{shape_name}"
        data[key] = {"input": rng.standard_normal(shape), "target": rng.standard_normal(shape)}
        for kind in ("mse_loss", "l1_loss"):
            for reduction in REDUCTIONS:
                cases.append(
                    {"name": f"{kind}_{key}_{reduction}", "kind": kind, "data": key, "kwargs": {"reduction": reduction}}
                )
        logits = rng.standard_normal(shape) * 3.0
        logits.reshape(-1)[:4] = [30.0, -30.0, 80.0, -80.0]  # the stable form matters here
        key = f"binary_{shape_name}"
        data[key] = {"input": logits, "target": rng.random(shape)}
        for weighted in (False, True):
            for pos_weighted in (False, True):
                for reduction in REDUCTIONS:
                    kwargs = {"reduction": reduction}
                    if weighted:
                        kwargs["weight"] = BCE_WEIGHT
                    if pos_weighted:
                        kwargs["pos_weight"] = POS_WEIGHT
                    tags = f"{'w' if weighted else 'nw'}_{'pw' if pos_weighted else 'npw'}"
                    name = f"binary_cross_entropy_with_logits_{key}_{tags}_{reduction}"
                    cases.append(
                        {"name": name, "kind": "binary_cross_entropy_with_logits", "data": key, "kwargs": kwargs}
                    )
    # binary_cross_entropy reads probabilities. The first entries are saturated (exactly 0 or 1,
    # or nearer to them than torch's backward's 1e-12; 1 - 1e-13 is 1 in float32) against hard
    # and soft labels, so the clamps of the forward (-100) and of the backward (1e-12) are taken.
    for shape_name, shape in (("2d", (4, 5)), ("3d", (3, 2, 5))):
        probs = rng.random(shape)
        probs.reshape(-1)[:8] = [0.0, 1.0, 1e-13, 1.0 - 1e-13, 1e-30, 0.0, 1.0, 0.5]
        target = rng.random(shape)
        target.reshape(-1)[:11] = [0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 0.5, 0.0, 1.0, 1.0]
        key = f"probability_{shape_name}"
        data[key] = {"input": probs, "target": target}
        for weighted in (False, True):
            for reduction in REDUCTIONS:
                kwargs = {"reduction": reduction}
                if weighted:
                    kwargs["weight"] = BCE_WEIGHT
                name = f"binary_cross_entropy_{key}_{'w' if weighted else 'nw'}_{reduction}"
                cases.append({"name": name, "kind": "binary_cross_entropy", "data": key, "kwargs": kwargs})
    # smooth_l1_loss and huber_loss: the first differences are 0 (sign 0), +-1 and +-0.5, exact in
    # float32, so each threshold tried (1, 0.5; 0 for beta, 2 for delta) is met exactly somewhere.
    for shape_name, shape in (("2d", (4, 5)), ("3d", (3, 2, 5))):
        inputs = rng.standard_normal(shape) * 1.5
        target = rng.standard_normal(shape)
        inputs.reshape(-1)[:5] = [0.25, 1.75, -0.5, 2.0, -1.25]
        target.reshape(-1)[:5] = inputs.reshape(-1)[:5] - np.asarray([0.0, 1.0, -1.0, 0.5, -0.5])
        key = f"robust_{shape_name}"
        data[key] = {"input": inputs, "target": target}
        for kind, parameter, values in (
            ("smooth_l1_loss", "beta", (1.0, 0.5, 0.0)),
            ("huber_loss", "delta", (1.0, 0.5, 2.0)),
        ):
            for value in values:
                for reduction in REDUCTIONS:
                    kwargs: dict[str, Any] = {"reduction": reduction}
                    if value != 1.0:
                        kwargs[parameter] = value
                    name = f"{kind}_{key}_{parameter}{value}_{reduction}"
                    cases.append({"name": name, "kind": kind, "data": key, "kwargs": kwargs})
    # kl_div: log-probabilities against probabilities with exact zeros (xlogy's 0), or against
    # log-probabilities (log_target), every reduction and torch's "batchmean".
    for shape_name, shape in (("2d", (4, 5)), ("3d", (3, 5, 4))):
        logits = rng.standard_normal(shape) * 2.0
        log_probs = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
        probs = rng.random(shape)
        probs.reshape(-1)[::3] = 0.0
        probs = probs / probs.sum(axis=1, keepdims=True)
        for log_target in (False, True):
            key = f"divergence_{shape_name}_{'log' if log_target else 'prob'}"
            target = np.log(rng.random(shape) * 0.9 + 0.05) if log_target else probs
            data[key] = {"input": log_probs, "target": target}
            for reduction in (*REDUCTIONS, "batchmean"):
                kwargs = {"reduction": reduction}
                if log_target:
                    kwargs["log_target"] = True
                cases.append({"name": f"kl_div_{key}_{reduction}", "kind": "kl_div", "data": key, "kwargs": kwargs})
    # soft_margin_loss: labels 1 and -1 (and two soft ones, which torch takes as they are); the
    # first inputs are large (exp(-30) is far below float64's rounding of 1, exp(80) within
    # float32's range) and exactly 0 (where the stable form switches branch). Drawn after every
    # case above, so their data is unchanged.
    for shape_name, shape in (("2d", (4, 5)), ("3d", (3, 2, 5))):
        inputs = rng.standard_normal(shape) * 3.0
        inputs.reshape(-1)[:6] = [30.0, -30.0, 80.0, -80.0, 0.0, 0.0]
        target = rng.choice([-1.0, 1.0], size=shape)
        target.reshape(-1)[6:8] = [0.5, -0.25]
        key = f"margin_{shape_name}"
        data[key] = {"input": inputs, "target": target}
        for reduction in REDUCTIONS:
            name = f"soft_margin_loss_{key}_{reduction}"
            cases.append({"name": name, "kind": "soft_margin_loss", "data": key, "kwargs": {"reduction": reduction}})
    return data, cases


def torch_loss(kind: str, inputs: torch.Tensor, target: torch.Tensor, kwargs: dict[str, Any]) -> torch.Tensor:
    kwargs = dict(kwargs)
    for key in ("weight", "pos_weight"):
        if key in kwargs:
            kwargs[key] = torch.tensor(kwargs[key], dtype=inputs.dtype)
    return getattr(F, kind)(inputs, target, **kwargs)


def recorded_losses(path: pathlib.Path) -> dict[tuple[str, str], tuple[dict[str, Any], dict[str, np.ndarray]]]:
    """``(dtype, case name) -> (case, its input, target, loss and grad)`` of a recording ({} if none)."""
    if not path.exists():
        return {}
    stored = np.load(path)
    found = {}
    for case in json.loads(str(stored["configs"]))["cases"]:
        for dtype_name in DTYPES:
            loss_size = int(np.prod(case["loss_shape"]))
            grad_size = stored[f"{case['data']}/{dtype_name}/input"].size
            loss = stored[f"{dtype_name}/loss"][case["loss_offset"] : case["loss_offset"] + loss_size]
            grad = stored[f"{dtype_name}/grad"][case["grad_offset"] : case["grad_offset"] + grad_size]
            values = {"loss": loss, "grad": grad}
            for key in ("input", "target"):
                values[key] = stored[f"{case['data']}/{dtype_name}/{key}"]
            found[dtype_name, case["name"]] = (case, values)
    return found


def record_losses(rerecord: bool = False) -> None:
    """Writes losses.npz; a case already recorded (same loss, data and arguments) keeps its values.

    torch's float results vary in the last bit between machines and runs (its vectorized loops),
    so a rerun to add cases would otherwise rewrite values the tests already pin. ``rerecord``
    recomputes every case.
    """
    rng = np.random.default_rng(SEED + 1)
    data, cases = make_loss_data(rng)
    previous = {} if rerecord else recorded_losses(HERE / "losses.npz")
    arrays: dict[str, np.ndarray] = {}
    kept = 0
    for dtype_name, _dtype in DTYPES.items():
        for key, entry in data.items():
            arrays[f"{key}/{dtype_name}/input"] = entry["input"].astype(dtype_name)
            target = entry["target"]
            arrays[f"{key}/{dtype_name}/target"] = target if target.dtype == np.int64 else target.astype(dtype_name)
        losses, grads = [], []
        for case in cases:
            old_case, old = previous.get((dtype_name, case["name"]), ({}, {}))
            if all(old_case.get(field) == case[field] for field in ("kind", "data", "kwargs")) and all(
                np.array_equal(old[key], arrays[f"{case['data']}/{dtype_name}/{key}"]) for key in ("input", "target")
            ):
                loss_values, grad_values, loss_shape = old["loss"], old["grad"], old_case["loss_shape"]
                kept += 1
            else:
                inputs = torch.tensor(arrays[f"{case['data']}/{dtype_name}/input"], requires_grad=True)
                target = torch.tensor(arrays[f"{case['data']}/{dtype_name}/target"])
                loss = torch_loss(case["kind"], inputs, target, case["kwargs"])
                (grad,) = torch.autograd.grad(loss.sum(), inputs)
                loss_values, grad_values = loss.detach().numpy().reshape(-1), grad.numpy().reshape(-1)
                loss_shape = list(loss.shape)
            # One flat array per dtype (thousands of tiny npz members would triple the file).
            case["loss_offset"] = sum(value.size for value in losses)
            case["loss_shape"] = loss_shape
            case["grad_offset"] = sum(value.size for value in grads)
            losses.append(loss_values)
            grads.append(grad_values)
        arrays[f"{dtype_name}/loss"] = np.concatenate(losses)
        arrays[f"{dtype_name}/grad"] = np.concatenate(grads)
    meta = {"cases": cases, "torch": torch.__version__}
    np.savez_compressed(HERE / "losses.npz", configs=np.asarray(json.dumps(meta)), **arrays)
    print(f"{len(cases)} loss cases ({kept // len(DTYPES)} kept as recorded)")


def main() -> None:
    parser = argparse.ArgumentParser(description="Records torch's optimizer trajectories and losses.")
    parser.add_argument("--only", choices=("optimizers", "losses"), default=None, help="write one file (default: both)")
    parser.add_argument("--rerecord", action="store_true", help="recompute the cases already recorded too")
    args = parser.parse_args()
    torch.manual_seed(SEED)
    if args.only in (None, "optimizers"):
        record_optimizers(args.rerecord)
    if args.only in (None, "losses"):
        record_losses(args.rerecord)


if __name__ == "__main__":
    main()
