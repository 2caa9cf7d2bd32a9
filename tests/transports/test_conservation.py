"""No message lost or duplicated by a cancellation or a timeout, in every in-process
environment: randomized programs (hypothesis) that cancel and time out sends and recvs at
random points keep the conservation invariant (see ``conservation.py``).

The suite runs a fixed, bounded sample; ``make test-stress`` runs many more examples.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings

import asynccomm as ac

from .conservation import Plan, plans, program
from .contract import bounded
from .environments import PROPERTY_ENVIRONMENTS

#: Seconds one example may take before it fails as hung (a lost message can hang a rank).
LIMIT = 10.0
EXAMPLES = int(os.environ.get("ASYNCCOMM_STRESS_EXAMPLES", "25"))

conserving = settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
                      suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("env", list(PROPERTY_ENVIRONMENTS))
@conserving
@given(plan=plans())
def test_no_message_is_lost_or_duplicated_by_cancellations(env: str, plan: Plan) -> None:
    got = ac.run(bounded(program(plan), LIMIT), world_size=2, **PROPERTY_ENVIRONMENTS[env])
    assert got[0] == got[1]  # what rank 0 sent successfully is what rank 1 received
