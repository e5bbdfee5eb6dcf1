"""The highest rate a mode sustains at each TTFT target: exponential growth, then bisection, inside a time budget.

A rate passes a target when the window's p99 TTFT is within it and completions keep up with arrivals
(steady.PointResult.meets). Every measured point answers every target at once; the next rate is chosen for the
target whose bracket is widest: x `growth` while some target has not failed yet, / `growth` while some target has
not passed yet, else the geometric middle of [highest pass, lowest fail] until lowest fail / highest pass <= 1 + tol.
A failure below a rate that passed the same target contradicts a monotone system: one of the two points is noise, so
the failing rate is measured once more, before anything else, and its latest outcome counts (Bracket.suspect).

A target can be out of reach at every rate (prefix and full mode at 100 ms: an idle server already takes longer).
Queueing and batching only delay a first token, so the TTFTs of idle requests (steady.idle_flags: no other request in
flight from their arrival to their first token) are a floor under every rate's. The window requests that found the
server idle are pooled over every point that kept up (an overloaded point's queue pins documents: a cache state that
lower rates do not see). A target that no point passed is unreachable when their share that missed it is clearly
above what a p99 target allows: at least MIN_IDLE_REQUESTS idle requests, and less than a FLOOR_ALPHA chance of that
many misses were the true share ALLOWED_MISS (an exact one-sided binomial test; equivalently, the Clopper-Pearson
lower bound of the share lies above ALLOWED_MISS). Its sustainable rate is then 0, no more points are measured for
it (no halving down to min_rate), and the result keeps the evidence (idle requests, misses, their median TTFT). The
floor assumes the cache state the windows measured, which the warm-up holds steady; a target that only a better hit
ratio at a lower rate would bring in reach is beyond what it sees. This rule replaces an earlier one (the fastest
requests of the two lowest rates missed by about the same time), which decided on two requests and did not fire on
measured prefix-mode points; a low rate's fastest request is an idle one, so the pool covers that case.

The budget planner splits the time left over the points the search may still need, shortening windows (recorded per
point) and stopping the search, unconverged, when too little is left for a point worth measuring. With whole windows
(`--whole-windows`) it never shortens one: a point too big for its share takes the time left, and the search stops
when a whole window no longer fits.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from lazyattn.bench.metrics import percentile
from lazyattn.bench.steady import PhaseConfig, PointResult

MIN_WINDOW_REQUESTS = 10  # a window the budget shortened still waits for this many arrivals (low rates)
MIN_IDLE_REQUESTS = 10  # idle requests before the floor may decide: a few that met a cold cache do not
ALLOWED_MISS = 0.01  # the share of requests a p99 target lets miss it
WHOLE_DRAIN_S = 2.0  # the least drain a whole window is planned with (SearchConfig.whole_windows)
FLOOR_ALPHA = 1e-3  # a false "unreachable" costs a reported rate, a missed one only points: a strict test


@dataclass(frozen=True)
class IdleEvidence:
    """The window requests that found the server idle, pooled over the points that kept up, against one target."""

    requests: int = 0
    missed: int = 0  # TTFT above the target (or never answered)
    ttft_p50_ms: float = math.nan

    @property
    def unreachable(self) -> bool:
        """Clearly more idle misses than the target allows (the module docstring)."""
        enough = self.requests >= MIN_IDLE_REQUESTS
        return enough and binomial_tail(self.missed, self.requests, ALLOWED_MISS) < FLOOR_ALPHA


def binomial_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p), summed in log space (no overflow at thousands of requests)."""
    if k <= 0:
        return 1.0
    logs = [
        math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * math.log(p) + (n - i) * math.log1p(-p)
        for i in range(k, n + 1)
    ]
    return math.fsum(math.exp(v) for v in logs)


def idle_evidence(points: list[PointResult], target_ms: float, keep_up: float) -> IdleEvidence:
    ttfts = sorted(t for p in points if p.keeps_up(keep_up) for t in p.idle_ttfts_ms)
    if not ttfts:
        return IdleEvidence()
    return IdleEvidence(len(ttfts), int(sum(t > target_ms for t in ttfts)), float(percentile(ttfts, 50)))


@dataclass
class Bracket:
    """What the measured points say about one target: the lowest failing rate, and the highest passing rate below
    it (a pass above a failure, noise near the edge, does not move the bracket past that failure). A rate measured
    twice counts as its latest outcome."""

    target_ms: float
    outcomes: list[tuple[float, bool]] = field(default_factory=list)
    idle: IdleEvidence = field(default_factory=IdleEvidence)
    # Nothing passed, and the idle requests missed the target clearly more often than it allows: no rate meets it
    # (prefix and full mode at 100 ms).
    unreachable: bool = False

    def update(self, rate: float, ok: bool) -> None:
        self.outcomes.append((rate, ok))

    def _latest(self) -> dict[float, bool]:
        return dict(self.outcomes)  # a later outcome at a rate replaces the earlier one

    @property
    def failed(self) -> float:
        """inf: nothing failed (yet)."""
        return min((r for r, ok in self._latest().items() if not ok), default=math.inf)

    @property
    def passed(self) -> float:
        """0: nothing passed (yet)."""
        failed = self.failed
        return max((r for r, ok in self._latest().items() if ok and r < failed), default=0.0)

    def suspect(self) -> float | None:
        """The lowest rate that failed in its only measurement while a higher rate passed: in a monotone system one
        of the two is noise (a cold cache, a stall). Measured again, it either passes (the failure was the noise)
        or fails again (the pass above it was, and stays ignored); either way, one outlier no longer moves the
        bracket. None: no such rate."""
        latest = self._latest()
        top_pass = max((r for r, ok in latest.items() if ok), default=0.0)
        once = [r for r, ok in latest.items() if not ok and r < top_pass and sum(q == r for q, _ in self.outcomes) == 1]
        return min(once, default=None)

    def resolved(self, tol: float, min_rate: float, max_rate: float) -> bool:
        if self.unreachable:
            return True
        if self.failed == math.inf:
            return self.passed >= max_rate
        if self.passed == 0.0:
            return self.failed <= min_rate
        return self.failed / self.passed <= 1 + tol


@dataclass(frozen=True)
class SearchConfig:
    targets_ms: tuple[float, ...] = (100.0, 1000.0)
    start: float = 4.0  # first rate, req/s
    growth: float = 2.0
    tol: float = 0.1  # stop when lowest fail / highest pass <= 1 + tol
    min_rate: float = 0.05
    max_rate: float = 1e4
    keep_up: float = 0.95  # achieved / offered rate a pass needs
    max_points: int = 12  # also the planner's estimate of the points still to come
    # Never shorten a window: each point gets the whole window asked for, or the search stops (plan_phases).
    whole_windows: bool = False


def next_rate(brackets: list[Bracket], measured: list[float], cfg: SearchConfig) -> float | None:
    """The next rate to measure, or None when every target's bracket is resolved."""
    open_ = [b for b in brackets if not b.resolved(cfg.tol, cfg.min_rate, cfg.max_rate)]
    if not open_:
        return None
    if not measured:
        return cfg.start
    if any(b.failed == math.inf for b in open_):
        top = max(r for r in measured)
        return min(top * cfg.growth, cfg.max_rate)
    if any(b.passed == 0.0 for b in open_):
        low = min(b.failed for b in open_ if b.passed == 0.0)
        return max(low / cfg.growth, cfg.min_rate)
    widest = max(open_, key=lambda b: b.failed / b.passed)
    return math.sqrt(widest.failed * widest.passed)


@dataclass
class SearchResult:
    mode: str
    points: list[PointResult] = field(default_factory=list)
    brackets: list[Bracket] = field(default_factory=list)
    converged: bool = False
    stopped: str = ""  # why the search ended before converging (budget, max_points)

    def sustainable(self) -> list[dict]:
        """Per target: the highest passing rate, the point measured there (goodput, p99), the bracket."""
        rows = []
        for b in self.brackets:
            at = next((p for p in reversed(self.points) if p.rate == b.passed), None)  # the latest, if re-measured
            rows.append(
                {
                    "mode": self.mode,
                    "target_ms": b.target_ms,
                    "rate": b.passed,
                    "first_failing_rate": None if b.failed == math.inf else b.failed,
                    "goodput": at.goodput(b.target_ms) if at else 0.0,
                    "ttft_p99_ms": at.ttft_ms.get("p99") if at else None,
                    "hit_ratio": at.hit_ratio if at else None,
                    "window_s": at.window_s if at else None,
                    "window_requests": at.window_requests if at else None,
                    "converged": self.converged,
                    "unreachable": b.unreachable,
                    "idle_requests": b.idle.requests,
                    "idle_missed": b.idle.missed,
                    "idle_ttft_p50_ms": b.idle.ttft_p50_ms,
                }
            )
        return rows


def plan_phases(
    phases: PhaseConfig, rate: float, time_left: float, points_left: int, whole_windows: bool = False
) -> tuple[PhaseConfig | None, bool]:
    """The point's phases within its share of the time left: (phases, shortened). The share goes to warm-up (at
    most 30 %), window (at least 50 %) and drain (at most 20 %); a window shorter than asked keeps only
    MIN_WINDOW_REQUESTS of the request count condition, and says so.

    whole_windows: the window is never shortened. When the share is too small for it, the point takes all the time
    left instead: the least warm-up, the whole window, and what remains for the drain (at least WHOLE_DRAIN_S, or the
    drain asked for where that is shorter). No phases (None) when even that does not fit: the search stops there."""
    if time_left == math.inf:
        return phases, False
    share = time_left / max(points_left, 1)
    want = phases.window_length(rate)
    warmup_max = min(phases.warmup_max_s, 0.3 * share)
    drain = min(phases.drain_s, 0.2 * share)
    window = share - warmup_max - drain
    if window >= want:
        return replace(phases, warmup_max_s=warmup_max, drain_s=drain), False
    if whole_windows:
        drain = min(phases.drain_s, time_left - phases.warmup_min_s - want)
        if drain < min(WHOLE_DRAIN_S, phases.drain_s):
            return None, False
        return replace(phases, warmup_max_s=phases.warmup_min_s, drain_s=drain), False
    return (
        replace(
            phases,
            window_s=window,
            window_requests=min(phases.window_requests, MIN_WINDOW_REQUESTS),
            warmup_max_s=warmup_max,
            warmup_min_s=min(phases.warmup_min_s, warmup_max),
            drain_s=drain,
        ),
        True,
    )


def search(
    measure: Callable[[float, PhaseConfig, bool, float], PointResult],
    mode: str,
    phases: PhaseConfig,
    cfg: SearchConfig,
    *,
    deadline: float = math.inf,
    min_point_s: float = 0.0,
    on_point: Callable[[SearchResult], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> SearchResult:
    """Run the search: `measure(rate, phases, shortened, deadline)` serves one point. `deadline` is on `clock`;
    a point is not started with less than `min_point_s` left."""
    result = SearchResult(mode, brackets=[Bracket(t) for t in cfg.targets_ms])
    while True:
        recheck = [r for b in result.brackets if (r := b.suspect()) is not None]
        rate = min(recheck) if recheck else next_rate(result.brackets, [p.rate for p in result.points], cfg)
        if rate is None:
            result.converged = True
            break
        if len(result.points) >= cfg.max_points:
            result.stopped = f"max_points ({cfg.max_points})"
            break
        left = deadline - clock()
        if left < min_point_s:
            result.stopped = f"budget ({left:.1f} s left, a point needs {min_point_s:g} s)"
            break
        # Never plan more points than the time left gives min_point_s each: fewer, longer points.
        points_left = min(_points_left(result, cfg), max(1, int(left // min_point_s)) if min_point_s > 0 else 1 << 30)
        point_phases, shortened = plan_phases(phases, rate, left, points_left, cfg.whole_windows)
        if point_phases is None:
            result.stopped = f"budget ({left:.1f} s left, too little for a whole window at {rate:g} req/s)"
            break
        point = measure(rate, point_phases, shortened, deadline)
        result.points.append(point)
        if point.window_requests == 0:
            result.stopped = "budget (a point ended without a window)"
            break
        for b in result.brackets:
            b.update(rate, point.meets(b.target_ms, cfg.keep_up))
            b.idle = idle_evidence(result.points, b.target_ms, cfg.keep_up)
            b.unreachable = b.passed == 0.0 and b.idle.unreachable
        if on_point is not None:
            on_point(result)
    return result


def _points_left(result: SearchResult, cfg: SearchConfig) -> int:
    """The planner's guess of the points still to come: per open bracket, its bisection steps to the tolerance
    (two more steps and a full bisection while it is open on one side), capped by max_points."""
    full = math.ceil(math.log2(math.log(cfg.growth) / math.log1p(cfg.tol)))
    steps = 0
    for b in result.brackets:
        if b.resolved(cfg.tol, cfg.min_rate, cfg.max_rate):
            continue
        if b.failed == math.inf or b.passed == 0.0:
            steps += 2 + full
        else:
            steps += max(1, math.ceil(math.log2(math.log(b.failed / b.passed) / math.log1p(cfg.tol))))
    return max(1, min(steps, cfg.max_points - len(result.points)))
