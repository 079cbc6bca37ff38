"""Where each canonical weight lives in a Hugging Face checkpoint, per model_type."""

from __future__ import annotations

from dataclasses import dataclass

_EXPERT_PROJ = {"mixtral": ("w1", "w3", "w2")}  # (gate, up, down); everyone else: *_proj
_SHARED = {"qwen2_moe": "shared_expert", "deepseek_v3": "shared_experts"}


@dataclass(frozen=True)
class TensorNames:
    model_type: str

    def layer(self, i: int) -> str:
        return f"model.layers.{i}."

    def moe(self, i: int) -> str:
        block = "block_sparse_moe" if self.model_type == "mixtral" else "mlp"
        return f"{self.layer(i)}{block}."

    def router_weight(self, i: int) -> str:
        return f"{self.moe(i)}gate.weight"

    def router_bias(self, i: int) -> str:
        return f"{self.moe(i)}gate.e_score_correction_bias"

    def expert(self, i: int, e: int, which: str) -> str:
        """`which` is gate | up | down."""
        gate, up, down = _EXPERT_PROJ.get(self.model_type, ("gate_proj", "up_proj", "down_proj"))
        proj = {"gate": gate, "up": up, "down": down}[which]
        return f"{self.moe(i)}experts.{e}.{proj}.weight"

    def fused_experts(self, i: int) -> tuple[str, str]:
        """transformers-5 in-memory layout: gate_up_proj [E, 2I, D], down_proj [E, D, I]."""
        return f"{self.moe(i)}experts.gate_up_proj", f"{self.moe(i)}experts.down_proj"

    def shared(self, i: int) -> str:
        return f"{self.moe(i)}{_SHARED.get(self.model_type, 'shared_expert')}."

    def shared_gate(self, i: int) -> str:
        return f"{self.moe(i)}shared_expert_gate.weight"

    def dense_mlp(self, i: int) -> str:
        return f"{self.layer(i)}mlp."
