"""A rollout function that never returns (slime's `slime.rollout.sleep_rollout.sleep`).

    --rollout-function-path slime.rollout.sleep_rollout.sleep

slime's profiling guide uses it to keep the rollout side idle while something else is measured (the
engines stay up, nothing is generated and no step is trained). It blocks its caller for good and logs
once an hour that it is still sleeping; stop the run to end it.
"""

from __future__ import annotations

import argparse
import logging
import time
from typing import Any

__all__ = ["sleep"]

logger = logging.getLogger(__name__)

_HOUR_S = 3600.0


def sleep(args: argparse.Namespace, rollout_id: int, data_source: Any, evaluation: bool = False) -> None:
    """Block forever, logging the hours slept."""
    hours = 0
    while True:
        time.sleep(_HOUR_S)
        hours += 1
        logger.info("sleep_rollout: step %d has slept %d hour(s)", rollout_id, hours)
