"""Routing decisions, from the request router to the ingress in the same process (cluster/router.py)."""

from __future__ import annotations

import threading
from collections import OrderedDict

from lazyattn.cluster.policy import Decision

_KEPT_DECISIONS = 4096  # decisions never collected (a request that failed before its ingress read it) age out


class RoutingLog:
    """What the router tells the ingress: decisions by job id, and the replicas it routes to now."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # the router may run on Serve's own event-loop thread
        self._decisions: OrderedDict[str, Decision] = OrderedDict()
        self.replicas: tuple[str, ...] = ()

    def record(self, job_id: str, decision: Decision) -> None:
        with self._lock:
            self._decisions[job_id] = decision
            while len(self._decisions) > _KEPT_DECISIONS:
                self._decisions.popitem(last=False)

    def pop(self, job_id: str) -> Decision | None:
        with self._lock:
            return self._decisions.pop(job_id, None)


ROUTING_LOG = RoutingLog()
