"""Shared test settings: a deterministic hypothesis profile sized for a 2-core CI machine,
torchvision importable on the CPU build of torch (timm imports it; see
`einsummable.models.compat`), and the `pools` fixture: the live pools of gloo worker ranks,
one per (backend, world size) for the whole session (starting four ranks takes seconds),
closed at its end; a test that stops or kills a rank uses its own `Pools`."""
import pytest
from hypothesis import HealthCheck, settings

from einsummable.backend.runtime.pool import Pools

from einsummable.models.compat import torchvision_importable

settings.register_profile("ci", deadline=None, derandomize=True, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci")
torchvision_importable()


@pytest.fixture(scope="session")
def pools():
    p = Pools()
    yield p
    p.close()
