"""Answer labels that share leading tokens, laid out as one tree for one llama.cpp batch.

Why: the option-words readout reads each option at its label's tokens. Where options share a first
token (`queue_000` .. `queue_254`, "Queue 001" ..), `Engine._walk` tells them apart with the logits
after every label prefix that two or more options share - every inner node of the label trie.
Evaluated one prefix at a time, each node is its own llama_decode, and each decode pays a pass over
all the weights however few tokens it holds: 17 passes for 128 such options and 31 for 255, about
0.16 s each on 2 idle cores with the 1.5B default model and several times that when the cores are
shared (measured: 28 s of a 74 s request; 69 s of 185 s for 255 options).

A token in a llama.cpp batch may belong to several sequences. So the trie is evaluated as a batch:
each node is one token, at the position its depth gives, in every sequence whose label path runs
through it; each sequence is forked from the prompt's own (a KV-cache copy of the prompt cells is
metadata only in a unified cache). llama.cpp's attention mask reads a token's first sequence, whose
cells are the prompt plus exactly that node's ancestors, so every node sees what it saw when it was
evaluated on its own. One sequence per trie leaf (an inner node with no inner child), so sibling
branches never see each other; a node's sequences are the leaves below it, a contiguous run in
depth-first order.

The plan is pure (no model): `plan()` returns groups of leaves that fit the sequence ids and KV
cells free, each group as steps (decodes) of at most `max_tokens` tokens and `max_outputs` logits
rows, shallow nodes first, so every sequence's positions stay consecutive across steps. A node that
a later group needs again as context is evaluated again there without its logits (the first
group's are kept), so the result is one fixed function of the labels: the same request gives the
same batches and the same bits.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

Path = tuple[int, ...]


@dataclass(frozen=True)
class Token:
    """One trie node in a batch: the label token at `depth` (0 = right after the prompt) in the
    sequence slots `slots` (0-based; the engine adds its first free sequence id)."""

    token: int
    depth: int
    slots: tuple[int, ...]
    output: bool  # read this node's logits (False: evaluated again only as a later group's context)
    path: Path  # the label tokens up to and including this one: the key its logits are read under


@dataclass
class Group:
    n_slots: int
    steps: list[list[Token]] = field(default_factory=list)

    @property
    def cells(self) -> int:
        return sum(len(s) for s in self.steps)


def inner_paths(labels: Sequence[Path]) -> list[Path]:
    """Label prefixes (length >= 1) that two or more labels share - the nodes `_walk` evaluates -
    shortest first, then in token order. A label that is a whole prefix of another is refused before
    (`Engine._prepare`); here it is only a shared prefix like any other."""
    count: dict[Path, int] = {}
    for lab in labels:
        for d in range(1, len(lab) + 1):
            count[lab[:d]] = count.get(lab[:d], 0) + 1
    return sorted((p for p, n in count.items() if n > 1), key=lambda p: (len(p), p))


def leaves(paths: Sequence[Path]) -> list[Path]:
    """Inner nodes with no inner child, in depth-first (lexicographic) order."""
    inner = set(paths)
    parents = {p[:-1] for p in paths if len(p) > 1}
    return sorted(p for p in inner if p not in parents)


def plan(labels: Sequence[Path], *, max_slots: int, max_cells: int, max_tokens: int,
         max_outputs: int) -> list[Group]:
    """Groups of trie leaves, each evaluated on its own forks of the prompt (then dropped): at most
    `max_slots` sequences and `max_cells` new KV cells per group; each group's nodes (every ancestor
    of its leaves) in steps of at most `max_tokens` tokens and `max_outputs` logits rows.
    Raises ValueError when one leaf's path alone does not fit `max_cells` or there is no slot."""
    paths = inner_paths(labels)
    if not paths:
        return []
    if max_slots < 1 or max_tokens < 1 or max_outputs < 1:
        raise ValueError("no sequence id, token or output left for the label trie")
    groups: list[list[Path]] = []
    nodes: set[Path] = set()
    for leaf in leaves(paths):
        mine = {leaf[:d] for d in range(1, len(leaf) + 1)}
        if len(mine) > max_cells:
            raise ValueError(f"a label prefix of {len(leaf)} tokens does not fit the {max_cells} free KV cells")
        if groups and len(groups[-1]) < max_slots and len(nodes | mine) <= max_cells:
            groups[-1].append(leaf)
            nodes |= mine
        else:
            groups.append([leaf])
            nodes = set(mine)
    done: set[Path] = set()
    out: list[Group] = []
    for members in groups:
        slots: dict[Path, list[int]] = {}
        for s, leaf in enumerate(members):
            for d in range(1, len(leaf) + 1):
                slots.setdefault(leaf[:d], []).append(s)
        group = Group(len(members))
        step: list[Token] = []
        outputs = 0
        for p in sorted(slots, key=lambda p: (len(p), p)):
            new = p not in done
            if step and (len(step) >= max_tokens or outputs + new > max_outputs):
                group.steps.append(step)
                step, outputs = [], 0
            step.append(Token(p[-1], len(p) - 1, tuple(slots[p]), new, p))
            outputs += new
            done.add(p)
        group.steps.append(step)
        out.append(group)
    return out
