"""Shared test settings: a deterministic hypothesis profile sized for a 2-core CI machine."""
from hypothesis import HealthCheck, settings

settings.register_profile("ci", deadline=None, derandomize=True, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci")
