"""Draft trees: building one from the heads, and verifying it against the target.

A tree hangs from its root, the target's own next token (already decided, not yet in
the KV cache). Each node at depth d keeps the `topk[d-1]` likeliest proposals of head d
as children: independent heads propose the same tokens under every parent, causal heads
are called once per parent with that parent's path. The tree then keeps its
`max_nodes` likeliest nodes by path probability (the product of the heads'
probabilities along the path): a child is never likelier than its parent, so the kept
set is itself a tree. Candidates that cannot make the cut are not expanded.

Verification walks the tree from the root with the target's distributions, one node at
a time: greedy accepts the child that is the target's argmax; sampling runs recursive
rejection over the children (each drafted deterministically, so child c is accepted
with the residual probability p(c), and a rejected child's mass is removed before the
next one is tried), which leaves every emitted token distributed exactly as the target's
own sample. The first node without an accepted child emits the target's token (the
bonus). Only the nodes on the walk need target logits, so the output layer runs on the
accepted path alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.heads.model import DraftHeads
from engine.types import SamplingParams

Embed = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class DraftTree:
    """Node 0 is the root; nodes 1 … N are drafts, each after its parent."""

    tokens: list[int]  # full token ids, root first
    parents: list[int]  # parents[0] = -1
    depths: list[int]  # depths[0] = 0

    @property
    def size(self) -> int:
        """Drafted nodes (the root excluded)."""
        return len(self.tokens) - 1

    @property
    def depth(self) -> int:
        return max(self.depths)

    def children(self) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in self.tokens]
        for node, parent in enumerate(self.parents[1:], start=1):
            out[parent].append(node)
        return out

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root to `node`, both included."""
        return _path(self.parents, node)


def build_tree(
    heads: DraftHeads,
    hidden: torch.Tensor,
    root: int,
    embed: Embed,
    topk: tuple[int, ...],
    max_nodes: int,
) -> DraftTree:
    """The draft tree for one step from the target's last hidden state `hidden` (H,)."""
    tokens, parents, depths, scores = [root], [-1], [0], [0.0]
    frontier = [0]
    independent: list[tuple[torch.Tensor, torch.Tensor]] = []
    if not heads.causal:  # every head sees only `hidden`: one call each, shared by parents
        for depth, k in enumerate(topk, start=1):
            logp = heads.logits(depth, hidden[None], None)[0].float().log_softmax(-1)
            values, ids = logp.topk(min(k, logp.numel()))
            independent.append((values, heads.vocab_ids[ids]))
    for depth, k in enumerate(topk, start=1):
        if not frontier:
            break
        if heads.causal:
            paths = torch.tensor(
                [[tokens[n] for n in _path(parents, node)] for node in frontier],
                device=hidden.device,
            )
            hiddens = hidden[None].expand(len(frontier), -1)
            logp = heads.logits(depth, hiddens, embed(paths)).float().log_softmax(-1)
            values, ids = logp.topk(min(k, logp.shape[-1]), dim=-1)
            proposals = [(values[i], heads.vocab_ids[ids[i]]) for i in range(len(frontier))]
        else:
            proposals = [independent[depth - 1]] * len(frontier)
        candidates = [
            (scores[parent] + float(value), int(token), parent)
            for parent, (values_row, tokens_row) in zip(frontier, proposals, strict=True)
            for value, token in zip(values_row.tolist(), tokens_row.tolist(), strict=True)
        ]
        # A candidate outside the likeliest max_nodes of everything so far never makes
        # the final cut: later nodes only add competition.
        ranked = sorted(
            [(-s, 0, i) for i, s in enumerate(scores[1:], start=1)]
            + [(-c[0], 1, j) for j, c in enumerate(candidates)]
        )[:max_nodes]
        frontier = []
        for _neg, is_new, index in ranked:
            if is_new:
                score, token, parent = candidates[index]
                tokens.append(token)
                parents.append(parent)
                depths.append(depth)
                scores.append(score)
                frontier.append(len(tokens) - 1)
    return _keep_likeliest(tokens, parents, depths, scores, max_nodes)


def _path(parents: list[int], node: int) -> list[int]:
    path = [node]
    while parents[path[-1]] >= 0:
        path.append(parents[path[-1]])
    return path[::-1]


def _keep_likeliest(
    tokens: list[int], parents: list[int], depths: list[int], scores: list[float], max_nodes: int
) -> DraftTree:
    """The `max_nodes` likeliest drafts (ties: shallower first, so parents stay), in
    depth order, re-indexed."""
    kept = sorted(range(1, len(tokens)), key=lambda n: (-scores[n], depths[n], n))[:max_nodes]
    order = [0, *sorted(kept, key=lambda n: (depths[n], n))]
    index = {old: new for new, old in enumerate(order)}
    return DraftTree(
        tokens=[tokens[n] for n in order],
        parents=[-1, *(index[parents[n]] for n in order[1:])],
        depths=[depths[n] for n in order],
    )


def tree_attention(
    tree: DraftTree, past: int, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """The additive 4-D attention mask (1, 1, 1+N, past+1+N) and position ids (1, 1+N)
    of a verify pass: every node sees the cached prefix, its ancestors and itself."""
    n = len(tree.tokens)
    ancestors = torch.eye(n, dtype=torch.bool)
    for node in range(1, n):
        ancestors[node] |= ancestors[tree.parents[node]]
    mask = torch.full((n, past + n), torch.finfo(dtype).min, dtype=dtype)
    mask[:, :past] = 0.0
    mask[:, past:].masked_fill_(ancestors, 0.0)
    positions = torch.tensor([past + d for d in tree.depths], dtype=torch.long)
    return mask[None, None].to(device), positions[None].to(device)


class TokenChooser:
    """Picks the target's token at a tree node, given its logits and the drafted
    children's tokens: which child (if any) is accepted, and the token emitted.

    `greedy_fault` is the `greedy_verify` drill: when sampling, a child that is the
    target's argmax is accepted outright, instead of with probability p(child)."""

    def __init__(
        self, sampling: SamplingParams, device: torch.device, *, greedy_fault: bool = False
    ) -> None:
        self.sampling = sampling
        self.greedy_fault = greedy_fault
        self.generator: torch.Generator | None = None
        if not sampling.greedy:
            self.generator = torch.Generator(device=device).manual_seed(sampling.seed)

    def choose(self, logits: torch.Tensor, children: list[int]) -> tuple[int | None, int]:
        if self.generator is None:
            token = int(logits.argmax())
            return (children.index(token) if token in children else None), token
        probs = self._distribution(logits)
        if self.greedy_fault:
            argmax = int(probs.argmax())
            if argmax in children:
                return children.index(argmax), argmax
        for index, child in enumerate(children):
            accept = float(probs[child])
            if accept <= 0.0:
                continue
            if float(torch.rand((), generator=self.generator, device=probs.device)) < accept:
                return index, child
            probs[child] = 0.0  # the residual max(p - q, 0) for a point-mass draft q
            probs /= probs.sum()
        return None, int(torch.multinomial(probs, 1, generator=self.generator))

    def _distribution(self, logits: torch.Tensor) -> torch.Tensor:
        """The target's sampling distribution: temperature, then nucleus (top_p), as
        transformers' warpers apply them to the baseline arm."""
        scores = logits.float() / self.sampling.temperature
        top_p = self.sampling.top_p
        if top_p < 1.0:
            ordered, order = torch.sort(scores, descending=False)
            cumulative = ordered.softmax(-1).cumsum(-1)
            drop = cumulative <= (1 - top_p)
            drop[-1:] = False
            scores = scores.masked_fill(drop.scatter(0, order, drop), float("-inf"))
        return scores.softmax(-1)


def walk(
    tree: DraftTree,
    hidden: torch.Tensor,
    output_layer: Callable[[torch.Tensor], torch.Tensor],
    chooser: TokenChooser,
) -> tuple[list[int], int, torch.Tensor]:
    """Verify `tree` given the target's hidden states at its nodes (1+N, H): the
    accepted path (node indices, root first), the bonus token, and the hidden state of
    the last accepted node (which drafts the next tree)."""
    children = tree.children()
    node, path = 0, [0]
    while True:
        logits = output_layer(hidden[node])
        choice, token = chooser.choose(logits, [tree.tokens[c] for c in children[node]])
        if choice is None:
            return path, token, hidden[node]
        node = children[node][choice]
        path.append(node)
