"""A general mesh (attention DP × expert TP / EP, search/cost/mesh.py) is priced with the measured tables
bound to its own shapes, not to the previous trial's: its figures do not depend on what was priced before
(the old code read `sim.measured` as left by the last plain trial: DP-8 × TP-8 experts looked up at EP 8)."""


import pytest

from moetune.search.cost import op_tables
from moetune.search.cost.deployment import Deployment
from tests.search.test_mixed_experts import mixtral_sim


@pytest.mark.skipif(not op_tables.installed(), reason="needs the gpu-db extra (aiconfigurator-core)")
def test_a_mesh_trial_is_priced_on_its_own_tables_whatever_came_before(run_dir):
    mesh = Deployment(attn_dp=4, ep_size=1, expert_tp_size=4, max_num_seqs=16, max_num_batched_tokens=2048)
    alone = mixtral_sim(run_dir).evaluate(mesh)
    sim = mixtral_sim(run_dir)
    sim.evaluate(Deployment(ep_size=8, max_num_seqs=16))  # binds EP 8 shapes
    after = sim.evaluate(mesh)
    assert after.phases_ms["decode"]["experts"] == pytest.approx(alone.phases_ms["decode"]["experts"])
    assert after.detail["measured_share"] == pytest.approx(alone.detail["measured_share"])
    assert alone.detail["op_sources"]["experts"].startswith(alone.detail["cost_source"])
