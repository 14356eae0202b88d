"""What the tests of the pool's switch (test_pool_switch.py, test_handover.py) share."""

from __future__ import annotations

from cache_runtime.candidates import Candidate
from cache_runtime.pool import PoolPolicy
from cache_runtime.shadows import Rebuild


class UncheckedPool(PoolPolicy):
    """A pool that makes every switch its selector names. The tests of a switch's mechanics
    (the rebuild in slices, the handover, the ghosts) name the target by hand over histories
    on which the new leader gains nothing, and the check before a switch
    (`PoolPolicy._switch_pays`, tested on its own) would call those switches off."""

    def _switch_pays(self, rebuild: Rebuild, target: Candidate) -> bool:
        return True
