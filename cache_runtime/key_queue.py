"""Keys in order, for the eviction policies' queues: the `OrderedDict` operations they use, as a
doubly linked list of native nodes, compiled with them (`compiled.MODULES`).

Why not `collections.OrderedDict`, the policies' queues until 2026-12-07: called from compiled
code, each of its methods went through Python's generic method call (a name lookup, keyword
parsing for `last=False`, a tuple built and freed by every `popitem`), and every insertion or
deletion looked the key up twice (the dict, then the node's index) and allocated or freed a
node. Here a key is looked up once, a move is six pointer writes, and the node an eviction frees
is reused by the next insertion. Replaying the pool on multi1 at 1% (every key sampled: eight
full-size shadows), the queues' operations were about half of the 55,000 instructions per access
(callgrind). What it gained: `docs/robustness.md`, "The queues themselves"; ADR 0017.

Not `cachetools` or `sortedcontainers`: neither has an ordered set that mypyc compiles into
direct calls, and `OrderedDict` was already the well-kept library the policies used.
Run as plain Python (no C compiler: `compiled.build` failed) this is slower than `OrderedDict`;
the policies then run at plain-Python speed anyway.

A node is a garbage-collected object holding its neighbours; a queue unlinks them when it is
freed (`__del__`), so that they go with it, as `OrderedDict`'s did, instead of waiting for the
cycle collector. In steady state an eviction's node is reused and nothing is allocated. Not to
be changed while iterated: a caller that removes keys as it walks takes a list first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, final


@final
class _Node:
    """One key's place; the queue's sentinel is a node too (its own neighbour when empty)."""

    def __init__(self, key: object, value: int) -> None:
        self.key = key
        self.value = value  # what the key carries (MQ's ghosts: the hits it had), else 0
        self.prev: _Node = self
        self.next: _Node = self


# what a dropped queue's nodes point at (`KeyQueue.__del__`): its own neighbour, never freed
_DETACHED = _Node(None, 0)


@final
class KeyQueue:
    """An ordered set of keys, front (next to go) first, each with an int `value`: the
    operations the policies took from `OrderedDict[Key, None]`, named for what they do.
    `add` keeps a present key where it is, as `od[key] = None` does; `push_back` moves it."""

    def __init__(self, keys: Iterable[object] = ()) -> None:
        self._nodes: dict[object, _Node] = {}
        self._root = _Node(None, 0)  # root.next: the front; root.prev: the back
        self._spare: _Node | None = None  # the last node removed, for the next key added
        for key in keys:
            self.add(key)

    def __len__(self) -> int:
        return len(self._nodes)

    def __bool__(self) -> bool:
        return len(self._nodes) > 0

    def __contains__(self, key: object) -> bool:
        return key in self._nodes

    def __iter__(self) -> Iterator[object]:
        root = self._root
        node = root.next
        while node is not root:
            yield node.key
            node = node.next

    def __del__(self) -> None:
        """Unlinks every node, so that reference counting frees them with the queue. Linked,
        they would form one cycle, left to the cycle collector: replaying `robustness.py`'s
        traces one after another, whose rebuilds and replays drop policies by the hundred, the
        collector then ran 2,005 times during Mooncake's `bench cache` instead of 178, and the
        pool's replay there was timed slower than with `OrderedDict`."""
        root = self._root
        node = root.next
        while node is not root:
            after = node.next
            node.prev = node.next = _DETACHED
            node = after
        root.prev = root.next = _DETACHED
        if self._spare is not None:
            self._spare.prev = self._spare.next = _DETACHED

    def __repr__(self) -> str:
        return f"KeyQueue({list(self)!r})"

    def items(self) -> list[tuple[object, int]]:
        """(key, value) pairs, front first."""
        items = []
        root = self._root
        node = root.next
        while node is not root:
            items.append((node.key, node.value))
            node = node.next
        return items

    def __deepcopy__(self, memo: dict[int, Any]) -> KeyQueue:
        """A copy node by node (the keys themselves are immutable): `copy.deepcopy`'s own walk
        would recurse once per node and overflow the stack on a large queue."""
        twin = restore(self.items())
        memo[id(self)] = twin
        return twin

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its (key, value) pairs in order, as a policy holding it was with
        `OrderedDict`."""
        return (restore, (self.items(),))

    def _node(self, key: object, value: int) -> _Node:
        node = self._spare
        if node is None:
            node = _Node(key, value)
            # at the root, not at itself: a node left unused (its key was here) and dropped
            # later would otherwise be a cycle of one, for the collector
            node.prev = node.next = self._root
            return node
        self._spare = None
        node.key = key
        node.value = value
        return node

    def _link_after(self, anchor: _Node, node: _Node) -> None:
        """`node` between `anchor` and its successor: the back is after `root.prev`, the
        front after `root`."""
        after = anchor.next
        node.prev = anchor
        node.next = after
        after.prev = node
        anchor.next = node

    def _unlink(self, node: _Node) -> None:
        before = node.prev
        after = node.next
        before.next = after
        after.prev = before

    def _keep_spare(self, node: _Node) -> None:
        """`node`, in no list and under no key now, kept for the next key added."""
        node.key = None
        self._spare = node

    def _free(self, node: _Node) -> object:
        """Unlinked and forgotten: its key, and the node kept for reuse."""
        self._unlink(node)
        key = node.key
        self._keep_spare(node)
        return key

    def add(self, key: object, value: int = 0) -> None:
        """`key` at the back, with `value`, unless it is here already (then nothing moves)."""
        node = self._node(key, value)
        if self._nodes.setdefault(key, node) is node:
            self._link_after(self._root.prev, node)
        else:
            self._keep_spare(node)

    def push_back(self, key: object) -> None:
        """`key` at the back, whether it was here (moved) or not (added)."""
        node = self._node(key, 0)
        found = self._nodes.setdefault(key, node)
        if found is not node:
            self._keep_spare(node)
            if found is self._root.prev:
                return
            self._unlink(found)
        self._link_after(self._root.prev, found)

    def push_front(self, key: object) -> None:
        """`key` at the front, whether it was here (moved) or not (added)."""
        node = self._node(key, 0)
        found = self._nodes.setdefault(key, node)
        if found is not node:
            self._keep_spare(node)
            self._unlink(found)
        self._link_after(self._root, found)

    def move_to_back(self, key: object) -> None:
        """A present key to the back; KeyError where it is not here."""
        node = self._nodes[key]
        if node is not self._root.prev:
            self._unlink(node)
            self._link_after(self._root.prev, node)

    def move_to_front(self, key: object) -> None:
        """A present key to the front; KeyError where it is not here."""
        node = self._nodes[key]
        self._unlink(node)
        self._link_after(self._root, node)

    def move_all_to_back(self, keys: Iterable[object]) -> None:
        """`move_to_back` for each of `keys` in turn, skipping those not here (removed after a
        reader buffered them)."""
        nodes = self._nodes
        for key in keys:
            node = nodes.get(key)
            if node is not None and node is not self._root.prev:
                self._unlink(node)
                self._link_after(self._root.prev, node)

    def remove(self, key: object) -> None:
        """KeyError where `key` is not here."""
        nodes = self._nodes
        node = nodes[key]
        del nodes[key]
        self._free(node)

    def discard(self, key: object) -> bool:
        """Whether `key` was here (and is not now)."""
        nodes = self._nodes
        node = nodes.get(key)
        if node is None:
            return False
        del nodes[key]
        self._free(node)
        return True

    def pop_value(self, key: object, default: int) -> int:
        """`key`'s value, removing it; `default` where it is not here."""
        nodes = self._nodes
        node = nodes.get(key)
        if node is None:
            return default
        del nodes[key]
        value = node.value
        self._free(node)
        return value

    def front(self) -> object:
        """The key at the front; KeyError on an empty queue."""
        node = self._root.next
        if node is self._root:
            raise KeyError("front of an empty KeyQueue")
        return node.key

    def front_value(self, default: int) -> int:
        """The front key's value; `default` on an empty queue (MQ's demotion reads each
        level's first expiry at every eviction, and this spares it the key's lookup)."""
        node = self._root.next
        return default if node is self._root else node.value

    def pop_front(self) -> object:
        """The key at the front, removed; KeyError on an empty queue."""
        node = self._root.next
        if node is self._root:
            raise KeyError("pop from an empty KeyQueue")
        del self._nodes[node.key]
        return self._free(node)

    def first_evictable(self, keep: Callable[[object], bool]) -> object | None:
        """The first key, from the front, that `keep` lets go; None where it keeps them all.
        The queue's own walk: no iterator object per call (every miss of every shadow asks)."""
        root = self._root
        node = root.next
        while node is not root:
            if not keep(node.key):
                return node.key
            node = node.next
        return None

    def first(self) -> object | None:
        """The key at the front, None on an empty queue."""
        node = self._root.next
        return None if node is self._root else node.key


def restore(items: Iterable[tuple[object, int]]) -> KeyQueue:
    """A queue of (key, value) pairs, front first (`KeyQueue.items`)."""
    queue = KeyQueue()
    for key, value in items:
        queue.add(key, value)
    return queue
