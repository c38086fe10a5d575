"""Shared test settings: a deterministic hypothesis profile sized for a 2-core CI machine, and
torchvision importable on the CPU build of torch (timm imports it; see
`einsummable.models.compat`)."""
from hypothesis import HealthCheck, settings

from einsummable.models.compat import torchvision_importable

settings.register_profile("ci", deadline=None, derandomize=True, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci")
torchvision_importable()
