"""The radix tree the `sglang` policy keeps with the cache on (model/policies/sglang_radix.py), against what SGLang
0.5.23's tree core does (mem_cache/unified_cache/unified_tree_core.py); the engine itself checks the same rules
in lockstep (tests/test_target_sglang.py, the radix tests and the conformance run)."""

from __future__ import annotations

from model.policies import sglang_radix as radix
from model.state import Request


def requests(*specs):
    """Requests by rid: (prompt, group, prefix_len) each."""
    table = {rid: Request(rid=rid, prompt=p, max_new=4, arrival=0, prefix_group=g, prefix_len=n)
             for rid, (p, g, n) in enumerate(specs)}
    return table.__getitem__


def same(*specs):
    return radix.same_tokens(requests(*specs), lambda r: False)


def test_token_identity_is_the_group_prefix_then_the_request_alone():
    s = same((10, 0, 8), (12, 0, 6), (10, -1, 0), (10, 1, 8))
    assert s(0, 0, 3) > 100            # a request and itself: everything
    assert s(0, 1, 0) == 6             # one group: the shorter shared prefix
    assert s(0, 1, 4) == 2
    assert s(0, 2, 0) == 0 and s(0, 3, 0) == 0   # no group, another group


def test_a_match_ending_inside_a_node_splits_it_and_stamps_the_path_newest_at_the_bottom():
    s = same((10, 0, 8), (12, 0, 8))
    tree, held, last = radix.insert(radix.Tree(), s, 1, 0, 10)
    assert held == 0 and [(n.start, n.end) for n in tree.nodes] == [(0, 10)]
    tree, matched, node = radix.match_prefix(tree, s, 1, 1, 11)
    assert matched == 8
    upper, lower = tree.node(node), tree.node(last)
    assert (upper.start, upper.end, lower.start, lower.end, lower.parent) == (0, 8, 8, 10, upper.nid)
    assert lower.stamp < upper.stamp   # UC _split_node stamps the lower part, then the match stamps the path


def test_pages_match_and_insert_whole_pages_only():
    s = same((10, 0, 7), (12, 0, 7))
    tree, _, _ = radix.insert(radix.Tree(), s, 4, 0, 10)
    assert [(n.start, n.end) for n in tree.nodes] == [(0, 8)]          # 10 tokens: two pages kept
    tree, matched, _ = radix.match_prefix(tree, s, 4, 1, 11)
    assert matched == 4                                                   # 7 shared tokens: one whole page


def test_locks_move_tokens_between_evictable_and_protected():
    s = same((10, 0, 8), (12, 0, 8))
    tree, _, a = radix.insert(radix.Tree(), s, 1, 0, 10)
    tree, _, b = radix.insert(tree, s, 1, 1, 12)
    assert (tree.evictable, tree.protected) == (14, 0)
    tree = radix.lock(tree, b, +1)                   # r1's path: the shared 8 and its own 4
    assert (tree.evictable, tree.protected) == (2, 12)
    tree = radix.lock(radix.lock(tree, a, +1), b, -1)
    assert (tree.evictable, tree.protected) == (4, 10)


def test_eviction_takes_the_least_recently_used_leaf_then_its_parent():
    s = same((10, 0, 8), (12, 0, 8), (6, -1, 0))
    tree, _, _ = radix.insert(radix.Tree(), s, 1, 0, 10)     # [0,10)
    tree, _, _ = radix.insert(tree, s, 1, 1, 12)             # splits at 8: [0,8) -> [8,10), [8,12)
    tree, _, _ = radix.insert(tree, s, 1, 2, 6)              # [0,6) of r2, the newest
    tree, freed = radix.evict(tree, 1)
    assert freed == 2 and {(n.owner, n.start) for n in tree.nodes} == {(0, 0), (1, 8), (2, 0)}
    tree, freed = radix.evict(tree, 5)                       # r1's leaf, then the shared node, now a leaf
    assert freed == 4 + 8 and [(n.owner, n.start) for n in tree.nodes] == [(2, 0)]
    locked = radix.lock(tree, tree.nodes[0].nid, +1)
    assert radix.evict(locked, 10) == (locked, 0)            # a locked node is never evicted
