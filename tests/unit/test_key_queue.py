"""The policies' queue (`cache_runtime.key_queue.KeyQueue`) against `OrderedDict`, the queue it
replaced: the same order, membership and values after any sequence of the operations, both as
the compiled extension (where `make` built it) and as the plain source the policies fall back on."""

from __future__ import annotations

import copy
import gc
import importlib.util
import inspect
import pickle
import random
import sys
from collections import OrderedDict
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import cache_runtime.key_queue as imported

# from the checkout, not `imported.__file__`: where a compiled policy imported the queue first,
# mypyc names it from its group's library (cache_runtime/cache_runtime/key_queue...so)
SOURCE = Path(__file__).resolve().parents[2] / "cache_runtime" / "key_queue.py"


def _plain() -> ModuleType:
    """The module run from its source, whether or not the extension is built."""
    spec = importlib.util.spec_from_file_location("key_queue_plain", SOURCE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # where pickle looks its `restore` up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(params=["imported", "plain"])
def module(request: pytest.FixtureRequest) -> ModuleType:
    return imported if request.param == "imported" else _plain()


class Reference:
    """What each operation means, written with `OrderedDict` as the policies used it."""

    def __init__(self) -> None:
        self.od: OrderedDict[object, int] = OrderedDict()

    def add(self, key: object, value: int = 0) -> None:
        if key not in self.od:
            self.od[key] = value

    def push_back(self, key: object) -> None:
        self.od.setdefault(key, 0)
        self.od.move_to_end(key)

    def push_front(self, key: object) -> None:
        self.od.setdefault(key, 0)
        self.od.move_to_end(key, last=False)

    def move_to_back(self, key: object) -> None:
        self.od.move_to_end(key)

    def move_to_front(self, key: object) -> None:
        self.od.move_to_end(key, last=False)

    def move_all_to_back(self, keys: list[object]) -> None:
        for key in keys:
            if key in self.od:
                self.od.move_to_end(key)

    def remove(self, key: object) -> None:
        del self.od[key]

    def discard(self, key: object) -> bool:
        return self.od.pop(key, None) is not None

    def pop_value(self, key: object, default: int) -> int:
        return self.od.pop(key, default)

    def pop_front(self) -> object:
        return self.od.popitem(last=False)[0]

    def front(self) -> object:
        return next(iter(self.od))

    def first(self) -> object | None:
        return next(iter(self.od), None)

    def front_value(self, default: int) -> int:
        return next(iter(self.od.values()), default)

    def first_evictable(self, keep: Any) -> object | None:
        return next((key for key in self.od if not keep(key)), None)


def _same(queue: Any, ref: Reference) -> None:
    assert list(queue) == list(ref.od)
    assert queue.items() == list(ref.od.items())
    assert len(queue) == len(ref.od)
    assert bool(queue) == bool(ref.od)


@pytest.mark.parametrize("seed", range(6))
def test_any_sequence_of_operations_leaves_what_ordered_dict_leaves(
    module: ModuleType, seed: int
) -> None:
    """Random operations over a small key space (so that keys come back, absent and present
    alike, and the queue empties): every result, and the order after each step, as the
    reference's. Absent keys raise KeyError where OrderedDict does."""
    rng = random.Random(seed)
    queue, ref = module.KeyQueue(), Reference()
    keys: list[object] = [*range(12), "a", "b", ("t", 1)]
    for _ in range(3000):
        key = rng.choice(keys)
        op = rng.randrange(12)
        if op == 0:
            value = rng.randrange(5)
            queue.add(key, value)
            ref.add(key, value)
        elif op == 1:
            queue.push_back(key)
            ref.push_back(key)
        elif op == 2:
            queue.push_front(key)
            ref.push_front(key)
        elif op in (3, 4, 5):
            name = ("move_to_back", "move_to_front", "remove")[op - 3]
            if key in ref.od:
                getattr(queue, name)(key)
                getattr(ref, name)(key)
            else:
                with pytest.raises(KeyError):
                    getattr(queue, name)(key)
        elif op == 6:
            assert queue.discard(key) == ref.discard(key)
        elif op == 7:
            assert queue.pop_value(key, -1) == ref.pop_value(key, -1)
        elif op == 8:
            if ref.od:
                assert queue.front() == ref.front()
                assert queue.pop_front() == ref.pop_front()
            else:
                for name in ("front", "pop_front"):
                    with pytest.raises(KeyError):
                        getattr(queue, name)()
        elif op == 9:
            batch = [rng.choice(keys) for _ in range(rng.randrange(6))]
            queue.move_all_to_back(batch)
            ref.move_all_to_back(batch)
        elif op == 10:
            kept = set(rng.sample(keys, rng.randrange(len(keys))))
            assert queue.first_evictable(kept.__contains__) == ref.first_evictable(
                kept.__contains__
            )
            assert queue.first() == ref.first()
            assert queue.front_value(-1) == ref.front_value(-1)
        else:
            assert (key in queue) == (key in ref.od)
        _same(queue, ref)


def test_a_copy_and_a_pickle_are_independent_of_the_original(module: ModuleType) -> None:
    """`copy.deepcopy` (a hinted shadow's fork copies its twin's policy) walks the nodes itself:
    its default walk would recurse once per node, past Python's limit on a large queue."""
    queue = module.KeyQueue(range(200_000))
    queue.add("carried", 7)
    twin = copy.deepcopy(queue)
    restored = pickle.loads(pickle.dumps(queue))
    queue.pop_front()
    queue.move_to_back(5)
    for other in (twin, restored):
        assert len(other) == 200_001
        assert other.front() == 0
        assert other.items()[-1] == ("carried", 7)
        other.remove(1)
    assert 1 in queue and queue.front() == 1


def test_a_dropped_queue_frees_its_nodes_without_the_cycle_collector(module: ModuleType) -> None:
    """Linked, the nodes are a cycle: freed only by a collection, which policies dropped by the
    hundred (a pool's rebuilds) then paid for inside timed replays. `__del__` unlinks them."""
    gc.collect()
    gc.disable()
    try:
        before = len(gc.get_objects())
        queue = module.KeyQueue(range(1000))
        queue.pop_front()  # a spare node too
        assert len(gc.get_objects()) >= before + 1000
        del queue
        assert len(gc.get_objects()) < before + 10
    finally:
        gc.enable()


def test_a_key_added_again_keeps_its_place_and_value(module: ModuleType) -> None:
    """`add` is `od[key] = None` for a present key: nothing moves (LIRS and S3-FIFO rely on it);
    `push_back` is the add-or-move the policies wrote as a set and a move."""
    queue = module.KeyQueue()
    for key, value in (("a", 3), ("b", 0), ("c", 0), ("a", 9)):
        queue.add(key, value)
    assert queue.items() == [("a", 3), ("b", 0), ("c", 0)]
    queue.push_back("a")
    queue.push_front("c")
    assert list(queue) == ["c", "b", "a"]


def test_the_queue_is_compiled_where_the_policies_are() -> None:
    """The policies call the queue directly only when both are built (`compiled.MODULES` holds
    it): compiled policies beside a plain queue would run at Python speed. A compiled method is
    a descriptor, not a Python function."""
    from cache_runtime.policies import LRUPolicy

    assert inspect.isfunction(imported.KeyQueue.add) == inspect.isfunction(LRUPolicy.on_access)
    assert SOURCE.is_file()
