"""ROSE on the GPU, every attention backend: each sequence's vector against Hugging Face
transformers in float32 on the same weights (cosine >= 0.999), for Qwen3 at the
Qwen3-Embedding-0.6B shape (random weights) in both kinds and for MiniLM with its real weights."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
import torch

import rose
from rose.attention import BACKENDS, AttentionSpec, BackendUnavailable
from rose.attention.sdpa import SdpaBackend
from rose.batch import RaggedBatch
from rose.ops import kernels
from support import cosines, encode, save_qwen3, transformers_pooled, varied_texts

GPU_BACKENDS = ["fa2", "fa3", "fa4", "torch"]
THRESHOLD = 0.999


def mixed_sequences(count: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    lengths = [1, 2, 7, 31, 64, 127, 128, 129, 255, 512] + [rng.randint(8, 512) for _ in range(count - 10)]
    return [[rng.randrange(vocab) for _ in range(n)] for n in lengths]


def with_backend(engine: rose.Engine, name: str) -> rose.Engine:
    try:
        engine.use_attention(name)
    except BackendUnavailable as why:
        pytest.fail(f"{name} should load on this GPU: {why}")
    return engine


@pytest.fixture(scope="module", params=[False, True], ids=["causal", "bidirectional"])
def qwen3(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[rose.Engine, list, np.ndarray]:
    folder = save_qwen3(tmp_path_factory.mktemp("qwen3") / "qwen3-0.6b", "0.6b", request.param)
    sequences = mixed_sequences(24, 151669)
    expected = transformers_pooled(folder, sequences, device="cuda").numpy()
    torch.cuda.empty_cache()
    return rose.Engine(folder, device="cuda"), sequences, expected


@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_qwen3_06b_shape_matches_transformers(qwen3: tuple, backend: str) -> None:
    engine, sequences, expected = qwen3
    assert engine.dtype == torch.bfloat16
    vectors = with_backend(engine, backend).embed_ids(sequences)
    sims = cosines(vectors, expected)
    assert sims.min() >= THRESHOLD, f"{backend}: worst sequence of {len(sequences[sims.argmin()])} tokens: {sims.min()}"


def test_fa2_serves_as_the_first_backend_a_new_engine_runs(qwen3: tuple) -> None:
    # Found on the H200 (2026-12-03; the log is in git's history before 2c58b4d): fa2's first step
    # under lazy graphs faulted (illegal address) when an earlier FlashInfer backend was replaced
    # unused: its graph wrapper's pinned plan buffer, reused from the replaced one's, held stale
    # tiles (see the next test).
    engine = rose.Engine(qwen3[0].model_dir.path, device="cuda", verify=False, fused_decoder="off")
    sequences = qwen3[1]
    got = [with_backend(engine, "fa2").embed_ids(sequences) for _ in range(3)]
    torch.cuda.synchronize()
    assert min(float(cosines(g, qwen3[2]).min()) for g in got) >= THRESHOLD


@pytest.mark.parametrize("backend", ["fa2", "fa3"])
def test_a_graph_wrapper_replanned_with_fewer_tiles_reads_none_of_the_earlier_plan(backend: str) -> None:
    # FA2 in graph mode launches a block per tile the bucket could hold; without split-KV the
    # blocks past a plan's tiles read entries it did not write. A first plan whose last sequence
    # has 60 tiles, then one of short sequences only: its stale tiles lie past every sequence's end.
    # This aborted ivy-embed's in-process re-index of the Qwen3 shape under lazy graphs.
    spec = AttentionSpec(num_heads=16, num_kv_heads=8, head_dim=128, causal=False, dtype=torch.bfloat16)
    device = torch.device("cuda")
    rows, slots = 4096, 256
    graph_backend = BACKENDS[backend](spec, device).for_graph((rows, slots), None)
    generator = torch.Generator(device).manual_seed(0)
    for lengths in ([1] * (slots - 1) + [rows - slots + 1], [rows // slots] * slots):
        cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        batch = RaggedBatch.from_host(np.zeros(rows, np.int32), cu, device)
        q, k, v = (torch.randn(rows, h, 128, device=device, dtype=torch.bfloat16, generator=generator)
                   for h in (16, 8, 8))  # fmt: skip
        graph_backend.plan(batch)
        got = graph_backend(q, k, v)
        torch.cuda.synchronize()
        sdpa = SdpaBackend(spec, device)
        sdpa.plan(batch)
        want = sdpa(q, k, v)
        assert torch.allclose(got.float(), want.float(), atol=2e-2, rtol=2e-2), lengths[:3]


def test_the_products_epilogues_match_the_float32_arithmetic() -> None:
    # GELU_BIAS (tanh-approximated) for BERT's up-projection, beta = 1 for a decoder's residual add.
    from rose.models.layers import Linear, activated, add_linear_rmsnorm

    torch.manual_seed(0)
    cuda = dict(device="cuda", dtype=torch.bfloat16)
    x, w, bias = torch.randn(300, 768, **cuda), torch.randn(3072, 768, **cuda) / 28, torch.randn(3072, **cuda)
    residual, norm = torch.randn(300, 3072, **cuda), torch.rand(3072, **cuda) + 0.5
    assert kernels.fuses_epilogues(x)
    gelu = activated(Linear(w, bias, torch.bfloat16, torch.bfloat16), x, "gelu")
    want = torch.nn.functional.gelu(torch.nn.functional.linear(x.float(), w.float(), bias.float()))
    torch.testing.assert_close(gelu.float(), want, atol=3e-2, rtol=2e-2)
    want_residual = residual.float() + x.float() @ w.float().t()
    want = kernels.rmsnorm(want_residual.cpu(), norm.float().cpu(), 1e-6)
    got = add_linear_rmsnorm(Linear(w, None, torch.bfloat16, torch.bfloat16), x, residual, norm, 1e-6)
    torch.testing.assert_close(residual.float(), want_residual, atol=3e-2, rtol=2e-2)
    torch.testing.assert_close(got.float().cpu(), want, atol=3e-2, rtol=2e-2)


@pytest.mark.parametrize("backend", ["fa2", "fa3"])
@pytest.mark.parametrize("heads, kv_heads, head_dim", [(12, 12, 64), (16, 8, 128)], ids=["bert-base", "qwen3"])
def test_flashinfer_reads_q_k_and_v_in_place_from_the_fused_projection(
    backend: str, heads: int, kv_heads: int, head_dim: int
) -> None:
    # The backend hands FlashInfer strided views (no copies): the result must be the copies' exactly.
    spec = AttentionSpec(heads, kv_heads, head_dim, causal=head_dim == 128, dtype=torch.bfloat16)
    device = torch.device("cuda")
    lengths = [1, 7, 64, 129, 300, 511]
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    batch = RaggedBatch.from_host(np.zeros(int(cu[-1]), np.int32), cu, device)
    qkv = torch.randn(int(cu[-1]), (heads + 2 * kv_heads) * head_dim, device=device, dtype=torch.bfloat16)
    views = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=1)
    q, k, v = (t.view(-1, h, head_dim) for t, h in zip(views, (heads, kv_heads, kv_heads), strict=True))
    attention = BACKENDS[backend](spec, device)
    attention.plan(batch)
    got = attention(q, k, v)
    want = attention(q.contiguous(), k.contiguous(), v.contiguous())
    assert not v.is_contiguous() and torch.equal(got, want)


@pytest.mark.parametrize("backend", ["fa2", "fa3"])
def test_flashinfer_takes_a_step_of_hundreds_of_short_sequences(qwen3: tuple, backend: str) -> None:
    # FlashInfer plans without split-KV: with it, its scratch overflowed the workspace on such
    # steps under graphs (aligned_alloc), causal or not.
    engine = qwen3[0]
    rng = random.Random(5)
    sequences = [[rng.randrange(151669) for _ in range(rng.randint(20, 60))] for _ in range(400)]
    expected = with_backend(engine, "torch").embed_ids(sequences)
    got = with_backend(engine, backend).embed_ids(sequences)
    assert cosines(got, expected).min() >= THRESHOLD


def test_a_server_checks_and_serves_queries_first_and_long_batches_after_the_deferred_imports(qwen3: tuple) -> None:
    engine, sequences, expected = qwen3
    served = rose.Engine(engine.model_dir.path, device="cuda", defer_attention=True)
    assert served.attention.name == "auto(torch,triton)" and served.stats()["attention_deferred"] == ["fa2", "fa3"]
    # Start-up checks the single queries' path (the CUDA decoder): 1, 3, 8 and 16 tokens.
    assert served.fidelity["sequences"] == 4 and served.fidelity["tiers"] == ["single"]
    assert served.stats()["short_batches_pending"] and served.stats()["long_batches_pending"]
    served.startup._imports.result(timeout=300)
    served.embed_ids([[5] * 16])  # an online query waits for neither of the later checks
    assert served.stats()["short_batches_pending"] and served.attention.name == "auto(torch,triton)"
    served.embed_ids([[5] * 40])  # a short batch waits for its path's check (1+3+8+16+17 tokens), not the long one's
    short_batches = served.fidelity["short_batches"]
    assert short_batches["worst_cosine"] >= THRESHOLD and short_batches["sequences"] == 5
    assert not served.stats()["short_batches_pending"] and served.stats()["long_batches_pending"]
    assert served.attention.name == "auto(torch,triton)"
    vectors = served.embed_ids(sequences)
    assert served.attention.name == "auto(fa2,fa3,triton)" and not served.stats()["long_batches_pending"]
    long_batches = served.fidelity["long_batches"]
    assert long_batches["worst_cosine"] >= THRESHOLD and long_batches["sequences"] == 14
    assert cosines(vectors, expected).min() >= THRESHOLD


def test_a_long_warmup_bucket_imports_and_checks_everything_at_start(qwen3: tuple) -> None:
    engine, sequences, expected = qwen3
    served = rose.Engine(engine.model_dir.path, device="cuda", defer_attention=True, warmup=["512x8"])
    assert served.attention.name == "auto(fa2,fa3,triton)" and served.startup._imports is None
    assert served.fidelity["sequences"] == 14 and not served.stats()["long_batches_pending"]
    assert cosines(served.embed_ids(sequences), expected).min() >= THRESHOLD


def test_long_batches_that_diverge_fall_back_before_they_are_served(qwen3: tuple) -> None:
    engine, sequences, expected = qwen3
    served = rose.Engine(engine.model_dir.path, device="cuda", defer_attention=True)
    fixed, reference = served.startup._expected
    served.startup._expected = fixed, -reference  # every path diverges from this
    vectors = served.embed_ids(sequences)
    fallbacks = [f["path"].split(",")[0] for f in served.fidelity["long_batches"]["fallbacks"]]
    assert fallbacks == ["auto(fa2", "auto(fa2", "torch"]
    assert served.attention.name == "torch" and served.gpu.graphs is None
    assert cosines(vectors, expected).min() >= THRESHOLD


@pytest.fixture(scope="module")
def minilm() -> tuple[rose.Engine, list[str], np.ndarray]:
    from sentence_transformers import SentenceTransformer

    texts = varied_texts()
    reference = SentenceTransformer(str(rose.default_model_path()), device="cuda").encode(texts)
    return rose.Engine(device="cuda"), texts, reference


@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_minilm_head_dim_32_matches_sentence_transformers(minilm: tuple, backend: str) -> None:
    engine, texts, reference = minilm
    vectors = encode(with_backend(engine, backend), texts)
    assert cosines(vectors, reference).min() >= THRESHOLD


def test_auto_loads_the_backends_of_its_table_and_picks_one_per_batch(minilm: tuple) -> None:
    engine, texts, reference = minilm
    engine.use_attention("auto")
    # AUTO_TABLE for head_dim 32 names FA4 past 1024 tokens only, beyond MiniLM's 256.
    assert set(engine.attention.backends) == {"torch"}
    assert cosines(encode(engine, texts), reference).min() >= THRESHOLD


def test_a_backend_that_cannot_load_says_why() -> None:
    spec = rose.attention.AttentionSpec(4, 4, 64, causal=False, dtype=torch.float32)
    with pytest.raises(BackendUnavailable, match="float16 or bfloat16"):
        BACKENDS["fa4"](spec, torch.device("cuda"))
    with pytest.raises(BackendUnavailable, match="CUDA GPU"):
        BACKENDS["fa2"](dataclasses.replace(spec, dtype=torch.bfloat16), torch.device("cpu"))


@pytest.mark.parametrize("head_dim", [16, 64, 128])
@pytest.mark.parametrize("tokens", [37, 320])
@pytest.mark.parametrize("kernel_set", ["chosen", "triton"])
def test_fused_kernels_match_the_torch_reference(
    kernel_set: str, tokens: int, head_dim: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernels ROSE chooses (FlashInfer's where it is right) and its Triton kernels (what a
    GPU without FlashInfer runs) against the torch path of the same function in float32 on the
    CPU; q and k are views of one fused projection, as in the model."""
    assert kernels.flashinfer() is not None, "FlashInfer should be installed on the GPU machine"
    if kernel_set == "triton":
        monkeypatch.setattr(kernels, "flashinfer", lambda: None)
    torch.manual_seed(0)
    cuda = dict(device="cuda", dtype=torch.bfloat16)
    hidden, heads, kv_heads = 1024, 16, 8
    cpu = lambda t: t.float().cpu()  # noqa: E731
    x, residual = torch.randn(tokens, hidden, **cuda), torch.randn(tokens, hidden, **cuda)
    weight, head_weight = torch.rand(hidden, **cuda) + 0.5, torch.rand(head_dim, **cuda) + 0.5
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, **cuda)
    q = qkv[:, : heads * head_dim].view(tokens, heads, head_dim)
    k = qkv[:, heads * head_dim : (heads + kv_heads) * head_dim].view(tokens, kv_heads, head_dim)
    gate_up = torch.randn(tokens, 2 * 3072, **cuda)
    gamma, beta, ln_residual = torch.rand(hidden, **cuda) + 0.5, torch.randn(hidden, **cuda), torch.randn_like(x)
    positions = torch.randint(0, 512, (tokens,), device="cuda", dtype=torch.int32)
    cache = kernels.rope_cache(head_dim, 1024, 1e6, torch.device("cuda"))
    ref_residual = cpu(residual)
    expected = {
        "rmsnorm": kernels.rmsnorm(cpu(x), cpu(weight), 1e-6),
        "qk-norm": kernels.rmsnorm(cpu(q), cpu(head_weight), 1e-6),
        "add_rmsnorm": kernels.add_rmsnorm(cpu(x), ref_residual, cpu(weight), 1e-6),
        "silu_and_mul": kernels.silu_and_mul(cpu(gate_up)),
        "add_layernorm": kernels.add_layernorm(cpu(x), cpu(ln_residual), cpu(gamma), cpu(beta), 1e-12),
    }
    rq, rk = cpu(q), cpu(k)
    kernels.apply_rope(rq, rk, positions.cpu(), cache.cpu())
    expected["rope q"], expected["rope k"] = rq, rk
    got = {
        "rmsnorm": kernels.rmsnorm(x, weight, 1e-6),
        "qk-norm": kernels.rmsnorm(q, head_weight, 1e-6),
        "add_rmsnorm": kernels.add_rmsnorm(x.clone(), residual, weight, 1e-6),
        "silu_and_mul": kernels.silu_and_mul(gate_up),
        "add_layernorm": kernels.add_layernorm(x.clone(), ln_residual, gamma, beta, 1e-12),
    }
    gq, gk = q.contiguous(), k.contiguous()
    kernels.apply_rope(gq, gk, positions, cache)
    got["rope q"], got["rope k"] = gq, gk
    got["add_rmsnorm residual"], expected["add_rmsnorm residual"] = residual, ref_residual
    rq, rk = kernels.rmsnorm(cpu(q), cpu(head_weight), 1e-6), kernels.rmsnorm(cpu(k), cpu(head_weight), 1e-6)
    kernels.apply_rope(rq, rk, positions.cpu(), cache.cpu())
    expected["qk_norm_rope q"], expected["qk_norm_rope k"] = rq, rk
    got["qk_norm_rope q"], got["qk_norm_rope k"] = kernels.qk_norm_rope(
        qkv, head_weight, head_weight, 1e-6, positions, cache, heads, kv_heads
    )
    wrong = []
    for name, value in expected.items():
        try:
            torch.testing.assert_close(cpu(got[name]), value, atol=3e-2, rtol=2e-2)
        except AssertionError as why:
            wrong.append(f"{name}: {str(why).splitlines()[2:4]}")
    assert not wrong, wrong
