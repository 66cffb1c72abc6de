//! `GatewayClient`: Ivy's request path (templating, tokenization, chunking; crates/ivy) over
//! Tulip's gRPC, for Python callers. `tulip.Client` wraps the bytes it returns into numpy arrays.

use std::time::Duration;

use clap::Parser;
use ivy::encode::EncodeCall;
use ivy::input::Input;
use ivy::request::{EmbedCall, TextOptions};
use ivy::score::{rank, RerankCall};
use ivy::template::Role;
use ivy::tokenization::TruncationDirection;
use ivy::{Gateway, IvyArgs, IvyError, Tulips};
use pyo3::exceptions::{PyConnectionError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use tokio::runtime::Runtime;
use tulip::proto::{Encoding, Output, TokenVectors};
use tulip::sparse::Pruning;
use tulip::{ApiKeys, TulipArgs, TulipClient};

use crate::engine::EngineArgs;

pyo3::create_exception!(
    tulip,
    Overloaded,
    PyRuntimeError,
    "The server turned the request away for now (its 429): too many requests or queued tokens; \
     the same request may succeed later."
);

/// What `embed` accepts: text, texts, token ids, or lists of token ids.
#[derive(FromPyObject)]
enum Inputs {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<u32>),
    IdLists(Vec<Vec<u32>>),
}

impl Inputs {
    fn into_inputs(self) -> Vec<Input> {
        match self {
            Inputs::Text(text) => vec![Input::Text(text)],
            Inputs::Texts(texts) => texts.into_iter().map(Input::Text).collect(),
            Inputs::Ids(ids) => vec![Input::Ids(ids)],
            Inputs::IdLists(lists) => lists.into_iter().map(Input::Ids).collect(),
        }
    }
}

/// Ivy's gateway in this process, connected to a Tulip server (or to one it runs itself).
#[pyclass(module = "tulip._native", frozen)]
pub struct GatewayClient {
    runtime: Runtime,
    gateway: Gateway,
}

/// The engine flags of an in-process gateway: `tulip-serve`'s, without the ports.
#[derive(Parser)]
#[command(name = "engine")]
struct InProcess {
    #[command(flatten)]
    engine: EngineArgs,
    #[command(flatten)]
    tulip: TulipArgs,
}

/// A runtime for one gateway, of `workers` threads: a remote Tulip's channel needs one (the
/// callers' threads drive their own requests); an in-process engine's scheduler and answers need
/// as many as a server has, or one busy task holds up the next batch.
fn runtime(workers: usize) -> PyResult<Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .map_err(|e| PyRuntimeError::new_err(e.to_string()))
}

fn metrics() -> metrics_exporter_prometheus::PrometheusHandle {
    metrics_exporter_prometheus::PrometheusBuilder::new()
        .build_recorder()
        .handle()
}

#[pymethods]
impl GatewayClient {
    /// Connects to Tulip at `address` ("host:port" or "http://host:port"), waiting up to
    /// `timeout` seconds for it to answer; `api_key` for a Tulip started with --api-key.
    #[new]
    #[pyo3(signature = (address, timeout = 10.0, tokenization_workers = None, api_key = None))]
    fn new(
        py: Python<'_>,
        address: &str,
        timeout: f64,
        tokenization_workers: Option<usize>,
        api_key: Option<String>,
    ) -> PyResult<GatewayClient> {
        let url = if address.contains("://") {
            address.to_string()
        } else {
            format!("http://{address}")
        };
        let args = IvyArgs {
            tokenization_workers,
            keys: ApiKeys::new(api_key.into_iter().collect()),
            // A program's own call, not a client's request: a list of any size is embedded.
            max_request_tokens: usize::MAX,
            ..IvyArgs::default()
        };
        let runtime = runtime(1)?;
        let metrics = metrics();
        let patience = Duration::from_secs_f64(timeout.max(0.0));
        // The gRPC channel's background task needs the runtime: it is made inside it.
        let gateway = py
            .detach(|| {
                runtime.block_on(async {
                    let tulips = Tulips::Endpoints(vec![url]);
                    Gateway::connect(args, tulips, patience, metrics, None).await
                })
            })
            .map_err(|e| PyConnectionError::new_err(e.to_string()))?;
        Ok(GatewayClient { runtime, gateway })
    }

    /// Loads ROSE under Tulip in this process, configured by `tulip-serve`'s engine flags
    /// (`flags`, as on its command line: `["--model", "org/name", "--device", "cpu"]`), and
    /// serves Ivy's request path over it with no server in between.
    #[staticmethod]
    #[pyo3(signature = (flags, tokenization_workers = None))]
    fn in_process(
        py: Python<'_>,
        flags: Vec<String>,
        tokenization_workers: Option<usize>,
    ) -> PyResult<GatewayClient> {
        let argv = std::iter::once("engine".to_string()).chain(flags);
        let mut local =
            InProcess::try_parse_from(argv).map_err(|e| PyValueError::new_err(e.to_string()))?;
        let root = crate::serve::model_root(py, &local.engine).map_err(PyValueError::new_err)?;
        if local.engine.model.len() > 1 {
            return Err(PyValueError::new_err("one --model at a time"));
        }
        if !local.engine.model.is_empty() {
            local.engine.model = vec![root.display().to_string()];
        }
        let args = IvyArgs {
            tokenization_workers,
            // A program's own call, not a client's request: a list of any size is embedded.
            max_request_tokens: usize::MAX,
            ..IvyArgs::default()
        };
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let runtime = runtime(cores)?;
        let gateway = py
            .detach(|| {
                runtime.block_on(async {
                    let scheduler = crate::serve::start_engine(local.engine, local.tulip).await?;
                    let tulips = Tulips::InProcess(TulipClient::in_process(scheduler));
                    Gateway::connect(args, tulips, Duration::from_secs(60), metrics(), None)
                        .await
                        .map_err(|e| e.to_string())
                })
            })
            .map_err(PyRuntimeError::new_err)?;
        Ok(GatewayClient { runtime, gateway })
    }

    /// Embeds `inputs`; returns (packed bytes, rows, dimensions, tokens). `encoding` is float32
    /// (little-endian), int8 or binary (bits, most significant first, rows padded to bytes).
    #[pyo3(signature = (inputs, *, normalize = true, dimensions = None, truncate = true, prompt_name = None, encoding = "float32"))]
    #[allow(clippy::too_many_arguments)]
    fn embed_raw<'py>(
        &self,
        py: Python<'py>,
        inputs: Inputs,
        normalize: bool,
        dimensions: Option<i64>,
        truncate: bool,
        prompt_name: Option<String>,
        encoding: &str,
    ) -> PyResult<(Bound<'py, PyBytes>, usize, usize, usize)> {
        let encoding = encoding_named(encoding)?;
        let call = EmbedCall {
            inputs: inputs.into_inputs(),
            prompt_name,
            truncate: Some(truncate),
            direction: TruncationDirection::Right,
            normalize,
            dimensions,
            encoding,
            long_inputs: None,
        };
        let embedded = py
            .detach(|| self.runtime.block_on(self.gateway.embed("python", call)))
            .map_err(to_py)?;
        let v = embedded.vectors;
        Ok((
            PyBytes::new(py, &v.data),
            v.count,
            v.dimensions,
            embedded.tokens,
        ))
    }

    /// Several outputs of `inputs` from one pass (`outputs`: names of ModelInfo.outputs); returns
    /// a dict by output: dense, multi_vector and tokens as (float32 bytes, dimensions, row offsets
    /// a sequence), sparse as (offsets, indices, values), and "tokens_embedded".
    #[pyo3(signature = (inputs, outputs, *, normalize = true, truncate = true, prompt_name = None, top_k = None, min_value = 0.0, encoding = "float32", input_type = None))]
    #[allow(clippy::too_many_arguments)]
    fn encode_raw<'py>(
        &self,
        py: Python<'py>,
        inputs: Inputs,
        outputs: Vec<String>,
        normalize: bool,
        truncate: bool,
        prompt_name: Option<String>,
        top_k: Option<usize>,
        min_value: f32,
        encoding: &str,
        input_type: Option<&str>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let encoding = encoding_named(encoding)?;
        let role = match input_type {
            None => None,
            Some("query") => Some(Role::Query),
            Some("document") => Some(Role::Document),
            Some(other) => {
                return Err(PyValueError::new_err(format!(
                    "input_type must be query or document, not {other:?}"
                )))
            }
        };
        let outputs = (outputs.iter())
            .map(|name| {
                Output::from_str_name(&name.to_ascii_uppercase()).ok_or_else(|| {
                    PyValueError::new_err(format!(
                        "unknown output {name:?}; use dense, sparse, multi_vector or tokens"
                    ))
                })
            })
            .collect::<PyResult<Vec<_>>>()?;
        let call = EncodeCall {
            inputs: inputs.into_inputs(),
            text: TextOptions {
                prompt_name: prompt_name.as_deref(),
                truncate: Some(truncate),
                direction: TruncationDirection::Right,
                max_length: None,
            },
            outputs,
            normalize,
            pruning: Pruning { top_k, min_value },
            encoding,
            role,
        };
        let encoded = py
            .detach(|| self.runtime.block_on(self.gateway.encode("python", call)))
            .map_err(to_py)?;
        let out = PyDict::new(py);
        let o = encoded.outputs;
        let rows = |v: TokenVectors| {
            let encoding = v.encoding().as_str_name().to_ascii_lowercase();
            (PyBytes::new(py, &v.data), v.dimensions, v.offsets, encoding)
        };
        if let Some(v) = o.dense {
            out.set_item("dense", rows(v))?;
        }
        if let Some(v) = o.multi_vector {
            out.set_item("multi_vector", rows(v))?;
        }
        if let Some(v) = o.tokens {
            out.set_item("tokens", rows(v))?;
        }
        if let Some(v) = o.sparse {
            out.set_item("sparse", (v.offsets, v.indices, v.values))?;
        }
        out.set_item("tokens_embedded", encoded.tokens)?;
        Ok(out)
    }

    /// The documents ranked against `query`, best first (Ivy's `score::rank`): (index, score) for
    /// the first `top_n`; a score model's probability (or logit with `raw_scores`), an embedding
    /// model's cosine.
    #[pyo3(signature = (query, documents, *, top_n = None, instruction = None, truncate = true, raw_scores = false, max_tokens_per_doc = None))]
    #[allow(clippy::too_many_arguments)]
    fn rerank(
        &self,
        py: Python<'_>,
        query: String,
        documents: Vec<String>,
        top_n: Option<usize>,
        instruction: Option<String>,
        truncate: bool,
        raw_scores: bool,
        max_tokens_per_doc: Option<usize>,
    ) -> PyResult<Vec<(usize, f32)>> {
        let call = RerankCall {
            query,
            documents,
            instruction,
            truncate: Some(truncate),
            max_tokens_per_doc,
            raw_scores,
            long_inputs: None,
        };
        let scored = py
            .detach(|| self.runtime.block_on(self.gateway.rerank("python", call)))
            .map_err(to_py)?;
        Ok(rank(&scored.scores, top_n))
    }

    /// Scores of texts or (text, text) pairs, `labels` values each: (flat scores, labels).
    #[pyo3(signature = (inputs, *, truncate = true, raw_scores = false))]
    fn predict(
        &self,
        py: Python<'_>,
        inputs: Vec<(String, Option<String>)>,
        truncate: bool,
        raw_scores: bool,
    ) -> PyResult<(Vec<f32>, usize)> {
        let (scores, labels, _, _) = py
            .detach(|| {
                self.runtime
                    .block_on(self.gateway.predict(inputs, Some(truncate), raw_scores))
            })
            .map_err(to_py)?;
        Ok((scores, labels))
    }

    /// What the server serves (protos/tulip.proto's ModelInfo), as JSON.
    fn info_json(&self) -> PyResult<String> {
        serde_json::to_string(self.gateway.model())
            .map_err(|e| PyRuntimeError::new_err(e.to_string()))
    }
}

/// float32, int8 or binary (Tulip's Encoding), or the error naming them.
fn encoding_named(name: &str) -> PyResult<Encoding> {
    Encoding::from_str_name(&name.to_ascii_uppercase()).ok_or_else(|| {
        PyValueError::new_err(format!(
            "encoding must be float32, int8 or binary, not {name:?}"
        ))
    })
}

fn to_py(err: IvyError) -> PyErr {
    match err {
        IvyError::Validation(_)
        | IvyError::Tokenizer(_)
        | IvyError::TooLarge(_)
        | IvyError::Unsupported(_) => PyValueError::new_err(err.to_string()),
        IvyError::Unavailable(_) => PyConnectionError::new_err(err.to_string()),
        IvyError::Overloaded | IvyError::Backlogged { .. } => Overloaded::new_err(err.to_string()),
        _ => PyRuntimeError::new_err(err.to_string()),
    }
}
