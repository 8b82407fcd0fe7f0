"""`gptrain train` end to end with FP8 on the CPU: torchao's emulated float8 matmuls (model.fp8_emulate)."""

from __future__ import annotations

import math

import pytest
from train_e2e_helpers import MOCK, run_recording, tiny_config

from gptrain.errors import ConfigError
from gptrain.train import loop

pytest.importorskip("torchao")

# hidden 32, ffn 128: every block linear is a multiple of 16 and becomes a Float8Linear
NO_DROPOUT = ["model.hidden_dropout=0", "model.attention_dropout=0", *MOCK]


def test_fp8_emulated_run_trains_near_the_plain_run(tmp_path, monkeypatch):
    plain_code, plain = run_recording(monkeypatch, tiny_config(tmp_path / "plain", *NO_DROPOUT))
    fp8_code, fp8 = run_recording(
        monkeypatch,
        tiny_config(tmp_path / "fp8", *NO_DROPOUT, "model.fp8=true", "model.fp8_emulate=true"),
    )
    assert plain_code == fp8_code == 0
    assert sorted(fp8) == sorted(plain) == list(range(1, 7))
    assert all(math.isfinite(loss) for loss in fp8.values())
    # float8 really ran: e4m3 keeps 3 mantissa bits, so the first forward's loss moves
    assert fp8[1] != plain[1]
    # ... by float8 rounding averaged over 32-term dot products, far below the loss's own scale
    # (ln 100 = 4.6): 1% is over 100x what was measured (at most 8e-5)
    for step, loss in plain.items():
        assert fp8[step] == pytest.approx(loss, rel=1e-2), step


def test_fp8_without_emulation_is_still_a_one_line_error_on_cpu(tmp_path):
    cfg = tiny_config(tmp_path / "fp8", *NO_DROPOUT, "model.fp8=true")
    with pytest.raises(ConfigError, match=r"set model.fp8=false \(model.fp8_emulate=true") as error:
        loop.train(cfg)
    assert "\n" not in str(error.value)
