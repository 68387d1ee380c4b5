"""SGLang's radix cache (0.5.23), as the `sglang` policy keeps it with the cache on: a tree of token runs.

Mirrors mem_cache/unified_cache/unified_tree_core.py (UC), the Python tree core of the production
`UnifiedRadixCache`, and mem_cache/radix_cache.py (RC) where UC keeps RC's rules. The production default is the
Rust core (`SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND`, environ.py:741), whose source the wheel does not ship; the
sglang target runs it, and the model agrees with it in lockstep (docs/conformance.md):
  UC match_prefix: walk from the root by each child's first page, split the node the key ends inside, then stamp
      the path (`_match_post_processor`);
  UC insert (`_insert_walk_step`): the same walk touching each node, then a new leaf for what is left;
  RC inc_lock_ref / dec_lock_ref (582-616): a lock counts on every node from a request's last node to the root;
      a node moves between the evictable and the protected size when its count leaves or reaches 0;
  RC evict (552): pop the least recently used unlocked leaf, free its pages, push its parent once that is an
      unlocked leaf, until enough tokens are freed (LRU: evict_policy.py:16, the stamp).
Time is UC's logical clock (components/base.py `get_and_increase_time_counter`), which ticks once per stamp; the
model ticks in the order the engine reads it, so the LRU order is the engine's. Stamps are kept as their ranks
(`canonical`): only their order decides anything.

Token identity: the model has no token ids. Position p of request q's context is its group's token p while p is
inside the shared prefix (min(prefix_len, prompt)), else a token of q alone (its own prompt tokens and its
outputs). A node is a run [start, end) of positions of the request that inserted it (`owner`), so two nodes' keys
never need storing: position p of the owner and of q hold one token iff q is the owner or both are inside one
group's shared prefix there. The sglang target submits token ids with exactly this identity
(targets/sglang.py `sglang_prompt_tokens`).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

from ..policy import replace
from ..state import Request

ROOT = 0


@dataclasses.dataclass(frozen=True)
class Node:
    nid: int
    parent: int
    owner: int          # the request whose positions [start, end) this node's key holds
    start: int
    end: int
    lock: int = 0       # lock_ref
    stamp: int = 0      # last_access_time, on the logical clock

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclasses.dataclass(frozen=True)
class Tree:
    nodes: tuple[Node, ...] = ()   # every node but the root, in creation order
    clock: int = 0
    next_nid: int = 1

    # -- sizes (RC evictable_size / protected_size) -------------------------------------------------
    @property
    def evictable(self) -> int:
        return sum(n.size for n in self.nodes if n.lock == 0)

    @property
    def protected(self) -> int:
        return sum(n.size for n in self.nodes if n.lock > 0)

    def node(self, nid: int) -> Node:
        return next(n for n in self.nodes if n.nid == nid)


Same = Callable[[int, int, int], int]
"""same(owner, q, start) -> how many positions from `start` on hold one token in `owner`'s and `q`'s contexts
(unbounded: the caller clips it to the node and the key)."""


def same_tokens(requests: Callable[[int], Request], doomed: Callable[[Request], bool]) -> Same:
    """Token identity (see the module's docstring). A request refused at arrival for its length has the one-token
    prompt [0] (SB set_finish_with_abort), the same token for all of them."""
    def shared(r: Request) -> int:
        return min(r.prefix_len, r.prompt) if r.prefix_group >= 0 else 0

    def same(owner: int, q: int, start: int) -> int:
        if owner == q:
            return 1 << 60
        a, b = requests(owner), requests(q)
        if doomed(a) or doomed(b):
            return 1 if doomed(a) and doomed(b) and start == 0 else 0
        if a.prefix_group < 0 or a.prefix_group != b.prefix_group:
            return 0
        return max(0, min(shared(a), shared(b)) - start)
    return same


class Walker:
    """One call on the tree (a match or an insert), mutable scratch over the frozen `Tree`."""

    def __init__(self, tree: Tree, same: Same, page: int):
        self.nodes = {n.nid: n for n in tree.nodes}
        self.order = [n.nid for n in tree.nodes]
        self.clock, self.next_nid, self.same, self.page = tree.clock, tree.next_nid, same, page

    def tick(self) -> int:
        self.clock += 1
        return self.clock

    def tree(self) -> Tree:
        return canonical(Tree(tuple(self.nodes[i] for i in self.order), self.clock, self.next_nid))

    def set(self, n: Node) -> Node:
        self.nodes[n.nid] = n
        return n

    def new(self, **fields) -> Node:
        n = Node(nid=self.next_nid, stamp=self.tick(), **fields)
        self.next_nid += 1
        self.nodes[n.nid] = n
        self.order.append(n.nid)
        return n

    def child_for(self, parent: int, q: int, pos: int) -> Optional[Node]:
        """The child whose first page is q's page at `pos` (RadixKey.child_key)."""
        for nid in self.order:
            n = self.nodes[nid]
            if n.parent == parent and self.same(n.owner, q, pos) >= self.page:
                return n
        return None

    def matched(self, n: Node, q: int, pos: int, length: int) -> int:
        """RadixKey.match with page_size: whole pages only."""
        raw = min(self.same(n.owner, q, pos), n.end - pos, length - pos)
        return raw // self.page * self.page

    def split(self, n: Node, at: int) -> Node:
        """RC _split_node: a new upper node [start, at) takes n's place, its lock and its parent; n keeps the
        rest (the caller stamps it after the new node, as UC _split_node does)."""
        upper = self.new(parent=n.parent, owner=n.owner, start=n.start, end=at, lock=n.lock)
        self.set(replace(n, parent=upper.nid, start=at))
        return upper

    def walk(self, q: int, length: int, touch: bool) -> tuple[int, int, list[int]]:
        """Follow q's key (positions [0, length), page-aligned by the caller) as far as the tree holds it,
        splitting the node it ends inside (UC _split_node: the upper part is a new node, stamped at its creation,
        then the lower part is stamped). An insert touches each node it walks before splitting it (UC
        _insert_walk_step: `_touch_node`); a match stamps nothing on the way. Returns (matched tokens, last
        node, the path's nodes from the top)."""
        node, pos, path = ROOT, 0, []
        while pos < length:
            child = self.child_for(node, q, pos)
            if child is None:
                break
            if touch:
                child = self.set(replace(child, stamp=self.tick()))
            got = self.matched(child, q, pos, length)
            if child.start + got < child.end:
                upper = self.split(child, child.start + got)
                self.set(replace(self.nodes[child.nid], stamp=self.tick()))
                node, pos = upper.nid, pos + got
                path.append(node)
                break
            node, pos = child.nid, pos + got
            path.append(node)
        return pos, node, path


def match_prefix(tree: Tree, same: Same, page: int, q: int, length: int) -> tuple[Tree, int, int]:
    """UC match_prefix on q's first `length` positions (page-aligned down): (tree, matched tokens, last node).
    After the walk the path is stamped with one fresh time, each ancestor a hair older (UC _match_post_processor:
    `cur_time -= 0.00001`), so top to bottom in increasing order."""
    length = length // page * page
    if length == 0:
        return tree, 0, ROOT
    w = Walker(tree, same, page)
    matched, last, path = w.walk(q, length, touch=False)
    w.tick()                                   # the root's stamp
    for nid in path:
        w.set(replace(w.nodes[nid], stamp=w.tick()))
    return w.tree(), matched, last


def insert(tree: Tree, same: Same, page: int, q: int, length: int) -> tuple[Tree, int, int]:
    """UC insert of q's first `length` positions (page-aligned down): (tree, tokens already held, last node).
    The root is touched first; a new leaf (stamped at its creation) takes what is left, unlocked."""
    length = length // page * page
    w = Walker(tree, same, page)
    w.tick()                                   # UC insert: `_touch_node(self.root_node)`
    held, last, _ = w.walk(q, length, touch=True)
    if held < length:
        last = w.new(parent=last, owner=q, start=held, end=length).nid
    return w.tree(), held, last


def canonical(tree: Tree) -> Tree:
    """Stamps renumbered 1..n in their order, the clock at n: only their order decides an eviction, and a new
    stamp is above them all either way. Two trees that evict alike are then equal, so a stalled engine whose
    passes only re-stamp (or tick the clock on an empty tree) repeats its state, and a run can see the cycle."""
    rank = {n.nid: k for k, n in enumerate(sorted(tree.nodes, key=lambda n: n.stamp), start=1)}
    return replace(tree, nodes=tuple(replace(n, stamp=rank[n.nid]) for n in tree.nodes), clock=len(rank))


def lock(tree: Tree, nid: int, delta: int) -> Tree:
    """RC inc_lock_ref (+1) / dec_lock_ref (-1) on the path from `nid` to the root."""
    nodes = {n.nid: n for n in tree.nodes}
    while nid != ROOT:
        n = nodes[nid]
        nodes[nid] = replace(n, lock=n.lock + delta)
        nid = n.parent
    return replace(tree, nodes=tuple(nodes[n.nid] for n in tree.nodes))


def evict(tree: Tree, tokens: int) -> tuple[Tree, int]:
    """RC evict: least recently stamped unlocked leaves first, a parent joining once it is an unlocked leaf,
    until `tokens` are freed. Returns (tree, tokens freed)."""
    nodes = {n.nid: n for n in tree.nodes}

    def leaf(n: Node) -> bool:
        return n.lock == 0 and not any(c.parent == n.nid for c in nodes.values())

    freed = 0
    while freed < tokens:
        leaves = [n for n in nodes.values() if leaf(n)]
        if not leaves:
            break
        victim = min(leaves, key=lambda n: n.stamp)
        del nodes[victim.nid]
        freed += victim.size
    return canonical(replace(tree, nodes=tuple(n for n in tree.nodes if n.nid in nodes))), freed
