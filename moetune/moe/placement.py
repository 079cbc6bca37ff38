"""Expert placement: which logical expert each physical slot of each MoE layer holds, on which rank.

P = E + N physical slots per layer (N redundant replicas), P / R per rank; slot p lives on rank
p // (P / R) (rank-major, so a rank's slots are one contiguous range). Every logical expert has at
least one slot. Copies of a replicated expert are split over its replicas by token index: copy
(t, k) of expert e goes to replica t mod (replicas of e), replicas in increasing slot order
(`SlotMap.physical`).

Policies: `contiguous` (experts in order, a replica beside its original), `round_robin` (slot i of
the list on rank i mod R), `eplb` (DeepSeek's balancer, moe/eplb.py, from measured loads). Without
loads, contiguous and round-robin replicate the first N experts; with loads, the hottest (highest
load per replica first, as EPLB does).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from moetune.errors import MoetuneError
from moetune.moe.eplb import eplb_layer, replicate

if TYPE_CHECKING:
    import torch

    from moetune.experts.store import SlotMap

POLICIES = ("contiguous", "round_robin", "eplb")
FORMAT = "moetune-placement/1"


class PlacementError(MoetuneError):
    """A placement that cannot exist, or a placement file that does not fit the model or EP size."""


def check_ep(num_experts: int, ep_size: int, redundant: int = 0, ranks_per_node: int = 1) -> None:
    """The one validator of an EP layout: R ranks hold E + N slots in equal shares."""
    slots = num_experts + redundant
    if redundant < 0:
        raise PlacementError(f"--redundant-experts {redundant} must be 0 or more")
    if ep_size < 1:
        raise PlacementError(f"--ep-size {ep_size} must be at least 1")
    if ep_size > slots:
        raise PlacementError(f"--ep-size {ep_size} is larger than the {slots} physical expert slots "
                             f"({num_experts} experts + {redundant} redundant); lower --ep-size or add redundant experts")
    if slots % ep_size:
        divisors = ", ".join(str(d) for d in range(1, slots + 1) if slots % d == 0)
        what = f"the model's {num_experts} experts" + (f" + {redundant} redundant" if redundant else "")
        raise PlacementError(f"--ep-size {ep_size} does not divide {what} ({slots} slots); choose one of {divisors}"
                             + ("" if redundant else " or add --redundant-experts"))
    if ranks_per_node < 1 or (ep_size % ranks_per_node and ranks_per_node % ep_size):
        raise PlacementError(f"--ranks-per-node {ranks_per_node} does not tile --ep-size {ep_size}; "
                             "choose a divisor or a multiple of it")


@dataclass(frozen=True)
class Placement:
    num_experts: int  # E
    ep_size: int  # R
    layers: tuple[int, ...]  # model layer index of each row
    phy2log: np.ndarray  # [Lm, P] int64 logical expert held by each physical slot
    policy: str = "contiguous"
    model_type: str | None = None  # the model it was made for (checked when loaded), None = any

    @property
    def num_slots(self) -> int:  # P
        return int(self.phy2log.shape[1])

    @property
    def redundant(self) -> int:  # N
        return self.num_slots - self.num_experts

    @property
    def slots_per_rank(self) -> int:
        return self.num_slots // self.ep_size

    def row(self, layer: int) -> np.ndarray:
        return self.phy2log[self.layers.index(layer)]

    def rank_of_slot(self) -> np.ndarray:  # [P]
        return np.arange(self.num_slots) // self.slots_per_rank

    def rank_experts(self, layer: int, rank: int) -> list[int]:
        """Logical expert of each of `rank`'s slots in `layer`, in local slot order."""
        n = self.slots_per_rank
        return [int(e) for e in self.row(layer)[rank * n : (rank + 1) * n]]

    def replicas(self, layer: int) -> list[list[int]]:
        """Per logical expert, its physical slots in increasing order."""
        out: list[list[int]] = [[] for _ in range(self.num_experts)]
        for slot, e in enumerate(self.row(layer)):
            out[int(e)].append(slot)
        return out

    def slot_map(self, layer: int, device: torch.device | str = "cpu") -> SlotMap:
        """The layer's logical → physical map; identity (free) when slot e holds expert e."""
        import torch

        from moetune.experts.store import SlotMap

        row = self.row(layer)
        if self.num_slots == self.num_experts and np.array_equal(row, np.arange(self.num_experts)):
            return SlotMap(self.num_experts)
        reps = self.replicas(layer)
        width = max(len(r) for r in reps)
        table = torch.full((self.num_experts, width), -1, dtype=torch.long)
        for e, slots in enumerate(reps):
            table[e, : len(slots)] = torch.tensor(slots)
        counts = torch.tensor([len(r) for r in reps], dtype=torch.long)
        return SlotMap(self.num_experts, self.num_slots, table.to(device), counts.to(device))

    def by_format(self, formats: dict[int, tuple[str, ...]]) -> "Placement":
        """The same placement with each rank's slots stably sorted by the format of their expert
        (`formats`: MoE layer → format per logical expert [E]; formats ordered by first appearance
        over the experts), so that a rank's slots of one format are one contiguous range (a format
        group, experts/store.py). Which rank holds which expert does not change, nor the order of an
        expert's replicas (same format: the sort is stable), so tokens reach the same ranks."""
        rows = []
        n = self.slots_per_rank
        for j, layer in enumerate(self.layers):
            names = formats[layer]
            order = {name: k for k, name in enumerate(dict.fromkeys(names))}  # format → its rank in the order
            row = self.phy2log[j]
            key = np.array([order[names[int(e)]] for e in row])  # [P]
            rows.append(np.concatenate([row[r * n:(r + 1) * n][np.argsort(key[r * n:(r + 1) * n], kind="stable")]
                                        for r in range(self.ep_size)]))
        return Placement(self.num_experts, self.ep_size, self.layers, np.stack(rows).astype(np.int64), self.policy,
                         self.model_type)

    def rank_loads(self, loads: np.ndarray) -> np.ndarray:
        """loads [Lm, E] (token copies per logical expert) → [Lm, R] per rank, a replicated expert's
        load split evenly over its replicas (what token-index splitting gives on average)."""
        out = np.zeros((len(self.layers), self.ep_size))
        ranks = self.rank_of_slot()
        for j, layer in enumerate(self.layers):
            counts = np.bincount(self.phy2log[j], minlength=self.num_experts)  # [E] replicas
            per_slot = loads[j][self.phy2log[j]] / counts[self.phy2log[j]]  # [P]
            np.add.at(out[j], ranks, per_slot)
        return out

    def check_for(self, num_experts: int, moe_layers: list[int], ep_size: int, model_type: str | None,
                  source: str = "placement") -> None:
        """Raise PlacementError when this placement was made for another model or EP size."""
        if self.model_type is not None and model_type is not None and self.model_type != model_type:
            raise PlacementError(f"{source} was made for a {self.model_type} model, not this {model_type} model")
        if self.num_experts != num_experts or list(self.layers) != list(moe_layers):
            raise PlacementError(f"{source} is for {self.num_experts} experts in MoE layers {list(self.layers)}; "
                                 f"this model has {num_experts} experts in MoE layers {list(moe_layers)}")
        if self.ep_size != ep_size:
            raise PlacementError(f"{source} was made for --ep-size {self.ep_size}, not {ep_size}; "
                                 f"run moetune placement again with --ep-size {ep_size}")


def make_placement(policy: str, num_experts: int, ep_size: int, layers: list[int], redundant: int = 0,
                   loads: np.ndarray | None = None, num_groups: int = 1, num_nodes: int = 1,
                   model_type: str | None = None) -> Placement:
    """loads [Lm, E] token copies per expert (needed by eplb; optional otherwise)."""
    check_ep(num_experts, ep_size, redundant)
    if policy not in POLICIES:
        raise PlacementError(f"unknown placement policy '{policy}' (choose from: {', '.join(POLICIES)})")
    if loads is not None and loads.shape != (len(layers), num_experts):
        raise PlacementError(f"loads have shape {list(loads.shape)}, expected [{len(layers)} layers, {num_experts} experts]")
    P = num_experts + redundant
    if policy == "eplb":
        if loads is None:
            raise PlacementError("placement policy 'eplb' needs expert loads: a run directory or --loads FILE")
        _check_groups(num_experts, ep_size, num_groups, num_nodes)
        rows = [_eplb_or_local(loads[j], num_experts, P, num_groups, num_nodes, ep_size) for j in range(len(layers))]
    else:
        rows = [_simple_row(policy, num_experts, P, ep_size, None if loads is None else loads[j])
                for j in range(len(layers))]
    return Placement(num_experts, ep_size, tuple(layers), np.stack(rows).astype(np.int64), policy, model_type)


def _simple_row(policy: str, E: int, P: int, R: int, loads: np.ndarray | None) -> np.ndarray:
    if loads is None:
        experts = np.concatenate([np.arange(E), np.arange(P - E) % E])  # the first N experts twice
    else:
        experts = replicate(np.asarray(loads, dtype=np.float64), P)[0]
    experts = np.sort(experts, kind="stable")  # a replica beside its original
    if policy == "contiguous":
        return experts
    per_rank = P // R
    return experts.reshape(per_rank, R).T.reshape(-1)  # list slot i → rank i mod R, position i // R


def _eplb_or_local(loads: np.ndarray, E: int, P: int, groups: int, nodes: int, R: int) -> np.ndarray:
    """EPLB's row, unless its most loaded rank carries more than under the contiguous placement without
    replicas (greedy packing is a heuristic: it happens on small, tied loads). Then the contiguous
    experts stay put and each rank's extra slots replicate its own hottest experts, which never
    raises a rank's load."""
    row = eplb_layer(loads, P, groups, nodes, R)
    if E % R:
        return row
    per_rank = P // R
    if _peak_rank_load(row, loads, R) <= loads.reshape(R, E // R).sum(1).max() + 1e-9:
        return row
    own = [np.sort(replicate(loads[r * (E // R) : (r + 1) * (E // R)], per_rank)[0]) + r * (E // R) for r in range(R)]
    return np.concatenate(own)


def _peak_rank_load(row: np.ndarray, loads: np.ndarray, R: int) -> float:
    """row [P] slot → expert; a replicated expert's load split evenly over its replicas."""
    replicas = np.bincount(row, minlength=loads.shape[0])  # [E]
    return float((loads[row] / replicas[row]).reshape(R, -1).sum(1).max())


def _check_groups(E: int, R: int, groups: int, nodes: int) -> None:
    if groups < 1 or E % groups:
        raise PlacementError(f"--groups {groups} does not divide the {E} experts")
    if nodes < 1 or R % nodes:
        raise PlacementError(f"--nodes {nodes} does not divide --ep-size {R}")


# ---- files -------------------------------------------------------------------------------------

def placement_json(p: Placement, loads: np.ndarray | None = None) -> dict:
    """Our file: per layer, physical slot → logical expert and the per-rank load (when loads are known)."""
    rank_loads = p.rank_loads(loads) if loads is not None else None
    layers = []
    for j, layer in enumerate(p.layers):
        entry = {"layer": layer, "physical_to_logical": p.phy2log[j].tolist()}
        if rank_loads is not None:
            row = rank_loads[j]
            entry["rank_load"] = [round(float(x), 6) for x in row]
            entry["balancedness"] = round(float(row.mean() / row.max()), 6) if row.max() > 0 else 1.0
        layers.append(entry)
    return {"format": FORMAT, "policy": p.policy, "model_type": p.model_type, "num_experts": p.num_experts,
            "ep_size": p.ep_size, "num_physical_slots": p.num_slots, "slots_per_rank": p.slots_per_rank,
            "redundant_experts": p.redundant, "replica_split": "token t's copy goes to replica t mod replicas",
            "layers": layers}


def sglang_json(p: Placement, num_layers: int | None = None) -> dict:
    """SGLang's `--init-expert-location` file: {"physical_to_logical_map": [num_layers][P]} over every
    decoder layer; layers without routed experts get the trivial map (slot p → expert p mod E)."""
    num_layers = num_layers if num_layers is not None else max(p.layers) + 1
    trivial = (np.arange(p.num_slots) % p.num_experts).tolist()
    rows = [p.row(i).tolist() if i in p.layers else trivial for i in range(num_layers)]
    return {"physical_to_logical_map": rows}


def write_placement(p: Placement, path: Path, loads: np.ndarray | None = None, num_layers: int | None = None) -> Path:
    """Write our JSON to `path` and SGLang's beside it (`<stem>.sglang.json`); returns the SGLang path."""
    path = Path(path)
    sglang = path.with_name(path.stem + ".sglang.json")
    for target, data in ((path, placement_json(p, loads)), (sglang, sglang_json(p, num_layers))):
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_text(_dumps(data))
        tmp.replace(target)
    return sglang


def _dumps(data: dict) -> str:
    """Top-level keys one per line, each layer (or map row) on one line."""
    items = []
    for key, value in data.items():
        if isinstance(value, list) and value and isinstance(value[0], (dict, list)):
            rows = ",\n".join("  " + json.dumps(v) for v in value)
            items.append(f" {json.dumps(key)}: [\n{rows}\n ]")
        else:
            items.append(f" {json.dumps(key)}: {json.dumps(value)}")
    return "{\n" + ",\n".join(items) + "\n}\n"


def read_placement(path: Path | str) -> Placement:
    path = Path(path)
    if not path.is_file():
        raise PlacementError(f"placement file '{path}' does not exist; write one with moetune placement")
    try:
        data = json.loads(path.read_text())
        if data.get("format") != FORMAT:
            raise PlacementError(f"'{path}' is not a moetune placement file (format {data.get('format')!r}, "
                                 f"expected {FORMAT!r})")
        layers = tuple(int(e["layer"]) for e in data["layers"])
        phy2log = np.array([e["physical_to_logical"] for e in data["layers"]], dtype=np.int64)
        p = Placement(int(data["num_experts"]), int(data["ep_size"]), layers, phy2log, str(data["policy"]),
                      data.get("model_type"))
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise PlacementError(f"placement file '{path}' is malformed ({type(exc).__name__}: {exc})") from None
    _check_consistent(p, path)
    return p


def _check_consistent(p: Placement, path: Path) -> None:
    check_ep(p.num_experts, p.ep_size, p.redundant)
    if p.phy2log.ndim != 2 or p.phy2log.min() < 0 or p.phy2log.max() >= p.num_experts:
        raise PlacementError(f"placement file '{path}' names experts outside 0..{p.num_experts - 1}")
    for j, layer in enumerate(p.layers):
        if len(np.unique(p.phy2log[j])) != p.num_experts:
            raise PlacementError(f"placement file '{path}': layer {layer} leaves a logical expert without a slot")


def read_loads(path: Path | str) -> np.ndarray:
    """A JSON list of per-layer expert loads (a list of lists of numbers) → [Lm, E] float64."""
    path = Path(path)
    if not path.is_file():
        raise PlacementError(f"loads file '{path}' does not exist")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise PlacementError(f"loads file '{path}' is not valid JSON ({exc.msg} at line {exc.lineno})") from None
    ok = (isinstance(data, list) and data and all(isinstance(r, list) and r for r in data)
          and len({len(r) for r in data}) == 1
          and all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0
                  for r in data for x in r))
    if not ok:
        raise PlacementError(f"loads file '{path}' must be a JSON list of per-layer lists of non-negative numbers, "
                             "all of one length (the number of experts)")
    return np.array(data, dtype=np.float64)
