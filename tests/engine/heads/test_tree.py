"""Draft trees: building, the tree attention, choosing tokens, and keeping the path."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from engine.heads.decode import _keep_path
from engine.heads.model import HeadKind, cache_argument, initialised_heads
from engine.heads.tree import DraftTree, TokenChooser, build_tree, tree_attention, walk
from engine.types import SamplingParams

KINDS: tuple[HeadKind, ...] = ("causal", "independent")


def heads_for(model: Any, kind: HeadKind, depth: int = 3) -> Any:
    return initialised_heads(model, kind, depth, scale=0.3, seed=7)


def tree_of(model: Any, kind: HeadKind, topk: tuple[int, ...], max_nodes: int) -> DraftTree:
    heads = heads_for(model, kind, len(topk))
    hidden = torch.randn(model.config.hidden_size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return build_tree(heads, hidden, 5, model.get_input_embeddings(), topk, max_nodes)


def path_probability(model: Any, kind: HeadKind, tree: DraftTree, node: int) -> float:
    """The product of the heads' probabilities along `node`'s path, recomputed."""
    heads = heads_for(model, kind, tree.depth)
    hidden = torch.randn(model.config.hidden_size, generator=torch.Generator().manual_seed(1))
    path = tree.path_to(node)
    tokens = [tree.tokens[n] for n in path]
    total = 1.0
    with torch.no_grad():
        for depth in range(1, len(path)):
            embeddings = model.get_input_embeddings()(torch.tensor([tokens[:depth]]))
            logits = heads.logits(depth, hidden[None], embeddings if heads.causal else None)
            probs = logits[0].float().softmax(-1)
            total *= float(probs[(heads.vocab_ids == tokens[depth]).nonzero()[0, 0]])
    return total


class TestBuildTree:
    @pytest.mark.parametrize("kind", KINDS)
    def test_shape_follows_topk_and_budget(self, chaotic: Any, kind: HeadKind) -> None:
        """Each node has at most topk[d] children, at most max_nodes drafts in all,
        parents before children, depths one more than the parent's."""
        model, _tokenizer = chaotic
        tree = tree_of(model, kind, (3, 2, 2), 9)
        assert 1 <= tree.size <= 9
        children = tree.children()
        for node in range(1, len(tree.tokens)):
            parent = tree.parents[node]
            assert 0 <= parent < node
            assert tree.depths[node] == tree.depths[parent] + 1
        for node, kids in enumerate(children):
            if kids:
                assert len(kids) <= (3, 2, 2)[tree.depths[node]]
                assert len({tree.tokens[k] for k in kids}) == len(kids)

    @pytest.mark.parametrize("kind", KINDS)
    def test_a_chain_is_one_path(self, chaotic: Any, kind: HeadKind) -> None:
        model, _tokenizer = chaotic
        tree = tree_of(model, kind, (1, 1, 1, 1), 4)
        assert tree.parents == [-1, 0, 1, 2, 3] and tree.depths == [0, 1, 2, 3, 4]

    @pytest.mark.parametrize("kind", KINDS)
    def test_budget_keeps_the_likeliest_nodes(self, chaotic: Any, kind: HeadKind) -> None:
        """The pruned tree holds exactly the likeliest nodes of the full tree."""
        model, _tokenizer = chaotic
        full = tree_of(model, kind, (3, 2, 2), 3 + 6 + 12)
        pruned = tree_of(model, kind, (3, 2, 2), 7)
        assert full.size == 21 and pruned.size == 7

        def paths(tree: DraftTree) -> dict[tuple[int, ...], int]:
            return {
                tuple(tree.tokens[n] for n in tree.path_to(node)): node
                for node in range(1, len(tree.tokens))
            }

        scores = {p: path_probability(model, kind, full, n) for p, n in paths(full).items()}
        best = sorted(scores, key=lambda p: -scores[p])[:7]
        assert set(paths(pruned)) == set(best)

    def test_causal_children_depend_on_the_path(self, chaotic: Any) -> None:
        """Causal heads propose different tokens under different parents; independent
        heads the same ones under every parent."""
        model, _tokenizer = chaotic
        expectations: tuple[tuple[HeadKind, bool], ...] = (("causal", True), ("independent", False))
        for kind, differ in expectations:
            tree = tree_of(model, kind, (3, 3), 12)
            children = tree.children()
            proposals = {
                tuple(sorted(tree.tokens[k] for k in children[node]))
                for node in range(1, len(tree.tokens))
                if tree.depths[node] == 1
            }
            assert (len(proposals) > 1) is differ


class TestTreeAttention:
    def test_nodes_see_the_prefix_their_ancestors_and_themselves(self) -> None:
        tree = DraftTree(tokens=[1, 2, 3, 4, 5], parents=[-1, 0, 0, 1, 3], depths=[0, 1, 1, 2, 3])
        mask, positions = tree_attention(tree, 6, torch.float32, torch.device("cpu"))
        assert mask.shape == (1, 1, 5, 11)
        visible = (mask[0, 0] == 0).int().tolist()
        ancestors = {0: {0}, 1: {0, 1}, 2: {0, 2}, 3: {0, 1, 3}, 4: {0, 1, 3, 4}}
        for node in range(5):
            assert visible[node][:6] == [1] * 6
            assert {j for j in range(5) if visible[node][6 + j]} == ancestors[node]
        assert positions.tolist() == [[6, 7, 7, 8, 9]]


def _distribution(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    probs = (logits / temperature).softmax(-1)
    if top_p < 1.0:
        ordered, order = probs.sort(descending=True)
        keep = ordered.cumsum(-1) - ordered < top_p
        probs = torch.zeros_like(probs).scatter(0, order, ordered * keep)
        probs /= probs.sum()
    return probs


class TestTokenChooser:
    LOGITS = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0])

    def test_greedy_accepts_the_argmax_child(self) -> None:
        chooser = TokenChooser(SamplingParams(), torch.device("cpu"))
        assert chooser.choose(self.LOGITS, [3, 0, 1]) == (1, 0)
        assert chooser.choose(self.LOGITS, [3, 1]) == (None, 0)

    @pytest.mark.parametrize(
        ("temperature", "top_p", "children"),
        [(1.0, 1.0, [1, 0, 5]), (0.7, 1.0, [2, 3]), (1.0, 0.8, [0, 4, 1]), (1.3, 1.0, [])],
    )
    def test_emitted_tokens_follow_the_target_distribution(
        self, temperature: float, top_p: float, children: list[int]
    ) -> None:
        """Whatever the drafted children, the token a node emits (an accepted child or
        the residual sample) is distributed as the target's own sample."""
        sampling = SamplingParams(temperature=temperature, top_p=top_p, seed=11)
        chooser = TokenChooser(sampling, torch.device("cpu"))
        draws = 20_000
        counts = torch.zeros(len(self.LOGITS))
        for _ in range(draws):
            choice, token = chooser.choose(self.LOGITS.clone(), children)
            assert choice is None or children[choice] == token
            counts[token] += 1
        expected = _distribution(self.LOGITS, temperature, top_p)
        assert torch.allclose(counts / draws, expected, atol=0.012)

    def test_greedy_verify_fault_accepts_the_argmax_child_outright(self) -> None:
        sampling = SamplingParams(temperature=1.0, seed=3)
        faulty = TokenChooser(sampling, torch.device("cpu"), greedy_fault=True)
        assert all(faulty.choose(self.LOGITS.clone(), [2, 0]) == (1, 0) for _ in range(50))
        healthy = TokenChooser(sampling, torch.device("cpu"))
        assert any(healthy.choose(self.LOGITS.clone(), [2, 0]) != (1, 0) for _ in range(50))


class TestKeepPath:
    @pytest.mark.parametrize("path", [[0, 1, 3], [0, 2, 4], [0, 2], [0]])
    def test_cache_equals_feeding_the_accepted_path(self, chaotic: Any, path: list[int]) -> None:
        """After a tree pass the kept cache holds exactly the entries a plain forward
        over prefix + accepted path gives, and the walk's next logits agree."""
        from transformers import DynamicCache

        model, _tokenizer = chaotic
        tree = DraftTree(
            tokens=[11, 12, 13, 14, 15], parents=[-1, 0, 0, 1, 2], depths=[0, 1, 1, 2, 2]
        )
        prefix = torch.tensor([[3, 9, 27, 81, 50, 7]])
        past = prefix.shape[1]
        argument = cache_argument(model)
        with torch.no_grad():
            cache: Any = DynamicCache(config=model.config)
            model.model(prefix, use_cache=True, **{argument: cache})
            mask, positions = tree_attention(tree, past, torch.float32, torch.device("cpu"))
            tree_hidden = model.model(
                torch.tensor([tree.tokens]),
                attention_mask=mask,
                position_ids=positions,
                use_cache=True,
                **{argument: cache},
            ).last_hidden_state[0]
            _keep_path(cache, past, path)
            reference: Any = DynamicCache(config=model.config)
            tokens = torch.tensor([[tree.tokens[n] for n in path]])
            plain_hidden = model.model(
                torch.cat((prefix, tokens), dim=1), use_cache=True, **{argument: reference}
            ).last_hidden_state[0, past:]
        assert torch.allclose(tree_hidden[path], plain_hidden, atol=1e-5)
        for kept, expected in zip(cache.layers, reference.layers, strict=True):
            assert kept.keys.shape == expected.keys.shape
            assert torch.allclose(kept.keys, expected.keys, atol=1e-5)
            assert torch.allclose(kept.values, expected.values, atol=1e-5)


class TestWalk:
    def test_walk_follows_the_target_and_stops_at_the_first_miss(self, chaotic: Any) -> None:
        """With children planted on the target's greedy choices the walk accepts them
        in order and emits the target's token at the first node without a match."""
        model, _tokenizer = chaotic
        output = model.get_output_embeddings()
        hidden = torch.randn(4, model.config.hidden_size, generator=torch.Generator())
        with torch.no_grad():
            greedy = [int(output(h).argmax()) for h in hidden]
        wrong = (greedy[1] + 1) % output.weight.shape[0]
        tree = DraftTree(
            tokens=[0, greedy[0], (greedy[0] + 1) % output.weight.shape[0], greedy[1], wrong],
            parents=[-1, 0, 0, 1, 1],
            depths=[0, 1, 1, 2, 2],
        )
        # node 1 is the target's choice at the root, node 3 its choice at node 1
        states = torch.stack([hidden[0], hidden[1], hidden[2], hidden[3], hidden[3]])
        chooser = TokenChooser(SamplingParams(), torch.device("cpu"))
        with torch.no_grad():
            path, bonus, last = walk(tree, states, output, chooser)
        assert path == [0, 1, 3]
        assert bonus == greedy[3]
        assert torch.equal(last, states[3])
