"""Roofline profile: hand-derived GEMM numbers and validation against measured GEMMs."""

import csv

import numpy as np
import pytest

from hardware.device import load_device
from hardware.roofline import KEPT_PADDING_MAX_ROWS, Roofline, gemm_flops_bytes, padded_rows
from perfmodel.errors import SpecError
from tests.conftest import shared_file


def test_gemm_4096_cubed_hand_numbers() -> None:
    f, b = gemm_flops_bytes(4096, 4096, 4096, act_bytes=2.0)
    assert float(f) == 2 * 4096**3  # 137.4 GFLOP
    assert float(b) == 3 * 4096 * 4096 * 2  # A, B read and C written once: 100.7 MB
    r = Roofline(load_device("h100-sxm"))
    # compute-bound: 2·4096³ / (0.8 · 989.4e12) + 5 µs = 178.6 µs
    assert float(r.gemm_time_s(4096, 4096, 4096)) == pytest.approx(
        2 * 4096**3 / (0.8 * 989.4e12) + 5e-6
    )


def test_decode_gemm_is_weight_streaming() -> None:
    r = Roofline(load_device("h100-sxm"))
    t = r.times(*gemm_flops_bytes(1, 8192, 8192, act_bytes=2.0), dtype="bf16")
    assert bool(t.memory_bound)
    # 8192² · 2 B of weights at 0.8 · 3.35 TB/s ≈ 50.1 µs (+ the tiny activations)
    assert float(t.memory_s) == pytest.approx(8192 * 8192 * 2 / (0.8 * 3.35e12), rel=1e-3)


def test_tile_padding_costs_whole_tiles() -> None:
    def rows(m: int) -> float:
        f, _ = gemm_flops_bytes(m, 1024, 1024, act_bytes=2.0)
        return float(f) / (2 * 1024 * 1024)

    # small m: the next power-of-two tile from 16 up; then whole 128-row tiles
    assert [rows(m) for m in (1, 16, 17, 100, 128, 129, 300)] == [16, 16, 32, 128, 128, 256, 384]


def test_vectorized_and_absent_ops_free() -> None:
    r = Roofline(load_device("a100-sxm-80gb"))
    t = r.time_s(np.array([0.0, 1e12]), np.array([0.0, 0.0]), dtype="bf16")
    assert t.shape == (2,)
    assert t[0] == 0.0
    assert t[1] == pytest.approx(1e12 / (0.8 * 312e12) + 5e-6)


def test_bad_efficiency_rejected() -> None:
    with pytest.raises(SpecError, match="eff_compute"):
        Roofline(load_device("h100-sxm"), eff_compute=1.5)


def _gemm_rows(dev: str) -> tuple[np.ndarray, ...]:
    path = shared_file("silicon", f"{dev}__gemm.csv")
    m, n, k, t = [], [], [], []
    with path.open() as f:
        for r in csv.DictReader(f):
            if r["gemm_dtype"] != "bfloat16" or int(r["n"]) < 1024 or int(r["k"]) < 1024:
                continue
            m.append(int(r["m"]))
            n.append(int(r["n"]))
            k.append(int(r["k"]))
            t.append(float(r["latency_ms"]) * 1e-3)
    return tuple(np.array(x, dtype=float) for x in (m, n, k, t))


@pytest.mark.parametrize(
    ("dev", "device_id"), [("a100_sxm", "a100-sxm-80gb"), ("h100_sxm", "h100-sxm")]
)
def test_default_roofline_vs_measured_gemm(dev: str, device_id: str) -> None:
    """Default efficiencies, no per-device fitting: median APE ≤ 10 % (issue 2).

    Measured: A100 7.6 %, H100 6.0 % (bf16, n, k ≥ 1024; 4,704 and 18,840 shapes).
    """
    m, n, k, t = _gemm_rows(dev)
    pred = Roofline(load_device(device_id)).gemm_time_s(m, n, k)
    ape = np.abs(pred - t) / t
    assert len(t) > 1000
    assert np.median(ape) <= 0.10


VIDUR = [
    ("a100", "a100-sxm-80gb", "codellama_CodeLlama-34b-Instruct-hf"),
    ("a100", "a100-sxm-80gb", "meta-llama_Llama-2-70b-hf"),
    ("a100", "a100-sxm-80gb", "meta-llama_Llama-2-7b-hf"),
    ("a100", "a100-sxm-80gb", "meta-llama_Meta-Llama-3-70B"),
    ("a100", "a100-sxm-80gb", "meta-llama_Meta-Llama-3-8B"),
    ("h100", "h100-sxm", "codellama_CodeLlama-34b-Instruct-hf"),
    ("h100", "h100-sxm", "meta-llama_Llama-2-70b-hf"),
    ("h100", "h100-sxm", "meta-llama_Llama-2-7b-hf"),
]


@pytest.mark.parametrize(("dev", "device_id", "model"), VIDUR)
def test_default_roofline_vs_vidur_mlp(dev: str, device_id: str, model: str) -> None:
    """MLP up/down projections under TP, measured by Vidur: median APE ≤ 15 % per file."""
    path = shared_file("vidur-profiling", f"{dev}__{model}__mlp.csv")
    with path.open() as f:
        rows = list(csv.DictReader(f))

    def col(name: str) -> np.ndarray:
        return np.array([float(r[name]) for r in rows])

    T, tp = col("num_tokens"), col("num_tensor_parallel_workers")
    h, inter = col("n_embd"), col("n_expanded_embd")
    gated = np.array([r["use_gated_mlp"] == "True" for r in rows])
    r = Roofline(load_device(device_id))
    up = r.gemm_time_s(T, (1 + gated) * inter / tp, h)
    down = r.gemm_time_s(T, h, inter / tp)
    up_ape = np.abs(up - col("time_stats.mlp_up_proj.median") * 1e-3) / (
        col("time_stats.mlp_up_proj.median") * 1e-3
    )
    down_ape = np.abs(down - col("time_stats.mlp_down_proj.median") * 1e-3) / (
        col("time_stats.mlp_down_proj.median") * 1e-3
    )
    assert np.median(up_ape) <= 0.15
    assert np.median(down_ape) <= 0.15


def test_collective_links_by_topology() -> None:
    from hardware.comm import collective_protocol, collective_time_s, link_for_group

    h100 = load_device("h100-sxm")
    mb = 64e6
    # hardware/comm.py, Simple regime (bandwidth-bound at 64 MB): B_Simple 17.6 µs +
    # m 0.764 · s steps · L + (n + λ 0.353) · (64 MB / p) / (e 0.727 · bw).
    # switched ring (NVSwitch, 8 H100): s = n = 2 · 7, L = 1 µs, bw = 450 GB/s
    # (int8: the in-switch reduction of NVSwitch 3 does not apply, the ring does)
    nv8 = link_for_group(h100, 8)
    t = float(collective_time_s("all_reduce", mb, group=8, link=nv8, dtype="int8"))
    assert t == pytest.approx(17.6e-6 + 0.764 * 14 * 1e-6 + 14.353 * 8e6 / (0.727 * 450e9))
    assert t == pytest.approx(379.28e-6, rel=1e-4)
    assert collective_protocol("all_reduce", mb, group=8, link=nv8, dtype="int8") == "Simple"
    # bf16 on 8 H100: NVLink SHARP, one pass of the buffer into and out of the switch
    t = float(collective_time_s("all_reduce", mb, group=8, link=nv8, dtype="bf16"))
    assert t == pytest.approx(71.2e-6 + 0.764e-6 + mb / (0.586 * 450e9), rel=1e-3)
    assert collective_protocol("all_reduce", mb, group=8, link=nv8, dtype="bf16") == "NVLS"
    # mesh (MI300X): 7 links of 64 GB/s in parallel (448 GB/s), one step per phase (s = 2),
    # L = 5 µs, still n = 14 chunks
    mi = load_device("mi300x")
    t = float(collective_time_s("all_reduce", mb, group=8, link=link_for_group(mi, 8)))
    assert t == pytest.approx(17.6e-6 + 0.764 * 2 * 5e-6 + 14.353 * 8e6 / (0.727 * 448e9))
    assert t == pytest.approx(377.79e-6, rel=1e-4)
    # ... but a pair on the mesh gets one 64 GB/s link: n = 2 chunks of 32 MB
    t2 = float(collective_time_s("all_reduce", mb, group=2, link=link_for_group(mi, 2)))
    assert t2 == pytest.approx(17.6e-6 + 0.764 * 2 * 5e-6 + 2.353 * 32e6 / (0.727 * 64e9))
    assert t2 == pytest.approx(1643.5e-6, rel=1e-4)
    # MI250X: two dies of one package talk over the 200 GB/s die link
    assert link_for_group(load_device("mi250x"), 2).name == "die-to-die"
    # L40S has no scale-up link: TP goes over the NIC/PCIe
    assert link_for_group(load_device("l40s"), 2).topology != "none"
    # 16 H100s exceed one NVLink domain: scale-out NIC (50 GB/s, L = 5 µs), ring of
    # s = n = 2 · 15
    nic = link_for_group(h100, 16)
    assert nic.bw_per_direction_bytes_per_s == 50e9
    t16 = float(collective_time_s("all_reduce", mb, group=16, link=nic))
    assert t16 == pytest.approx(17.6e-6 + 0.764 * 30 * 5e-6 + 30.353 * 4e6 / (0.727 * 50e9))
    assert t16 == pytest.approx(3472.3e-6, rel=1e-4)


def test_padded_rows_kept_result_is_the_computed_one() -> None:
    """A step pads the same token rows for GEMM after GEMM, so the last call's result is
    kept: equal rows (another array) give it again, other rows or tiles are computed, the
    kept result cannot be changed, and changing the caller's array changes nothing kept."""
    m = np.array([0.0, 1.0, 17.0, 129.0, 300.0])
    first = padded_rows(m)
    assert first.tolist() == [0.0, 16.0, 32.0, 256.0, 384.0]  # hand: tiles 16, 32, 128
    again = padded_rows(m.copy())
    assert again is first and not again.flags.writeable
    with pytest.raises(ValueError):
        again[0] = 1.0
    m[2] = 100.0  # the caller's array changes: the kept rows are a copy
    assert padded_rows(m).tolist() == [0.0, 16.0, 128.0, 256.0, 384.0]
    # same rows, other tiles: computed for those tiles (one tile of 64 rows)
    assert padded_rows(m, max_tile=64, min_tile=64).tolist() == [0.0, 64.0, 128.0, 192.0, 320.0]
    assert padded_rows(np.array(5.0)).shape == ()  # a 0-d array is not the 1-D one before
    assert float(padded_rows(np.array(5.0))) == 16.0
    # predict gemm's million shapes: padded, not kept (no copy held, a writable result)
    big = np.full(KEPT_PADDING_MAX_ROWS + 1, 3.0)
    rows = padded_rows(big)
    assert rows.flags.writeable and padded_rows(big) is not rows and float(rows[0]) == 16.0
