"""The link profiler over gloo between two local processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from typer.testing import CliRunner  # noqa: E402

from api.cli import app  # noqa: E402
from profiles.link_profiler import (  # noqa: E402
    LinkPoint,
    LinkProfile,
    bus_bandwidth_factor,
    link_row,
)


def test_bus_bandwidth_factor_is_nccl_tests_2_n_minus_1_over_n() -> None:
    assert bus_bandwidth_factor(2) == 1.0
    assert bus_bandwidth_factor(8) == 1.75


def fake_profile() -> LinkProfile:
    def point(size: int, one_way_us: float) -> LinkPoint:
        return LinkPoint(size_bytes=size, p2p_one_way_us=one_way_us,
                         p2p_gb_per_s=size / one_way_us / 1e3, allreduce_us=2 * one_way_us,
                         allreduce_algbw_gb_per_s=size / (2 * one_way_us) / 1e3,
                         allreduce_busbw_gb_per_s=size / (2 * one_way_us) / 1e3)
    return LinkProfile(world_size=2, backend="gloo", device="cpu",
                       points=[point(8, 50.0), point(64, 40.0), point(2**20, 500.0)])


def test_link_row_takes_large_message_bandwidth_and_small_message_latency() -> None:
    row = link_row(fake_profile(), scope="intra_node", gpu_type="cpu")
    assert row["latency_us"] == 40.0  # the fastest small message, not the 1 MiB one
    assert row["bandwidth_gb_per_s"] == round(2**20 / 500.0 / 1e3, 4)
    assert row["x_source"] == "measured"


def test_link_row_needs_what_its_scope_needs() -> None:
    with pytest.raises(ValueError, match="--gpu-type"):
        link_row(fake_profile(), scope="intra_node")
    with pytest.raises(ValueError, match="--zones"):
        link_row(fake_profile(), scope="inter_zone")
    with pytest.raises(ValueError, match="use one of"):
        link_row(fake_profile(), scope="rack")
    row = link_row(fake_profile(), scope="inter_zone", zones=("east", "west"))
    assert row["zones"] == ["east", "west"] and "gpu_type" not in row


def test_profile_links_command_measures_gloo_between_two_processes(tmp_path: Path) -> None:
    out = tmp_path / "links.json"
    result = CliRunner().invoke(app, ["profile", "links", "--scope", "inter_node",
                                      "--sizes", "64,1048576", "--repeats", "3", "-o", str(out)])
    assert result.exit_code == 0, result.output
    document = json.loads(out.read_text())
    (row,) = document["links"]
    assert row["scope"] == "inter_node" and "gpu_type" not in row
    assert row["bandwidth_gb_per_s"] > 0 and row["latency_us"] > 0
    assert row["x_backend"] == "gloo"
    sizes = [m["size_bytes"] for m in document["measurements"]]
    assert sizes == [64, 1048576]
    for m in document["measurements"]:
        # Two ranks: bus bandwidth equals algorithm bandwidth.
        assert m["allreduce_busbw_gb_per_s"] == pytest.approx(m["allreduce_algbw_gb_per_s"])
        assert m["p2p_one_way_us"] > 0
