"""Launch-config files: vLLM naming, nearest batch size, round trip."""

from moetune.kernels.configs import GemmConfig, config_file_name, load_table, nearest, save_table
from moetune.kernels.quant_formats import WeightFormat


def test_file_names_follow_vllm():
    assert config_file_name(8, 14336, "NVIDIA_H100_80GB_HBM3") == "E=8,N=14336,device_name=NVIDIA_H100_80GB_HBM3.json"
    assert config_file_name(256, 2048, "X", WeightFormat.INT4, "down") == \
        "E=256,N=2048,device_name=X,dtype=int4_w4a16_down.json"


def test_nearest_and_round_trip(tmp_path):
    table = {1: GemmConfig(16, 32, 64, 1, 4, 2), 64: GemmConfig(64, 64, 32, 8, 4, 3)}
    path = tmp_path / config_file_name(8, 64, "cpu")
    save_table(path, table)
    loaded = load_table(path)
    assert loaded == table
    assert '"BLOCK_SIZE_M": 16' in path.read_text() and '"1"' in path.read_text()
    assert nearest(loaded, 20) == table[1] and nearest(loaded, 50) == table[64]
    assert nearest(loaded, 4096) == table[64]
