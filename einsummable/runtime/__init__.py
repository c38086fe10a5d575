"""Launch entry points under the names users type: `torchrun ... -m einsummable.runtime.dist
plan.json` (`dist.py`). The executors themselves live in `einsummable/backend/runtime/`."""
