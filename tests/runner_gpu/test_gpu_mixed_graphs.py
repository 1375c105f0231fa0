"""Graphed mixed batches (appends next to decodes) on a GPU: parity with eager, syncs, fallback.

Strategy: two runners over the same weights, mixed graphs on (the default) and off (those
batches then run eagerly through the same kernels), serve the same duplex-like traffic:
sessions with a long first prompt (> 32 rows, eager on both), then steps where a few sessions
append 13-14 rows (some as injected embeddings, some unsampled) next to the others' decodes,
with hidden capture, greedy, seeded top-k/top-p (device sampler) and hooked (host sampler)
rows, and sessions finishing and joining. Graphed and eager runs may differ in rounding only
(another split count, another matmul row count), so in float32 the tokens must be equal and
in bf16 the hidden states within bf16 tolerance, a token may differ only at a near-tie. A
graphed mixed step must queue its work without a host sync (sync debug mode "error"), and a
bucket whose capture fails must stay eager while the others replay. Skipped without CUDA.
"""

from __future__ import annotations

import random

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

from gpu_models import runner_for  # noqa: E402
from no_sync import launch_without_host_sync  # noqa: E402

import backends.runner.mixed_graphs as mixed_graphs  # noqa: E402
from backends.runner.types import SampleContext, SamplingParams, StepInput  # noqa: E402

FP32_REL = 3e-3  # as tests/runner_gpu/test_gpu_runner.py
BF16_REL = 3e-2
TIE = 0.05  # a bf16 token flip is accepted only if the two logits are this close
SETTINGS = dict(max_model_len=512, num_blocks=8 * 32)  # 8 slots x 512 tokens


def rel_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    got, ref = got.detach().double().cpu(), ref.detach().double().cpu()
    return float((got - ref).norm() / ref.norm().clamp_min(1e-30))


class BanHook:
    """Bans one token: a host-only policy, so its rows are sampled on the host."""

    def before_sample(self, logits: torch.Tensor, ctx: SampleContext) -> int | None:
        logits[7] = float("-inf")
        return None

    def after_sample(self, token: int, ctx: SampleContext) -> int:
        return token


def params_for(serial: int) -> tuple[SamplingParams, BanHook | None]:
    if serial % 4 == 1:
        return SamplingParams(temperature=0.8, top_k=40, top_p=0.9, seed=serial), None
    return SamplingParams(), (BanHook() if serial % 4 == 3 else None)


class Traffic:
    """Duplex-like steps, a pure function of the seed and the tokens fed back."""

    def __init__(self, seed: int, model) -> None:
        self.rnd = random.Random(seed)
        self.model = model
        self.serial = 0

    def join(self, runner, last: dict[str, int | None]) -> list[StepInput]:
        """New sessions up to 6; each starts with a long prompt (eager on both runners)."""
        prompts = []
        while len(last) < 6:
            rid, self.serial = f"s{self.serial}", self.serial + 1
            params, hook = params_for(self.serial)
            runner.add_request(rid, params, hook=hook)
            last[rid] = None
            prompts.append(StepInput(rid, [self.rnd.randint(1, 500) for _ in range(40)]))
        return prompts

    def step(self, last: dict[str, int | None]) -> list[StepInput]:
        """1-3 sessions append 13-14 rows, the others decode their last token."""
        appending = set(self.rnd.sample(sorted(last), self.rnd.randint(1, 3)))
        return [self._append(rid) if rid in appending or tok is None
                else StepInput(rid, [tok], capture_hidden=True)
                for rid, tok in last.items()]  # fmt: skip

    def _append(self, rid: str) -> StepInput:
        rows = self.rnd.choice([13, 13, 14])
        ids = [self.rnd.randint(1, 500) for _ in range(rows)]
        embeds = None
        if self.rnd.random() < 0.4:  # injected rows (audio features in the real stage)
            with torch.no_grad():
                embeds = self.model.embed_tokens(torch.tensor(ids, device="cuda")).cpu()
        return StepInput(rid, ids, embeds, sample=self.rnd.random() < 0.85, capture_hidden=True)


def serve(runner, model, seed: int, num_steps: int, forced=None):
    """Serve the traffic; returns per step [(request, positions, token, hidden)]. With
    `forced` (another serve's log) each session is fed that run's tokens instead of its own,
    so a bf16 near-tie flip cannot change the later inputs."""
    traffic, last, log = Traffic(seed, model), {}, []
    for step in range(num_steps):
        prompts = traffic.join(runner, last)
        inputs = prompts if prompts else traffic.step(last)
        results = runner.step(inputs)
        log.append([(r.request_id, r.positions, r.token, r.hidden) for r in results])
        source = forced[step] if forced is not None else log[-1]
        for rid, _, token, _ in source:
            last[rid] = token if token is not None else last[rid]
        if step % 4 == 3:
            done = traffic.rnd.choice(sorted(last))
            runner.free_request(done)
            del last[done]
    return log


def pair(make_gpu_model, dtype):
    model = make_gpu_model(dtype)
    graphed = runner_for(model, **SETTINGS)
    eager = runner_for(model, **SETTINGS, mixed_cuda_graphs=False)
    mixed = graphed.fast_path.mixed
    assert mixed is not None and mixed.num_captured == len(mixed.buckets) and not mixed.failed, (
        f"mixed graphs not all captured: {mixed and mixed.failed}"
    )
    assert eager.fast_path.mixed is None
    return model, graphed, eager


def test_random_traffic_float32_same_tokens(make_gpu_model) -> None:
    model, graphed, eager = pair(make_gpu_model, torch.float32)
    expected = serve(eager, model, seed=11, num_steps=14)
    got = serve(graphed, model, seed=11, num_steps=14)
    assert graphed.fast_path.mixed.num_replays >= 8, "the mixed steps were not graphed"
    for step, (g_step, e_step) in enumerate(zip(got, expected)):
        for (rid, pos_g, tok_g, hid_g), (_, pos_e, tok_e, hid_e) in zip(g_step, e_step):
            where = f"step {step}, request {rid}"
            assert (pos_g, tok_g) == (pos_e, tok_e), f"{where}: graphed vs eager differ"
            if hid_e is not None:
                assert rel_error(hid_g, hid_e) < FP32_REL, f"{where}: hidden rows differ"


def test_random_traffic_bf16_within_tolerance(make_gpu_model) -> None:
    model, graphed, eager = pair(make_gpu_model, torch.bfloat16)
    expected = serve(eager, model, seed=12, num_steps=14)
    got = serve(graphed, model, seed=12, num_steps=14, forced=expected)
    assert graphed.fast_path.mixed.num_replays >= 8, "the mixed steps were not graphed"
    for step, (g_step, e_step) in enumerate(zip(got, expected)):
        for (rid, pos_g, tok_g, hid_g), (_, pos_e, tok_e, hid_e) in zip(g_step, e_step):
            where = f"step {step}, request {rid}"
            assert pos_g == pos_e, where
            if hid_e is None:  # a first prompt (no capture)
                continue
            assert rel_error(hid_g, hid_e) < BF16_REL, f"{where}: hidden rows differ"
            logits_g, logits_e = (model.compute_logits(h[-1:].to("cuda", torch.bfloat16))[0]
                                  for h in (hid_g, hid_e))  # fmt: skip
            assert rel_error(logits_g, logits_e) < BF16_REL, f"{where}: logits differ"
            if tok_g != tok_e and tok_e is not None:  # only a near-tie may flip
                gap = float(logits_e[tok_e] - logits_e[tok_g])
                assert abs(gap) <= TIE * float(logits_e.abs().max()), (
                    f"{where}: token {tok_g} (graphed) vs {tok_e} (eager), logit gap {gap}"
                )


def test_graphed_mixed_step_has_no_host_sync(make_gpu_model) -> None:
    model = make_gpu_model(torch.bfloat16)
    runner = runner_for(model, **SETTINGS)
    runner.add_request("greedy", SamplingParams())
    runner.add_request("seeded", SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=3))
    runner.add_request("hooked", SamplingParams(), hook=BanHook())
    first = runner.step([StepInput(r, list(range(3, 40))) for r in ("greedy", "seeded", "hooked")])
    with torch.no_grad():
        injected = model.embed_tokens(torch.arange(13, device="cuda")).cpu()
    feed = [
        StepInput("greedy", [0] * 13, injected, capture_hidden=True),
        StepInput("seeded", [first[1].token], capture_hidden=True),
        StepInput("hooked", [first[2].token]),
    ]
    runner.step(feed)  # warms this bucket's eager sampling kernels up
    mixed = runner.fast_path.mixed
    before = mixed.num_replays
    pending = launch_without_host_sync(runner, feed)
    results = pending.wait()
    assert mixed.num_replays == before + 1, "the step did not replay a mixed graph"
    assert all(r.token is not None for r in results)
    assert results[0].hidden is not None and results[0].hidden.shape[0] == 13


def test_failed_capture_leaves_the_bucket_eager(make_gpu_model, monkeypatch, caplog) -> None:
    model = make_gpu_model(torch.float32)
    real = mixed_graphs.capture_graph
    calls = []

    def flaky(run, pool, warmup_steps, side=None):
        calls.append(1)
        if len(calls) in (1, 2, 4):  # largest first: (8, 256), (8, 128) and (8, 64)
            raise RuntimeError("injected capture failure")
        return real(run, pool, warmup_steps, side)

    monkeypatch.setattr(mixed_graphs, "capture_graph", flaky)
    graphed = runner_for(model, **SETTINGS)
    mixed = graphed.fast_path.mixed
    assert mixed.failed == [(8, 256), (8, 128), (8, 64)], mixed.failed
    assert mixed.num_captured == len(mixed.buckets) - 3
    assert sum("mixed CUDA graph capture failed" in r.message for r in caplog.records) == 1
    eager = runner_for(model, **SETTINGS, mixed_cuda_graphs=False)
    # 6 sessions: up to 32 rows replay bucket (8, 32), 33-45 rows run eagerly
    expected = serve(eager, model, seed=13, num_steps=10)
    got = serve(graphed, model, seed=13, num_steps=10)
    assert mixed.num_replays > 0, "no mixed step replayed a graph"
    assert [[r[:3] for r in s] for s in got] == [[r[:3] for r in s] for s in expected]
