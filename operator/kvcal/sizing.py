"""`kvcal plan NAME`: with the noise learned from the baseline's history (status.noise), how a rollout's latency verdict
is likely to end: how soon a regression of the spec's size is rolled back, and how often a healthy canary is promoted,
by canary pods.

A seeded simulation of the rank test's design (its tolerances, per-look boundaries and counters, as
kvcal.core.analysis.ranktest.design makes them) on the effect scale the history measured: each run draws the canary
pods' and the baseline pool's node offsets and own loads from the learned variances, and the requests' noise from
the traffic the history saw split by the first step's weight. It models what the verdict reads, not the histograms'
coarse buckets (benchmarks/bench_analysis.py measures those): read it as an upper bound that sizes a canary, not as a
promise.
"""

import argparse
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from kvcal.core.analysis.fleetnoise import SLOWDOWN, FleetNoise, from_status, learned_z
from kvcal.core.analysis.ranktest import Design, design
from kvcal.core.analysis.verdict import MeasurementPhase, assess_run
from kvcal.models.spec import AnalysisSpec, LatencyCheck, TrafficSpec
from kvcal.models.status import AnalysisStatus, KVCalibrationStatus, Measurement

RUNS = 2000
_EPOCH = datetime(2026, 1, 1, tzinfo=UTC)  # the simulated looks' clock: assess_run only records it
# The share of rollouts the table sizes for: a regression rolled back within k intervals this often.
CAUGHT = 0.90


@dataclass(frozen=True)
class Outlook:
    """One canary size's likely ends, as shares of rollouts."""

    canary_pods: int
    caught_by_look: tuple[float, ...]  # a regression of the spec's size rolled back by each look (cumulative)
    regression_promoted: float
    healthy_promoted: float
    healthy_rolled_back: float

    def intervals_to_catch(self, share: float = CAUGHT) -> int | None:
        """The fewest intervals within which ``share`` of regressions are rolled back; None: not within the step."""
        return next((look for look, caught in enumerate(self.caught_by_look, 1) if caught >= share), None)


def outlook(
    noise: FleetNoise,
    check: LatencyCheck,
    spec: AnalysisSpec,
    *,
    baseline_pods: int,
    canary_pods: int,
    weight: int,
    runs: int = RUNS,
    seed: int = 0,
) -> Outlook:
    """The rank test's likely ends for a canary of ``canary_pods`` pods at ``weight`` percent beside
    ``baseline_pods``: a regression of the design's regressed tolerance (maxRegression + the indifference zone, +15%
    by default) and a healthy canary, each over ``runs`` seeded rollouts."""
    plan = design(check, spec)
    rng = random.Random(seed)
    regressed = [_roll_out(rng, noise, plan, spec, baseline_pods, canary_pods, weight, plan.regressed_tolerance)
                 for _ in range(runs)]  # fmt: skip
    healthy = [_roll_out(rng, noise, plan, spec, baseline_pods, canary_pods, weight, 0.0) for _ in range(runs)]
    caught = tuple(
        sum(1 for outcome, look in regressed if outcome == "Failed" and look <= k) / runs
        for k in range(1, plan.looks + 1)
    )
    return Outlook(
        canary_pods=canary_pods,
        caught_by_look=caught,
        regression_promoted=sum(1 for outcome, _ in regressed if outcome == "Passed") / runs,
        healthy_promoted=sum(1 for outcome, _ in healthy if outcome == "Passed") / runs,
        healthy_rolled_back=sum(1 for outcome, _ in healthy if outcome == "Failed") / runs,
    )


def _roll_out(
    rng: random.Random,
    noise: FleetNoise,
    plan: Design,
    spec: AnalysisSpec,
    baseline_pods: int,
    canary_pods: int,
    weight: int,
    slowdown: float,
) -> tuple[str, int]:
    """One rollout's end (Failed, Passed or Undecided) and the look it came at."""
    slope = noise.slowdown / math.log1p(SLOWDOWN)  # effect per unit of log latency, near no slowdown
    total = noise.requests * baseline_pods
    canary_requests, baseline_requests = total * weight / 100, total * (100 - weight) / 100
    per_interval = (1 / canary_requests + 1 / baseline_requests) / 12  # the rank effect's requests' variance
    weights = 1 / baseline_pods + 1 / canary_pods

    def pool(pods: int, variance: float) -> float:
        return sum(rng.gauss(0.0, math.sqrt(variance)) for _ in range(pods)) / pods

    nodes = pool(canary_pods, noise.node) - pool(baseline_pods, noise.node)
    own_sum = requests_sum = 0.0
    status = AnalysisStatus()
    for look in range(1, plan.looks + 1):
        own_sum += pool(canary_pods, noise.own) - pool(baseline_pods, noise.own)
        requests_sum += rng.gauss(0.0, math.sqrt(per_interval))
        effect = slope * math.log1p(slowdown) + nodes + (own_sum + requests_sum) / look
        deviation = math.sqrt(per_interval / look)
        z_slower, z_healthy, z_within, z_regressed = (
            learned_z(effect - slope * math.log1p(tolerance), deviation, noise, weights, look)[0]
            for tolerance in (plan.rollback_tolerance, plan.healthy_tolerance, plan.promote_tolerance,
                              plan.regressed_tolerance)
        )  # fmt: skip
        rollback, healthy, promote, regressed = plan.critical(look)
        phase: MeasurementPhase = (
            "Failed" if z_slower >= rollback and z_healthy >= healthy
            else "Successful" if z_within <= -promote and z_regressed <= -regressed
            else "Undecided"
        )  # fmt: skip
        # The operator's own counters (failureLimit, successfulIntervals) decide, as in an analysis step.
        verdict = assess_run(spec, status, [Measurement(metric="latency", phase=phase, at=str(look))], _EPOCH)
        status = verdict.status
        if verdict.outcome in ("Failed", "Passed"):
            return verdict.outcome, look
    return "Undecided", plan.looks


def render_plan(obj: dict[str, object], canary_pods: Sequence[int], baseline_pods: int | None = None) -> str:
    """The table `kvcal plan` prints for a KVCalibration as the API serves it."""
    spec = obj.get("spec") or {}
    assert isinstance(spec, dict)
    analysis = AnalysisSpec.model_validate(spec.get("analysis") or {})
    traffic = TrafficSpec.model_validate((spec.get("serving") or {}).get("traffic") or {})
    status = KVCalibrationStatus.model_validate(obj.get("status") or {})
    learned = from_status(status.noise)
    lines = []
    for check in analysis.latency:
        if check.test != "rank":
            continue
        noise = learned.get(check.metric)
        said = next((each for each in status.noise if each.metric == check.metric), None)
        if noise is None or noise.requests <= 0 or noise.slowdown <= 0:
            why = said.message if said and said.message else "not learned yet (status.noise)"
            lines.append(f"{check.metric}: no learned noise: {why}")
            continue
        pods = baseline_pods or noise.pods
        plan = design(check, analysis)
        lines.append(
            f"{check.metric}: {noise.describe()}; {noise.requests:,.0f} requests per pod and interval; "
            f"{pods} baseline pods, first step {traffic.steps[0]}%"
        )
        lines.append(
            f"  {'canary pods':>11}  {'+' + format(plan.regressed_tolerance * 100, 'g') + '% rolled back <=3':>22}  "
            f"{'<=' + str(plan.looks):>5}  {'90% by':>8}  {'regr. promoted':>14}  {'healthy promoted':>16}  "
            f"{'healthy rolled back':>19}"
        )
        for size in canary_pods:
            seen = outlook(noise, check, analysis, baseline_pods=pods, canary_pods=size, weight=traffic.steps[0])
            needed = seen.intervals_to_catch()
            lines.append(
                f"  {size:>11}  {seen.caught_by_look[min(2, plan.looks - 1)]:>22.0%}  {seen.caught_by_look[-1]:>5.0%}  "
                f"{f'{needed} ivl' if needed else 'not':>8}  {seen.regression_promoted:>14.1%}  "
                f"{seen.healthy_promoted:>16.0%}  {seen.healthy_rolled_back:>19.1%}"
            )
    return "\n".join(lines)


def plan_command(args: argparse.Namespace) -> int:
    from kvcal.ctl import _fetch  # the Kubernetes client only for this command

    fetched = _fetch(args)
    if fetched is None:
        return 1
    sizes = [int(each) for each in args.canary_pods.split(",")]
    print(render_plan(fetched[2], sizes, args.baseline_pods))
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = sub.add_parser("plan", help=__doc__.splitlines()[0], description=__doc__)
    parser.add_argument("name", metavar="NAME", help="the KVCalibration")
    parser.add_argument("-n", "--namespace", help="namespace (default: the kubeconfig context's, else 'default')")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
    parser.add_argument("--canary-pods", default="1,2,4", help="canary sizes to compare (default 1,2,4)")
    parser.add_argument("--baseline-pods", type=int, help="baseline pods (default: the history's)")
    parser.set_defaults(func=plan_command)
