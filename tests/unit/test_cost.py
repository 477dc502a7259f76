"""Prices (catalog, TOML/CSV overrides) and the power/energy/money-per-token model."""

from __future__ import annotations

import pytest

from hardware.device import catalog_ids, load_device
from perfmodel.cost.power import DEFAULT_IDLE_FRACTION, PoolUse, cost_energy, power_model
from perfmodel.cost.prices import catalog_prices, load_prices
from perfmodel.errors import SpecError


def test_every_catalog_price_has_a_dated_source():
    priced = 0
    for i in catalog_ids():
        d = load_device(i)
        if d.price_per_hour_usd is None:
            continue
        priced += 1
        src = [s for s in d.sources if s.startswith("price_per_hour_usd")]
        assert src, f"{i}: price without a source"
        assert "202" in src[0], f"{i}: price source without a date"
    assert priced >= 8


def test_power_model_measured_and_assumed_idle():
    h200 = power_model(load_device("h200-sxm"))
    assert h200 is not None and h200.idle_source == "measured"
    # 80.3 W idle, 700 W TDP: at 50 % utilization 80.3 + 0.5 * 619.7 = 390.15 W
    assert h200.power_w(0.5) == pytest.approx(390.15)
    h100 = power_model(load_device("h100-sxm"))
    assert h100 is not None and h100.idle_source == "assumed"
    assert h100.idle_w == pytest.approx(DEFAULT_IDLE_FRACTION * 700.0)
    assert h100.power_w(1.0) == pytest.approx(700.0)
    assert h100.power_w(2.0) == pytest.approx(700.0)  # clipped


def test_cost_energy_by_hand():
    # 8 H200 at 50 % ($3.99/h each) serving 10 req/s of 200 output tokens:
    # $31.92/h over 2000 tok/s = 7.2e6 tok/h -> $4.4333/M tokens;
    # 8 x 390.15 W = 3121.2 W -> 1.5606 J/token, 74.909 kWh/day.
    d = load_device("h200-sxm")
    ce = cost_energy([PoolUse(d, 8, 0.5, 3.99)], rate_per_s=10.0, mean_output_tokens=200.0)
    assert ce.cost_per_hour_usd == pytest.approx(31.92)
    assert ce.cost_per_million_output_tokens_usd == pytest.approx(31.92 / 7.2)
    assert ce.power_w == pytest.approx(3121.2)
    assert ce.energy_j_per_output_token == pytest.approx(1.5606)
    assert ce.kwh_per_day == pytest.approx(3121.2 * 24 / 1000)
    unpriced = cost_energy([PoolUse(d, 8, 0.5, None)], rate_per_s=10.0, mean_output_tokens=200.0)
    assert unpriced.cost_per_hour_usd is None and unpriced.power_w is not None


def test_price_files_toml_and_csv(tmp_path):
    t = tmp_path / "p.toml"
    t.write_text("mi300x = 1.5\n[h100-sxm]\nprice_per_hour_usd = 2.5\nmax_devices = 16\n")
    book = catalog_prices([load_device("h100-sxm"), load_device("mi300x")]).override(load_prices(t))
    assert book.price("h100-sxm") == 2.5 and book.get("h100-sxm").max_devices == 16
    assert book.price("mi300x") == 1.5
    c = tmp_path / "p.csv"
    c.write_text("device,price_per_hour_usd,max_devices,min_devices\nl40s,1.1,,4\n")
    b2 = load_prices(c)
    assert b2.price("l40s") == 1.1 and b2.get("l40s").min_devices == 4
    assert b2.get("l40s").max_devices is None
    bad = tmp_path / "bad.csv"
    bad.write_text("device,price_per_hour_usd,max_devices\nl40s,abc,\n")
    with pytest.raises(SpecError, match="price_per_hour_usd must be a number"):
        load_prices(bad)
    bad2 = tmp_path / "bad.toml"
    bad2.write_text("[l40s]\nprice = 1.0\n")
    with pytest.raises(SpecError, match="unknown field"):
        load_prices(bad2)
    bad3 = tmp_path / "bad3.toml"
    bad3.write_text("[l40s]\nprice_per_hour_usd = 1.0\nmin_devices = 5\nmax_devices = 2\n")
    with pytest.raises(SpecError, match="exceeds max_devices"):
        load_prices(bad3)
