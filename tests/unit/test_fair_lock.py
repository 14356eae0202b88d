"""`FairLock`: one holder at a time, and the turns go round the waiting tenants."""

from __future__ import annotations

import threading

from helpers import wait_until

from models.llm.fair_lock import FairLock


def test_turns_go_round_the_tenants_not_to_whoever_asks_most() -> None:
    lock = FairLock()
    order: list[str] = []
    lock.acquire("holder")
    threads = []

    def take(tenant: str) -> None:
        with lock.hold(tenant):
            order.append(tenant)

    arrivals = ["flood", "flood", "flood", "calm", "flood", "other"]
    for i, tenant in enumerate(arrivals):
        thread = threading.Thread(target=take, args=(tenant,))
        thread.start()
        threads.append(thread)
        wait_until(lambda n=i + 1: sum(len(q) for q in lock._waiting.values()) == n)
    lock.release()
    for thread in threads:
        thread.join(10)
    # one flood turn, then calm and other before flood's next ones
    assert order == ["flood", "calm", "other", "flood", "flood", "flood"]


def test_an_uncontended_lock_is_taken_and_given_back() -> None:
    lock = FairLock()
    with lock.hold("a"):
        assert lock._held
    assert not lock._held
    with lock.hold("b"):
        pass
    assert not lock._held and not lock._waiting
