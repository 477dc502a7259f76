"""BurstGPT traces (Wang et al., 'BurstGPT: A Real-world Workload Dataset to Optimize
LLM Serving Systems', 2024): its CSV layout, failed requests, the per-model filter."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from perfmodel.errors import SpecError
from perfmodel.workload.trace import load_trace

ROWS = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5,ChatGPT,472,18,490,Conversation log
45,ChatGPT,1087,0,1087,Conversation log
118,GPT-4,417,30,447,Conversation log
125,ChatGPT,1360,211,1571,API log
212,ChatGPT,35,7,42,Conversation log
301,GPT-4,2011,512,2523,API log
"""


@pytest.fixture
def burst(tmp_path: Path) -> Path:
    p = tmp_path / "BurstGPT_1.csv"
    p.write_text(ROWS)
    return p


def test_all_models_and_failures(burst: Path) -> None:
    t = load_trace(burst)
    assert t.n == 5 and t.skipped == 1  # the 0-token response is a failure
    assert t.input_tokens.tolist() == [472, 417, 1360, 35, 2011]
    assert t.arrival_s.tolist() == [0, 113, 120, 207, 296]  # seconds from the first row
    assert t.rate_per_s == pytest.approx(4 / 296)


def test_per_model_filter(burst: Path) -> None:
    gpt4 = load_trace(burst, model="gpt-4")
    assert gpt4.output_tokens.tolist() == [30, 512] and gpt4.skipped == 0
    chat = load_trace(burst, model="ChatGPT")
    assert chat.n == 3 and chat.skipped == 1
    with pytest.raises(
        SpecError, match=r"no successful requests for model 'Claude' \(models: ChatGPT, GPT-4\)"
    ):
        load_trace(burst, model="Claude")


def test_bad_rows_and_filter_on_other_formats(burst: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text(ROWS.replace("417,30", "417,x"))
    with pytest.raises(
        SpecError, match=r"bad.csv:4: Timestamp, Request tokens and Response tokens"
    ):
        load_trace(bad)
    generic = tmp_path / "g.csv"
    generic.write_text("input_tokens,output_tokens\n10,2\n")
    with pytest.raises(SpecError, match="--trace-model applies to BurstGPT"):
        load_trace(generic, model="GPT-4")


def test_capacity_accepts_a_burstgpt_trace(burst: Path) -> None:
    r = CliRunner().invoke(
        app, ["capacity", "--trace", str(burst), "--trace-model", "ChatGPT", "--json"]
    )
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(app, ["capacity", "--trace", str(burst), "--trace-model", "Claude"])
    assert r.exit_code == 2 and "no successful requests" in r.output
