"""The GPU memory plan: its pools equal what the CPU stages allocate for the tiny checkpoint,
and the released sizes fit (or not) the H200 and H100 as expected."""
from __future__ import annotations

import pytest
import torch

from backends.serving.memory_plan import (
    EXACT_MARGIN, GIB, MAX_GPU_SHARE, SAFETY_MARGIN, MemoryPlanError, PlanInputs, code2wav_bytes, full_random_inputs,
    encoder_cache_bytes, largest_fitting_sessions, main, plan, planned_shares, talker_bytes, thinker_bytes,
    thinker_fixed_workspace,
)
from backends.serving.profiles import get_profile
from backends.stages.factory import (
    StageSetup, build_code2wav_engine, build_talker_engine, build_thinker_engine, pool_bytes,
)

H200, H100 = round(139.8 * GIB), round(79.2 * GIB)
SESSIONS = 2
PARAMS = {"checkpoint": "tiny", "max_sessions": str(SESSIONS), "max_context_tokens": "200",
          "talker_context_tokens": "100"}


@pytest.fixture(scope="module")
def tiny_inputs() -> PlanInputs:
    setup = StageSetup.from_params(PARAMS)
    ckpt = setup.load()
    from backends.models.token2wav import Token2WavConfig

    return PlanInputs(ckpt.config.raw, Token2WavConfig.tiny(), SESSIONS, 200, 100, dtype_bytes=4, null_blocks=0)


def _param_bytes(module: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def test_thinker_kv_pool_equals_the_engines_allocation(tiny_inputs: PlanInputs) -> None:
    engine = build_thinker_engine(PARAMS)
    assert thinker_bytes(tiny_inputs).state == engine.runner.kv.num_bytes()


def test_thinker_weights_equal_the_models_parameters(tiny_inputs: PlanInputs) -> None:
    from backends.thinker.model import ThinkerModel

    model = ThinkerModel.from_checkpoint(StageSetup.from_params(PARAMS).load(), torch.device("cpu"), torch.float32)
    actual = _param_bytes(model.llm) + _param_bytes(model.audio_encoder)
    assert abs(thinker_bytes(tiny_inputs).weights - actual) <= SAFETY_MARGIN * actual


def test_talker_kv_pool_and_weights_equal_the_engines(tiny_inputs: PlanInputs) -> None:
    engine = build_talker_engine(PARAMS)
    planned = talker_bytes(tiny_inputs)
    assert planned.state == engine.runner.kv.num_bytes()
    assert planned.weights == _param_bytes(engine.runner.model)


def test_code2wav_pool_equals_the_engines_allocation(tiny_inputs: PlanInputs) -> None:
    service = build_code2wav_engine(PARAMS)
    token2wav = service.engine.token2wav
    inputs = PlanInputs(tiny_inputs.config, token2wav.config, SESSIONS, 200, 100, dtype_bytes=4, null_blocks=0)
    assert code2wav_bytes(inputs).state == pool_bytes(token2wav.cache_pool) > 0


@pytest.mark.parametrize(("sessions", "window", "device", "fits"), [
    (32, 8192, H200, True),  # the gpu profile's sizes
    (32, 8192, H100, False),
    (128, 4096, H200, False),  # 73 GiB of Thinker KV and 63 GiB of Code2Wav caches
    (128, 4096, H100, False),
    (16, 4096, H100, True),
])
def test_released_sizes_fit_as_expected(sessions: int, window: int, device: int, fits: bool) -> None:
    inputs = full_random_inputs(sessions, window, 1024)
    result = plan(inputs, device)
    assert result.fits is fits
    if fits:
        shares = planned_shares(inputs, device)
        assert sum(shares.values()) <= MAX_GPU_SHARE
        for stage in result.stages:  # each stage gets at least what it plans
            assert shares[stage.stage] * device >= stage.total * 0.999
    else:
        with pytest.raises(MemoryPlanError, match=r"largest session count that fits is \d+"):
            planned_shares(inputs, device)


def test_a_smaller_code2wav_pool_is_planned_and_built() -> None:
    """`code2wav_streams` slots instead of two per session: the plan counts what the stage builds."""
    two_per_session, sized = full_random_inputs(128, 4096, 1024), full_random_inputs(128, 4096, 1024, 2, 64)
    assert code2wav_bytes(sized).state * 4 == code2wav_bytes(two_per_session).state
    service = build_code2wav_engine({**PARAMS, "pool_streams": "3"})
    token2wav = service.engine.token2wav
    inputs = PlanInputs({}, token2wav.config, SESSIONS, 200, 100, dtype_bytes=4, code2wav_streams=3)
    assert token2wav.cache_pool.max_streams == 3 and code2wav_bytes(inputs).state == pool_bytes(token2wav.cache_pool)


def test_the_largest_fitting_count_fits_and_one_more_does_not() -> None:
    inputs = full_random_inputs(128, 4096, 1024)
    largest = largest_fitting_sessions(inputs, H200)
    assert 32 < largest < 128
    assert plan(full_random_inputs(largest, 4096, 1024), H200).fits
    assert not plan(full_random_inputs(largest + 1, 4096, 1024), H200).fits


def test_the_thinker_kv_is_144_kib_per_token() -> None:
    """Qwen3-8B bf16: 36 layers x K and V x 8 heads x 128 x 2 bytes; 34 slots x 8192 tokens."""
    state = thinker_bytes(full_random_inputs(32, 8192, 4096)).state
    assert state == 36 * 2 * 8 * 128 * 2 * (34 * 8192 + 16)


def test_the_encoder_cache_is_what_a_session_allocates() -> None:
    """One streaming encoder cache at the released sizes (bf16): 2 x 24 layers x 16 heads x
    1500 positions x 64, exactly the tensors EncoderKVCache allocates."""
    from backends.checkpoint.full_random import full_random_config_dict
    from backends.models.encoder_kv import EncoderKVCache
    from backends.models.whisper_encoder import WhisperEncoderConfig

    audio = full_random_config_dict(0, 0)["audio_config"]
    cache = EncoderKVCache.allocate(WhisperEncoderConfig.from_dict(audio), torch.bfloat16, torch.device("meta"))
    assert encoder_cache_bytes(audio, 2) == cache.keys.nbytes + cache.values.nbytes == 2 * 24 * 16 * 1500 * 64 * 2


def test_the_thinker_workspace_grows_by_one_encoder_cache_per_session() -> None:
    config = full_random_inputs(1, 4096, 1024).config
    one, more = (thinker_bytes(full_random_inputs(n, 4096, 1024)) for n in (32, 33))
    vocab_row = config["vocab_size"] * 4  # one more float32 logits row
    assert more.workspace - one.workspace == encoder_cache_bytes(config["audio_config"], 2) + vocab_row
    assert 3 * GIB < thinker_fixed_workspace(config) < 4 * GIB


def test_the_planned_profile_renders_the_plans_shares() -> None:
    profile = get_profile("gpu-h200")
    values = profile.template_vars()
    shares = profile.memory_plan().shares()
    for stage in ("thinker", "talker", "code2wav"):
        assert float(values[f"{stage}_memory_fraction"]) == shares[stage]
    assert values["sliding_window_mode"] == "basic" and values["max_context_tokens"] == "4096"


def test_an_explicit_fraction_overrides_the_plan() -> None:
    values = get_profile("gpu-h200").with_overrides({"talker_memory_fraction": "0.02"}).template_vars()
    assert values["talker_memory_fraction"] == "0.02"


def test_a_profile_that_does_not_fit_fails_to_render_naming_the_largest_count() -> None:
    profile = get_profile("gpu-h200").with_overrides({"max_sessions": "128"})
    with pytest.raises(MemoryPlanError, match="largest session count that fits"):
        profile.template_vars()


def test_the_hand_tuned_profiles_keep_their_fractions() -> None:
    values = get_profile("gpu").template_vars()
    assert (values["thinker_memory_fraction"], values["talker_memory_fraction"],
            values["code2wav_memory_fraction"]) == ("0.5", "0.12", "0.33")


def test_the_table_prints(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--profile", "gpu-h200", "--device-gib", "139.8"])
    out = capsys.readouterr().out
    assert "| thinker |" in out and "shares: thinker" in out


def test_the_table_takes_other_windows(capsys: pytest.CaptureFixture[str]) -> None:
    """128 sessions on an H200 at a 4096-token Thinker window with a 512-token Talker: with a
    quarter of them decoding audio at once, not with every one of them."""
    main(["--sessions", "128", "--code2wav-streams", "32", "--talker-window", "512"])
    assert "all (128 sessions)" in (out := capsys.readouterr().out) and "(fits)" in out
    main(["--sessions", "128", "--code2wav-streams", "128", "--talker-window", "512"])
    assert "does not fit" in capsys.readouterr().out


def test_the_margin_is_mostly_on_what_the_plan_estimates() -> None:
    """Pools and weights are computed as allocated, so more cache slots add 1 % of their bytes
    to the margin, a larger workspace 10 %."""
    small, large = (code2wav_bytes(full_random_inputs(16, 4096, 1024, code2wav_streams=n)) for n in (16, 32))
    assert large.workspace == small.workspace
    assert large.margin - small.margin == pytest.approx(EXACT_MARGIN * (large.state - small.state), abs=1)
    assert small.margin == pytest.approx(SAFETY_MARGIN * small.workspace + EXACT_MARGIN * small.state, abs=1)


def test_the_h100_benchmark_sizing_is_a_plan_that_fits() -> None:
    """scripts/gpu_duplex_bench.sh's H100_SETS (the gpu profile at 24 sessions, hand-set
    shares): the plan for an 80 GB card holds those sessions, and the shares leave the card's
    reserve."""
    import re
    from pathlib import Path

    script = (Path(__file__).resolve().parents[2] / "scripts" / "gpu_duplex_bench.sh").read_text()
    sets = re.search(r'^H100_SETS="([^"]*)"', script, re.M).group(1)
    profile = get_profile("gpu").with_overrides(dict(item.split("=", 1) for item in sets.split()))
    values = profile.template_vars()
    shares = [float(values[f"{stage}_memory_fraction"]) for stage in ("thinker", "talker", "code2wav")]
    assert 0 < min(shares) and sum(shares) <= MAX_GPU_SHARE
    assert profile.with_overrides({"gpu_memory_gib": "79.2"}).memory_plan().fits
