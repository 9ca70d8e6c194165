"""Fitting the composition model: host terms of the engine profile from end-to-end rows.

The host model (sim/pricing.py) adds to every step of a synchronous engine

    host_s = step_overhead_us + per_request_us * scheduled sequences + sampler_us * [step samples]

(microseconds). A row's step log (run.py) records which requests ran in which
step; holding that schedule (and the engine's idle time) fixed, the mean TTFT and
TPOT of its measured requests are AFFINE in these parameters (exact when every
send is a completion event: no frontend delay, a burst start; with a frontend
delay a changed step time can move an arrival into another step, which this
ignores):

    mean TTFT(theta) = mean TTFT(theta0) + sum_k (theta_k - theta0_k) * dTTFT/dtheta_k

with dTTFT/dtheta_k = mean over requests of the sum of term k's feature over the
steps between the request's send and first token (likewise TPOT between first and
last token, divided by osl - 1). `linearize` turns a step log into these
coefficients once; any parameter vector is then priced exactly and instantly.

Fit procedure (`fit`): least squares on log(predicted / measured) of the chosen
metrics (default TPOT: TTFT's error in closed loops is dominated by how arrivals
group into prefill steps, which these terms do not change) over the chosen
parameters, bounded below by 0, starting from the profile's values; the other
parameters keep their profile values. Asynchronous rows do not depend on the
terms (zero coefficients); a parameter no training row depends on is 0.
`leave_one_group_out` fits once per group (model_path) on the other groups' rows and predicts the held-out group, so the
reported held-out error never saw the rows it scores.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kernelsight.predictor.errors import KernelsightError

US = 1e-6
# Parameter -> per-step feature whose coefficient (microseconds) it is; pricing.StepPricer._finish.
TERMS = {
    "step_overhead_us": lambda log: np.ones_like(log.gpu_s),
    "per_request_us": lambda log: log.seqs,
    "sampler_us": lambda log: log.samples,
}
METRICS = ("ttft", "tpot")


@dataclass(frozen=True)
class Linearized:
    """One row's mean TTFT / TPOT (ms) over its measured requests, affine in the host terms.

    An asynchronous row (its steps overlap) has zero coefficients: its host work hides behind the
    GPU, which holds while every step's host time stays below its GPU time (`hidden`)."""

    theta0: dict
    ttft0: float
    tpot0: float
    dttft: dict   # ms per microsecond of each term
    dtpot: dict
    host_features: np.ndarray | None = None  # asynchronous rows: terms x steps (TERMS order), and ...
    gpu_s: np.ndarray | None = None          # ... each step's GPU seconds

    def hidden(self, theta: dict) -> bool:
        """Whether the host terms in `theta` stay hidden behind every step's GPU time (True when
        the row is synchronous: nothing to hide)."""
        if self.host_features is None:
            return True
        coef = np.asarray([theta.get(k, v) for k, v in self.theta0.items()]) * US
        return bool(np.all(coef @ self.host_features <= self.gpu_s))

    def metrics(self, theta: dict) -> tuple[float, float]:
        """(mean TTFT ms, mean TPOT ms) with the host terms in `theta` (others at theta0)."""
        d = {k: theta.get(k, v) - v for k, v in self.theta0.items()}
        return (self.ttft0 + sum(self.dttft[k] * x for k, x in d.items()),
                self.tpot0 + sum(self.dtpot[k] * x for k, x in d.items()))


def measured_requests(log, concurrency: int, warmup_rounds: int) -> np.ndarray:
    """Mask of the requests after the warmup: request ids are the clients' send order."""
    return log.request_id >= warmup_rounds * concurrency


def linearize(log, host, measured: np.ndarray) -> Linearized:
    """Coefficients of one step log (see the module docstring); host: the simulated HostSettings."""
    if not measured.any():
        raise KernelsightError("no measured requests after the warmup rounds")
    theta0 = {name: float(getattr(host, name)) for name in TERMS}
    ttft0, tpot0 = _window_means(log, measured, log.t_end, log.send_offset_s[measured])
    if log.asynchronous:  # scored as it ran: zero coefficients, and the check that the host stays hidden
        zero = dict.fromkeys(TERMS, 0.0)
        features = np.stack([TERMS[name](log) for name in theta0]).astype(np.float64)
        return Linearized(theta0, ttft0 * 1e3, tpot0 * 1e3, zero, dict(zero), features,
                          np.asarray(log.gpu_s, dtype=np.float64))
    dttft, dtpot = {}, {}
    for name, feature in TERMS.items():
        dttft[name], dtpot[name] = _window_means(log, measured, np.cumsum(feature(log) * US), 0.0)
    return Linearized(theta0, ttft0 * 1e3, tpot0 * 1e3, {k: v * 1e3 for k, v in dttft.items()},
                      {k: v * 1e3 for k, v in dtpot.items()})


def _window_means(log, measured: np.ndarray, ends: np.ndarray, offset) -> tuple[float, float]:
    """Mean TTFT and TPOT (s) of the measured requests over per-step cumulative values `ends` (the step
    end times, or a host term's running sum): between each request's send and first token, and its
    first and last token."""
    cum = np.concatenate([[0.0], ends])
    send, first, finish = log.send[measured] + 1, log.first[measured] + 1, log.finish[measured] + 1
    osl = log.output_len[measured]
    ttft = cum[first] - cum[send] - offset
    many = osl > 1
    tpot = (cum[finish[many]] - cum[first[many]]) / (osl[many] - 1)
    return float(ttft.mean()), float(tpot.mean()) if many.any() else float("nan")


def predict(lins: list[Linearized], theta: dict) -> np.ndarray:
    """rows x (TTFT ms, TPOT ms)."""
    return np.asarray([lin.metrics(theta) for lin in lins], dtype=np.float64).reshape(-1, 2)


def fit(lins: list[Linearized], measured: np.ndarray, params, metrics=("tpot",)) -> dict:
    """Least squares on log(predicted / measured) over `params` (>= 0); returns the full theta.

    measured: rows x (TTFT ms, TPOT ms).
    """
    from scipy.optimize import least_squares

    params = list(params)
    unknown = [p for p in params if p not in TERMS]
    if unknown or not params:
        raise KernelsightError(f"fit.params: {unknown or params}: choose from {', '.join(TERMS)}")
    bad = [m for m in metrics if m not in METRICS]
    if bad or not metrics:
        raise KernelsightError(f"fit.metrics: {bad or metrics}: choose from {', '.join(METRICS)}")
    if not lins:
        raise KernelsightError("no rows to fit the composition parameters on")
    cols = [METRICS.index(m) for m in metrics]
    base = dict(lins[0].theta0)
    target = np.log(np.asarray(measured, dtype=np.float64)[:, cols])
    # Affine form of every row and metric in the fitted parameters: value = a + B @ x.
    a = predict(lins, {p: 0.0 for p in params})[:, cols]
    b = np.stack([predict(lins, {**{q: 0.0 for q in params}, p: 1.0})[:, cols] - a for p in params], axis=-1)

    def residual(x):
        value = a + b @ x
        return (np.log(np.maximum(value, 1e-9)) - target).ravel()

    # A parameter no training row depends on (every one asynchronous: host work hidden) is not identified:
    # 0, not the profile's value, which may have been fitted on the rows being held out.
    seen = np.any(b != 0.0, axis=(0, 1))
    if not seen.any():
        return {**base, **{p: 0.0 for p in params}}
    free = [i for i in range(len(params)) if seen[i]]

    def residual_free(x):
        full = np.zeros(len(params))
        full[free] = x
        return residual(full)

    x0 = np.asarray([base[params[i]] for i in free], dtype=np.float64)
    sol = least_squares(residual_free, x0=x0, bounds=(0.0, np.inf), x_scale=np.maximum(x0, 1.0))
    fitted = dict.fromkeys(params, 0.0) | {params[i]: float(v) for i, v in zip(free, sol.x)}
    return {**base, **fitted}


def leave_one_group_out(lins: list[Linearized], measured: np.ndarray, groups: list[str], params,
                        metrics=("tpot",), fold_lins: dict | None = None, train=None) -> tuple[np.ndarray, dict]:
    """Predictions (rows x (TTFT, TPOT) ms) of each row under parameters fitted without its group,
    and the fitted theta per held-out group. Needs at least two groups. fold_lins: per group, the rows'
    linearisations that fold uses instead of `lins` (runs simulated with settings chosen without it);
    train: mask of the rows a fit may learn from (default every row)."""
    groups = np.asarray(groups)
    names = sorted(set(groups.tolist()))
    if len(names) < 2:
        raise KernelsightError(f"leave-one-model-out needs rows of at least two models; got {names}")
    out = np.full((len(lins), 2), np.nan)
    thetas = {}
    for name in names:
        held = groups == name
        fold = lins if fold_lins is None else fold_lins[name]
        learn = ~held if train is None else ~held & np.asarray(train, dtype=bool)
        theta = fit([lin for lin, x in zip(fold, learn) if x], np.asarray(measured)[learn], params, metrics)
        thetas[name] = theta
        out[held] = predict([lin for lin, h in zip(fold, held) if h], theta)
    return out, thetas
