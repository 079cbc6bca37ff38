"""EPLB: DeepSeek's expert-parallel load balancer, re-implemented (numpy, one layer at a time).

Given one layer's expert loads [E] and P physical slots on R ranks (in `nodes` nodes):
1. (hierarchical only) pack the G expert groups onto nodes, heaviest group first onto the lightest
   node with room, G / nodes groups per node — group-limited routing then stays inside a node;
2. inside each node, replicate: each extra slot goes to the expert with the highest load per
   replica (load / replicas; the first such expert on a tie);
3. pack the node's replicas (each carrying load / replicas) onto its ranks, heaviest first onto
   the lightest rank with room, P / R replicas per rank.
Hierarchical when nodes divide the groups; otherwise the same with one group and one node (global).
The result is `phy2log [P]`: the logical expert held by each physical slot; slot p is on rank
p // (P / R).
"""

from __future__ import annotations

import numpy as np


def eplb_layer(loads: np.ndarray, num_slots: int, num_groups: int, num_nodes: int, num_ranks: int) -> np.ndarray:
    """loads [E] → phy2log [P] (int64)."""
    loads = np.asarray(loads, dtype=np.float64)
    if num_groups % num_nodes:
        num_groups, num_nodes = 1, 1  # global policy
    E = loads.shape[0]
    group_size, groups_per_node = E // num_groups, num_groups // num_nodes
    group_node, group_pos = balanced_packing(loads.reshape(num_groups, group_size).sum(1), num_nodes)  # [G] each
    # "node-major" order of the logical experts: the experts of node 0's groups first, and so on
    node_order = ((group_node * groups_per_node + group_pos)[:, None] * group_size + np.arange(group_size)).reshape(-1)
    by_node = np.empty(E, dtype=np.int64)
    by_node[node_order] = np.arange(E)  # [E] logical expert at each node-major position
    experts_per_node, slots_per_node = E // num_nodes, num_slots // num_nodes
    out = []
    for node in range(num_nodes):
        experts = by_node[node * experts_per_node : (node + 1) * experts_per_node]  # [E/n] logical ids
        out.append(experts[_place_in_node(loads[experts], slots_per_node, num_ranks // num_nodes)])
    return np.concatenate(out)


def _place_in_node(loads: np.ndarray, num_slots: int, num_ranks: int) -> np.ndarray:
    """loads [e] of one node's experts → [num_slots] index into them, rank-major."""
    slot_expert, replicas = replicate(loads, num_slots)  # [S], [e]
    per_replica = loads[slot_expert] / replicas[slot_expert]  # [S]
    rank, pos = balanced_packing(per_replica, num_ranks)  # [S] each
    placed = np.empty(num_slots, dtype=np.int64)
    placed[rank * (num_slots // num_ranks) + pos] = slot_expert
    return placed


def replicate(loads: np.ndarray, num_slots: int) -> tuple[np.ndarray, np.ndarray]:
    """loads [e] → (slot_expert [S]: slots 0..e-1 hold each expert once, each further slot the expert
    with the highest load per replica at that point; replicas [e])."""
    e = loads.shape[0]
    replicas = np.ones(e, dtype=np.int64)
    slot_expert = list(range(e))
    for _ in range(num_slots - e):
        hot = int(np.argmax(loads / replicas))  # first maximum on a tie
        slot_expert.append(hot)
        replicas[hot] += 1
    return np.array(slot_expert, dtype=np.int64), replicas


def balanced_packing(weights: np.ndarray, num_packs: int) -> tuple[np.ndarray, np.ndarray]:
    """n items into num_packs packs of exactly n / num_packs items: heaviest first, each onto the
    lightest pack that has room (lowest index on a tie). → (pack [n], position in pack [n])."""
    n = weights.shape[0]
    per_pack = n // num_packs
    if per_pack == 1:
        return np.arange(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    pack, pos = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
    load, items = [0.0] * num_packs, [0] * num_packs
    for item in np.argsort(-weights, kind="stable"):
        best = min((p for p in range(num_packs) if items[p] < per_pack), key=load.__getitem__)
        pack[item], pos[item] = best, items[best]
        load[best] += float(weights[item])
        items[best] += 1
    return pack, pos
