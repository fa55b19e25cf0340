"""The latency percentiles every load test reports, under one set of keys (LoadGen's and the project's own
open-loop and simulated runs alike), so a report's tables read any of them the same way."""
from __future__ import annotations

import numpy as np

PERCENTILE_KEYS = {"p50": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0, "p999": 99.9}


def percentiles_ms(latencies_ms) -> dict[str, float]:
    """Each reported percentile of ``latencies_ms`` (milliseconds), rounded to the nanosecond."""
    return {k: round(float(np.percentile(latencies_ms, q)), 6) for k, q in PERCENTILE_KEYS.items()}
