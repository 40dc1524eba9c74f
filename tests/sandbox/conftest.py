"""Fixtures of the sandbox threat suite: one sandbox per available backend, a secret canary.

Every probe runs against every backend of ``arborl.sandbox.BACKENDS`` that works here (including
``docker`` and ``wasm``). A backend that does not work is skipped with its probe's reason, or
fails the test when ``ARBORL_REQUIRE_SERVICES=1`` (CI runs ``scripts/setup/*.sh`` first).

A backend class may declare ``guarantees`` (a set of property names such as ``"host_files"``);
probes of a property it does not claim are skipped with that reason, so a documented weakness
(the ``process`` backend shows the host tree) is visible in the report instead of silently
passing. A backend without the attribute is held to every property.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sbutil import LIMITS, require_backend

from arborl.sandbox import BACKENDS, Sandbox


@pytest.fixture(scope="session", params=list(BACKENDS))
def sandbox(request: pytest.FixtureRequest) -> Iterator[Sandbox]:
    """A shared sandbox per backend with the suite's standard :data:`LIMITS`."""
    require_backend(request.param)
    sb = Sandbox(request.param, LIMITS)
    yield sb
    sb.close()


@pytest.fixture(params=list(BACKENDS))
def backend_name(request: pytest.FixtureRequest) -> str:
    """A backend name, for probes that need their own limits or a proxy socket."""
    require_backend(request.param)
    return request.param
