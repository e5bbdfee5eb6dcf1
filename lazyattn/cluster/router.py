"""The Ray Serve request router of the engine deployment: a `RequestRouter` that asks a routing policy
(`cluster/policy.py`) where each request goes.

Serve creates the router in the process of the handle's owner (the ingress), calls `choose_replicas` for each
request with the running replicas, and sends the request to the first replica of the first rank that accepts
it; the other ranks are fallbacks (a replica at its `max_ongoing_requests`). So the ranking is the policy's
whole preference order, one replica per rank.

Loads are the requests this router has in flight per replica (counted at send, released at completion, as
Serve reports them), so the load bound sees what this ingress sent; with several ingress replicas each bounds
its own share. Replica capacities come from the replicas' `record_routing_stats`.

The decisions are kept for the ingress (`routing_log.ROUTING_LOG`, same process) so that a response can say where
it went and why (`x-lazyattn-replica`, `x-lazyattn-route-reason`). Serve ships this module to the handle's process
by value (cloudpickle): state shared with the ingress lives in another module, reached as `routing_log.X`.
"""

from __future__ import annotations

import logging
from typing import Any

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from lazyattn.cluster import routing_log
from lazyattn.cluster.policy import DEFAULT_LOAD_MARGIN, RouteKey, make_policy

logger = logging.getLogger("lazyattn.cluster")


def _job(pending: PendingRequest | None) -> Any:
    """The EngineJob of a request (the first argument of generate/drop_documents); None for other calls."""
    if pending is None or not pending.args:
        return None
    job = pending.args[0]
    return job if hasattr(job, "route") and hasattr(job, "job_id") else None


class DocumentRouter(RequestRouter):
    """Serve calls `initialize_state` with `request_router_kwargs`: `policy` (a name from policy.POLICIES) and
    `load_margin`."""

    def initialize_state(
        self, policy: str = "document-affinity", load_margin: int = DEFAULT_LOAD_MARGIN, **kwargs: Any
    ) -> None:
        self.policy = make_policy(policy, load_margin)
        self.in_flight: dict[str, int] = {}

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        names = {r.replica_id.unique_id for r in replicas}
        for gone in set(self.in_flight) - names:  # a replica that died or was scaled away: its cache is gone
            self.in_flight.pop(gone, None)
            self.policy.forget(gone)
        routing_log.ROUTING_LOG.replicas = tuple(sorted(names))

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self.policy.forget(replica_id.unique_id)
        self.in_flight.pop(replica_id.unique_id, None)
        routing_log.ROUTING_LOG.replicas = tuple(sorted(r.unique_id for r in self.curr_replicas))

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        by_name = {r.replica_id.unique_id: r for r in candidate_replicas}
        if not by_name:
            return []
        job = _job(pending_request)
        if job is not None and job.pin is not None:
            # Pinned (document deletion on every replica): there or nowhere; a dead one is simply absent.
            return [[by_name[job.pin]]] if job.pin in by_name else []
        for name, r in by_name.items():
            kv_tokens = (r.routing_stats or {}).get("kv_tokens")
            if kv_tokens:
                self.policy.set_capacity(name, int(kv_tokens))
        loads = {name: self.in_flight.get(name, 0) for name in by_name}
        key = job.route if job is not None else RouteKey()
        decision = self.policy.choose(key, loads)
        if job is not None:
            # Counted as routed now: requests right behind it (same documents) see them as cached there.
            self.policy.routed(key, decision.replica)
            routing_log.ROUTING_LOG.record(job.job_id, decision)
            logger.debug("job %s -> %s (%s)", job.job_id, decision.replica, decision.reason)
        return [[by_name[name]] for name in decision.ranking]

    def on_send_request(self, replica_id: ReplicaID) -> None:
        super().on_send_request(replica_id)
        name = replica_id.unique_id
        self.in_flight[name] = self.in_flight.get(name, 0) + 1

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        super().on_request_completed(replica_id, internal_request_id)
        name = replica_id.unique_id
        if self.in_flight.get(name, 0) > 0:
            self.in_flight[name] -= 1
