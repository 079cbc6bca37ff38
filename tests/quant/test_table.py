import json

import numpy as np
import pytest

from moetune.quant.names import QuantError
from moetune.quant.table import hot_fraction, parse_policy, read_table, uniform


def test_hot_fraction_keeps_the_most_loaded_experts_high_per_layer():
    loads = np.array([[5, 1, 9, 0, 3, 3, 0, 2], [0, 0, 0, 0, 0, 0, 1, 7]])  # [Lm=2, E=8]
    table = hot_fraction(loads, [1, 3], 0.25, "fp32", "int4-g64")
    assert table.layer(1) == ("fp32", "int4-g64", "fp32") + ("int4-g64",) * 5
    assert [i for i, n in enumerate(table.layer(3)) if n == "fp32"] == [6, 7]
    assert table.counts() == {"fp32": 4, "int4-g64": 12}
    assert hot_fraction(loads, [1, 3], 0.0, "int8", "int4-g32").counts() == {"int4-g32": 16}
    assert hot_fraction(loads, [1, 3], 0.3, "int8", "int4-g32").counts()["int8"] == 6  # ceil(0.3 * 8) per layer


def test_ties_go_to_the_lower_expert_id():
    table = hot_fraction(np.zeros((1, 4)), [0], 0.5, "int8", "fp8")
    assert table.layer(0) == ("int8", "int8", "fp8", "fp8")


def test_table_file_with_default_lists_and_names(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"default": "int8", "layers": {"2": ["fp32", "fp8", "int8"], "3": "bf16"}}))
    table = read_table(path, [1, 2, 3], 3)
    assert table.layer(1) == ("int8",) * 3 and table.layer(2) == ("fp32", "fp8", "int8") and table.layer(3) == ("bf16",) * 3


@pytest.mark.parametrize("data,words", [
    ({"layers": {"1": "int8"}}, "no formats for MoE layer 2"),
    ({"default": "int8", "layers": {"9": "int8"}}, "layer 9, which is not a MoE layer"),
    ({"default": "int8", "layers": {"1": ["int8"]}}, "lists 1 experts"),
    ({"default": "int7"}, "unknown expert format 'int7'"),
])
def test_bad_table_files_are_one_line(tmp_path, data, words):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(data))
    with pytest.raises(QuantError, match=words):
        read_table(path, [1, 2], 3)


def test_policies_parse_like_the_recipe_section():
    assert parse_policy("int8") == {"experts": "int8"}
    assert parse_policy("hot=0.25,low=int4-g32") == {"hot_fraction": 0.25, "high": "fp32", "low": "int4-g32"}
    for bad, words in [("hot=x", "not a number"), ("high=fp32", "needs hot"), ("cold=1", "unknown key"),
                       ("int3", "unknown expert format")]:
        with pytest.raises(QuantError, match=words):
            parse_policy(bad)
    assert uniform("fp8", [0], 2).layer(0) == ("fp8", "fp8")
