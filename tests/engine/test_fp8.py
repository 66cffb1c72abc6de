"""`--dtype fp8` on the CPU: the FP8 arithmetic (e4m3 weights per output channel, activations
per token) emulated with the GPU's rounding, judged by the start-up fidelity check, and the
fall-back to 16-bit matmuls where the check fails."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

import rose
from rose.ops import fp8
from rose.serving import fidelity
from support import cosines, encode, save_tiny_bert, varied_texts


def test_row_quantization_keeps_each_token_within_e4m3s_precision() -> None:
    x = torch.randn(33, 256) * torch.logspace(-3, 3, 33)[:, None]  # rows of very different scales
    q, scale = fp8.quantize_rows_reference(x)
    assert q.dtype == fp8.FP8 and scale.shape == (33, 1)
    back = q.float() * scale
    # e4m3 keeps 3 mantissa bits: a relative error up to 2^-4, here on each row's largest values.
    assert torch.allclose(back.abs().amax(1), x.abs().amax(1), rtol=1e-6)
    assert ((back - x).abs() <= x.abs() * 2**-4 + scale * 2**-9).all()


def test_an_fp8_layer_follows_the_float32_product() -> None:
    torch.manual_seed(0)
    weight, bias, x = torch.randn(96, 64), torch.randn(96), torch.randn(40, 64)
    layer = fp8.Fp8Linear(weight, bias, torch.float32)
    assert layer.enabled and layer.qweight.dtype == fp8.FP8
    got, expected = layer(x), F.linear(x, weight, bias)
    assert float(F.cosine_similarity(got, expected).min()) > 0.998
    assert not torch.equal(got, expected)  # the product did go through e4m3
    narrow = fp8.Fp8Linear(torch.randn(10, 64), None, torch.float32)  # 10 outputs: no FP8 GEMM takes it
    assert not narrow.enabled and torch.equal(narrow(x), F.linear(x, narrow.weight))


def test_fp8_that_holds_the_fidelity_bound_is_served_and_reported(tmp_path: Path) -> None:
    folder = save_tiny_bert(tmp_path / "bert", "mean")  # random weights: no outlier features
    engine = rose.Engine(folder, device="cpu", dtype="fp8")
    assert engine.dtype_name == "fp8 (e4m3 matmuls, float32 activations)"
    report = engine.fidelity
    assert report is not None and report["fallbacks"] == [] and "fp8" in report["path"]
    assert fidelity.THRESHOLD <= report["worst_cosine"] < 0.9999999, report  # below 1: e4m3 did round
    texts = varied_texts(24)
    reference = encode(rose.Engine(folder, device="cpu", dtype="float32"), texts)
    assert fidelity.THRESHOLD <= float(cosines(encode(engine, texts), reference).min()) < 0.9999999


def test_fp8_that_fails_the_check_falls_back_to_16_bit_matmuls() -> None:
    # all-MiniLM-L6-v2's real weights: e4m3's 3 mantissa bits cost it ~1% of cosine on long inputs.
    engine = rose.Engine(device="cpu", dtype="fp8")
    report = engine.fidelity
    assert report is not None and report["fallbacks"][0]["path"].startswith("sdpa, fp8")
    assert 0.95 < report["fallbacks"][0]["worst_cosine"] < fidelity.THRESHOLD
    assert engine.dtype_name == "float32" and "fp8" not in report["path"]
    texts = varied_texts(8)
    reference = encode(rose.Engine(device="cpu", dtype="float32"), texts)
    np.testing.assert_allclose(encode(engine, texts), reference, atol=1e-5)


def test_a_rerankers_fp8_is_judged_on_its_scores_too(tmp_path: Path) -> None:
    # Under e4m3 the ModernBERT kind's scores (probabilities, as /rerank reports them) move by 0.6
    # (its states to cosine 0.996): refused, with both on record. The BERT kind's hold: served.
    from support import save_cross_encoder

    refused = rose.Engine(save_cross_encoder(tmp_path / "modernbert", "modernbert"), device="cpu", dtype="fp8")
    report = refused.fidelity
    assert report is not None and refused.dtype_name == "float32"
    assert report["fallbacks"][0]["worst_score_error"] > fidelity.SCORE_BOUND
    served = rose.Engine(save_cross_encoder(tmp_path / "bert", "bert"), device="cpu", dtype="fp8")
    report = served.fidelity
    assert report is not None and served.dtype_name.startswith("fp8") and not report["fallbacks"]
    assert 0 < report["worst_score_error"] <= report["score_bound"] == fidelity.SCORE_BOUND
