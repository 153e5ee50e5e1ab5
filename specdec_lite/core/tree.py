"""Token trees: several candidate continuations verified in one target forward (SpecInfer, Miao et al. 2024;
Medusa, Cai et al. 2024; EAGLE-2, Li et al. 2024).

A ``Tree`` (batch 1) has node 0 = the root, the newest emitted token (in the sequence, not yet fed to the
target), and draft nodes 1..n-1, each with a parent of smaller index. The target scores every node in one
forward: node i attends to the context and to its own ancestors only (a 4-D additive attention mask), at
position (root position + depth of i). Then the verifier walks down from the root:

- at node v, with the target's distribution p_v, the children c_1..c_m of v are tried in order by recursive
  rejection sampling (SpecInfer): child c with token x drawn from q_c is accepted with probability
  min(1, r(x) / q_c(x)), r starting at p_v; after a rejection r <- norm((r - q_c)+). A child whose token was
  chosen, not drawn (top-k of a head, a lookup match), has q_c = one-hot(x): it is accepted with probability
  r(x) and rejecting it removes x from r, so trying such children in turn is sampling y ~ p_v and descending
  when y is a child.
- when a child is accepted, descend into it; when all are rejected (or v is a leaf) emit one token from r.

Why exact: at each child, P(emit y here) = min(r(y), q_c(y)) and P(reject) leaves (r - q_c)+, whose sum with
min(r, q_c) is r; by induction over the children the token leaving node v has law p_v, whatever the candidates
were, as long as each candidate was drawn (or chosen) before verification, independently of the target's draws.
Greedy verification descends while the target's argmax is a child.

After verification only the accepted path's cache entries are kept (``compact_indices``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .sampling import at_least_float32, sample
from .verify import EXACT_RULE, Rule


@dataclass
class Tree:
    tokens: torch.Tensor  # (n,) long: node tokens; tokens[0] is the root (the newest emitted token)
    parents: torch.Tensor  # (n,) long: parent node of each node; parents[0] = -1; parents[i] < i
    q: torch.Tensor | None = None  # (n, V): the distribution node i was drawn from (at its parent); None: all chosen
    drawn: torch.Tensor | None = None  # (n,) bool: True where node i was drawn from q[i], False where chosen

    def __post_init__(self):
        n = len(self.tokens)
        if self.parents.shape != (n,):
            raise ValueError("parents must be (n,) with parents[0] = -1 (node 0 is the root)")
        if self.drawn is None:
            self.drawn = torch.zeros(n, dtype=torch.bool)
        # the structure as Python lists, read once (a tree is built on the host): the walks, the mask and the
        # positions run on these, so verifying a tree reads from the device only what the target computed
        device = self.tokens.device
        self.token_list, self.parent_list, drawn = torch.stack(
            [self.tokens, self.parents.to(device), self.drawn.to(device).long()]).tolist()
        self.drawn_list = [bool(d) for d in drawn]
        if self.parent_list[0] != -1:
            raise ValueError("parents must be (n,) with parents[0] = -1 (node 0 is the root)")
        if any(parent >= i for i, parent in enumerate(self.parent_list) if i):
            raise ValueError("every node's parent must come before it (parents[i] < i)")
        if any(self.drawn_list) and self.q is None:
            raise ValueError("nodes marked drawn need the distributions q they were drawn from")
        self.child_lists = [[] for _ in range(n)]
        for i in range(1, n):
            self.child_lists[self.parent_list[i]].append(i)

    @property
    def size(self) -> int:
        return len(self.token_list)

    def children(self, node: int) -> list[int]:
        return list(self.child_lists[node])

    def depth_list(self) -> list[int]:
        """The depth of each node (the root has depth 0), as Python ints."""
        depth = [0] * self.size
        for i in range(1, self.size):
            depth[i] = depth[self.parent_list[i]] + 1
        return depth

    def depths(self) -> torch.Tensor:
        """(n,) depth of each node; the root has depth 0."""
        return torch.tensor(self.depth_list(), dtype=torch.long)

    def ancestors(self) -> torch.Tensor:
        """(n, n) bool: [i, j] is True when node j is node i or one of its ancestors (what node i attends to)."""
        mask = torch.eye(self.size, dtype=torch.bool)
        for i in range(1, self.size):
            mask[i] |= mask[self.parent_list[i]]
        return mask

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root's first child down to ``node`` (empty for the root)."""
        path = []
        while node > 0:
            path.append(node)
            node = self.parent_list[node]
        return path[::-1]

    def child_distribution(self, child: int, V: int, dtype=torch.float64, device=None) -> torch.Tensor:
        """q_c: the distribution child c was drawn from, or the one-hot of its token when it was chosen; on
        ``device`` (the target's p, which a tree built on the CPU meets on a GPU), the tree's own by default."""
        device = device or self.tokens.device
        if self.drawn_list[child]:
            return self.q[child].to(device=device, dtype=dtype)
        row = torch.zeros(V, dtype=dtype, device=device)
        row[self.token_list[child]] = 1.0
        return row


class TreeBuilder:
    """Builds a ``Tree`` node by node; a token already among a parent's children is not added twice (the
    existing node is returned), so branches from several drafters merge into one trie."""

    def __init__(self, root: int):
        self.tokens, self.parents, self.q, self.drawn = [int(root)], [-1], [None], [False]
        self._index = {}  # (parent, token) -> node, for chosen (not drawn) nodes

    def add(self, parent: int, token: int, q: torch.Tensor | None = None) -> int:
        """Add a child of ``parent``: chosen (q None; deduplicated) or drawn from ``q`` (kept even if repeated)."""
        key = (parent, int(token))
        if q is None and key in self._index:
            return self._index[key]
        self.tokens.append(int(token))
        self.parents.append(parent)
        self.q.append(q)
        self.drawn.append(q is not None)
        node = len(self.tokens) - 1
        if q is None:
            self._index[key] = node
        return node

    def copy(self) -> "TreeBuilder":
        """An independent builder with the same nodes (for enumerating the trees a sampler can draw)."""
        out = TreeBuilder(self.tokens[0])
        out.tokens, out.parents, out.q, out.drawn = list(self.tokens), list(self.parents), list(self.q), list(self.drawn)
        out._index = dict(self._index)
        return out

    def add_chain(self, parent: int, tokens) -> list[int]:
        nodes = []
        for token in tokens:
            parent = self.add(parent, int(token))
            nodes.append(parent)
        return nodes

    @property
    def size(self) -> int:
        return len(self.tokens)

    def build(self) -> Tree:
        q = None
        if any(self.drawn):
            V = next(row for row in self.q if row is not None).shape[-1]
            q = torch.stack([row.double() if row is not None else torch.zeros(V, dtype=torch.float64) for row in self.q])
        return Tree(torch.tensor(self.tokens), torch.tensor(self.parents), q, torch.tensor(self.drawn))


def verify_tree(tree: Tree, p: torch.Tensor, generator: torch.Generator | None = None,
                rule: Rule = EXACT_RULE) -> tuple[list[int], int]:
    """Sampling verification of a tree. p: (n, V) the target's distributions at every node.
    Returns (accepted node indices, root to leaf, excluding the root; the next token).

    Every node's competition is computed where p is, before the walk: each child's acceptance probability given
    that its earlier siblings were rejected, what is left of r after all of them, one uniform per child and one
    token drawn from each node's leftover. One transfer brings the acceptances and the tokens to the host, where
    the walk descends into the first accepted child and emits the leftover token of the node where it stops.
    The walk reads each draw only under the condition the sequential rule draws it in (earlier siblings
    rejected), and the draws are independent, so the law is that rule's; the unused draws are discarded."""
    p = at_least_float32(p)
    V = p.shape[-1]
    accept = torch.zeros(tree.size, dtype=p.dtype, device=p.device)  # per child; the root's entry stays 0
    left = []
    for node in range(tree.size):
        r = p[node]  # what the children compete for, and the bonus at a leaf
        for child in tree.child_lists[node]:
            q_c = tree.child_distribution(child, V, r.dtype, r.device)
            x = tree.token_list[child]
            accept[child] = rule.accept(r[x], q_c[x])
            r = rule.residual(r, q_c)  # rejected: the next sibling competes for what is left
        left.append(r)
    u = torch.rand(tree.size, generator=generator, device=p.device, dtype=p.dtype)
    leftover = sample(torch.stack(left), generator)  # (n,): the token each node emits when the walk stops there
    accepted, leftover = torch.stack([(u < accept).long(), leftover]).tolist()  # the one transfer
    path, node = [], 0
    while True:
        child = next((c for c in tree.child_lists[node] if accepted[c]), None)
        if child is None:  # every child rejected, or a leaf: emit from what is left (the bonus token at a leaf)
            return path, leftover[node]
        path.append(child)
        node = child


def verify_tree_greedy(tree: Tree, target_argmax: torch.Tensor) -> tuple[list[int], int]:
    """Greedy verification: the longest path whose every token is the target's argmax at its parent.
    target_argmax: (n,) the target's choice at every node, brought to the host in one transfer."""
    want = target_argmax.tolist()
    path, node = [], 0
    while True:
        hit = [c for c in tree.child_lists[node] if tree.token_list[c] == want[node]]
        if not hit:
            return path, want[node]
        node = hit[0]
        path.append(node)


def tree_outcome_distribution(tree: Tree, p: torch.Tensor, rule: Rule = EXACT_RULE) -> dict:
    """The exact law of ``verify_tree``'s output: {(accepted tokens..., next token): probability}, built from
    the same ``rule`` (for the exact-enumeration tests)."""
    p = p.double()
    V = p.shape[-1]
    out: dict = {}

    def walk(node: int, prefix: tuple, prob: float):
        r = p[node]
        for child in tree.children(node):
            q_c = tree.child_distribution(child, V)
            x = tree.token_list[child]
            a = float(rule.accept(r[x], q_c[x]))
            if a > 0:
                walk(child, prefix + (x,), prob * a)
            prob *= 1 - a
            if prob == 0:
                return
            r = rule.residual(r, q_c)
        for y in r.nonzero().flatten().tolist():
            key = prefix + (y,)
            out[key] = out.get(key, 0.0) + prob * float(r[y])

    walk(0, (), 1.0)
    return out


def attention_mask(tree: Tree, cached: int, prefix: int, dtype: torch.dtype, device) -> torch.Tensor:
    """The 4-D additive mask (1, 1, prefix + n - 1, cached + prefix + n - 1) of one tree forward.

    The forward feeds ``prefix`` tokens the cache has not seen (their last one is the root; in the first round
    the whole prompt) and then the draft nodes 1..n-1, after ``cached`` tokens already in the cache. A prefix token
    sees the cache and the prefix causally; a node sees the cache, the whole prefix and its own ancestors."""
    n = tree.size
    fed = prefix + n - 1
    allowed = torch.zeros(fed, cached + fed, dtype=torch.bool)
    allowed[:, :cached] = True
    allowed[:prefix, cached: cached + prefix] = torch.ones(prefix, prefix, dtype=torch.bool).tril()
    allowed[prefix:, cached: cached + prefix] = True
    allowed[prefix:, cached + prefix:] = tree.ancestors()[1:, 1:]
    mask = torch.zeros(allowed.shape, dtype=dtype)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None].to(device)


def positions(tree: Tree, cached: int, prefix: int, device) -> torch.Tensor:
    """(1, prefix + n - 1) position ids: the prefix in order, then each node at root position + depth."""
    root_position = cached + prefix - 1
    prefix_positions = torch.arange(cached, cached + prefix)
    return torch.cat([prefix_positions, root_position + tree.depths()[1:]])[None].to(device)


def compact_indices(path: list[int], start: int) -> torch.Tensor:
    """Cache slots to keep after a tree forward whose root sits at slot ``start``: the root, then the accepted
    nodes (node i of the tree sits at slot start + i)."""
    return start + torch.tensor([0] + list(path), dtype=torch.long)
