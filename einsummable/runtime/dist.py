"""`torchrun --nnodes N --nproc-per-node G -m einsummable.runtime.dist plan.json`: every rank
runs its program of the plan. The same entry point as `einsummable.backend.runtime.torchrun`
under the name the launch documents; its options are that module's."""
from __future__ import annotations

import sys

from ..backend.runtime.torchrun import main

if __name__ == "__main__":
    sys.exit(main())
