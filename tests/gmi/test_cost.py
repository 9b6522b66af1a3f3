"""The cost model of GMI-DRL §5.1 against values worked out by hand from Tables 4-5, eqs. 1-3."""

import math

import pytest

from gmi_drl.gmi.cost import (CostTemplate, Terms, allreduce_bytes, comm_bytes,
                              dominant_resource, resource_size, scaled_to_share, throughput)

# the paper's empirical ratios: Rs = 10 Ra = 5 Rt, Ts = 6 Ta = 3 Tt, alpha 0.2, beta 0.3
T = Terms(t_s=6.0, t_a=1.0, t_t=2.0, r_s=0.5, r_a=0.05, r_t=0.1, state_bytes=40,
          action_bytes=12, reward_bytes=4, model_bytes=1000, steps=100, num_gmis=4,
          alpha=0.2, beta=0.3)


def test_table_4_serving():
    # TDG: (6 * 0.5 + 1 * 0.2 * 0.05) / 7 = 3.01 / 7; COM = 2 * 40 + 12 + 4
    assert resource_size(CostTemplate.TDG, T) == pytest.approx(3.01 / 7)
    assert comm_bytes(CostTemplate.TDG, T) == 96
    assert resource_size(CostTemplate.TCG, T) == 0.5
    assert comm_bytes(CostTemplate.TCG, T) == 0


def test_table_5_training():
    # TDG_EX: (6 * 0.5 + 1 * 0.2 * 0.05 + 2 * 0.3 * 0.1) / 9 = 3.07 / 9
    assert resource_size(CostTemplate.TDG_EX, T) == pytest.approx(3.07 / 9)
    # m (S + A + W) + Mp + 2 (n - 1) Mp / n = 100 * 56 + 1000 + 1500
    assert comm_bytes(CostTemplate.TDG_EX, T) == pytest.approx(8100)
    assert resource_size(CostTemplate.TCG_EX, T) == 0.5
    assert comm_bytes(CostTemplate.TCG_EX, T) == pytest.approx(1500)
    assert allreduce_bytes(1000, 1) == 0


def test_equations_2_and_3():
    bw = 1000.0  # bytes/s
    # eq. 2, TCG: (R_all / R) / (Ts + Ta) = (1 / 0.5) / 7
    assert throughput(CostTemplate.TCG, T, bw) == pytest.approx(2 / 7)
    # eq. 2, TDG: (7 / 3.01) / (7 + 96 / 1000)
    assert throughput(CostTemplate.TDG, T, bw) == pytest.approx((7 / 3.01) / 7.096)
    # eq. 3, TCG_EX with 2 devices: (2 / 0.5) / (9 + 1.5)
    assert throughput(CostTemplate.TCG_EX, T, bw, r_all=2) == pytest.approx(4 / 10.5)
    # eq. 3, TDG_EX: (9 / 3.07) / (9 + 8.1)
    assert throughput(CostTemplate.TDG_EX, T, bw) == pytest.approx((9 / 3.07) / 17.1)
    assert throughput(CostTemplate.TCG_EX, T, math.inf) == pytest.approx(2 / 9)
    with pytest.raises(ValueError, match="bandwidth"):
        throughput(CostTemplate.TCG, T, 0)


def test_the_papers_conclusion_tcg_ex_beats_tdg_ex_when_com_is_large():
    # §5.1: with COM / BW about 7 (Ts + Ta + Tt), TCG_EX is several times TDG_EX
    bw = comm_bytes(CostTemplate.TDG_EX, T) / (7 * T.time_s)
    ratio = throughput(CostTemplate.TCG_EX, T, bw) / throughput(CostTemplate.TDG_EX, T, bw)
    assert ratio > 2


def test_equation_1_dominant_resource():
    assert dominant_resource(66, 132, 10, 80) == "sm"  # 0.5 >= 0.125
    assert dominant_resource(13, 132, 40, 80) == "memory"
    with pytest.raises(ValueError):
        dominant_resource(1, 0, 1, 1)


def test_scaled_to_share_stretches_the_roles_that_needed_more():
    t = Terms(t_s=1.0, t_a=2.0, t_t=3.0, r_s=0.9, r_a=0.3, r_t=0.5)
    half = scaled_to_share(t, 0.5)
    assert (half.t_s, half.t_a, half.t_t) == pytest.approx((1.8, 2.0, 3.0))
    assert (half.r_s, half.r_a, half.r_t) == (0.5, 0.3, 0.5)
    # two half-device GMIs: (1 / 0.5) / 6.8 iterations/s
    assert throughput(CostTemplate.TCG_EX, half, math.inf) == pytest.approx(2 / 6.8)
    with pytest.raises(ValueError):
        scaled_to_share(t, 0)
