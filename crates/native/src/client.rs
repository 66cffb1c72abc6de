//! `tulip.Client`: Ivy's embedding path (templating, tokenization, chunking) over Tulip's gRPC,
//! for Python callers. The Python package wraps the bytes it returns into numpy arrays.

use std::time::Duration;

use ivy::embed::EmbedCall;
use ivy::input::Input;
use ivy::tokenization::TruncationDirection;
use ivy::{Gateway, IvyArgs, IvyError};
use pyo3::exceptions::{PyConnectionError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use tokio::runtime::Runtime;
use tulip::proto::Encoding;
use tulip::TulipClient;

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

/// A connection to a Tulip server.
#[pyclass(module = "tulip._native", frozen)]
pub struct Client {
    runtime: Runtime,
    gateway: Gateway,
}

#[pymethods]
impl Client {
    /// Connects to Tulip at `address` ("host:port" or "http://host:port"), waiting up to
    /// `timeout` seconds for it to answer.
    #[new]
    #[pyo3(signature = (address, timeout = 10.0, tokenization_workers = None))]
    fn new(
        py: Python<'_>,
        address: &str,
        timeout: f64,
        tokenization_workers: Option<usize>,
    ) -> PyResult<Client> {
        let url = if address.contains("://") {
            address.to_string()
        } else {
            format!("http://{address}")
        };
        let args = IvyArgs {
            tokenization_workers,
            ..IvyArgs::default()
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        let metrics = metrics_exporter_prometheus::PrometheusBuilder::new()
            .build_recorder()
            .handle();
        let patience = Duration::from_secs_f64(timeout.max(0.0));
        // The gRPC channel's background task needs the runtime: it is made inside it.
        let gateway = py
            .detach(|| {
                runtime.block_on(async {
                    let tulip = TulipClient::new(&url)?;
                    Gateway::connect(args, vec![tulip], patience, metrics, None).await
                })
            })
            .map_err(|e| PyConnectionError::new_err(e.to_string()))?;
        Ok(Client { runtime, gateway })
    }

    /// Embeds `inputs`; returns (packed bytes, rows, dimensions). `encoding` is float32
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
    ) -> PyResult<(Bound<'py, PyBytes>, usize, usize)> {
        let encoding =
            Encoding::from_str_name(&encoding.to_ascii_uppercase()).ok_or_else(|| {
                PyValueError::new_err(format!(
                    "encoding must be float32, int8 or binary, not {encoding:?}"
                ))
            })?;
        let call = EmbedCall {
            inputs: inputs.into_inputs(),
            prompt_name,
            truncate: Some(truncate),
            direction: TruncationDirection::Right,
            normalize,
            dimensions,
            encoding,
        };
        let embedded = py
            .detach(|| self.runtime.block_on(self.gateway.embed("python", call)))
            .map_err(to_py)?;
        let e = embedded.embeddings;
        Ok((PyBytes::new(py, &e.data), e.count, e.dimensions))
    }

    /// What the server serves, as a dict.
    fn info<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let info = self.gateway.info();
        let d = PyDict::new(py);
        d.set_item("model_id", &info.model_id)?;
        d.set_item("model_type", &info.model_type)?;
        d.set_item("dtype", &info.dtype)?;
        d.set_item("device", &info.device)?;
        d.set_item("attention_backend", &info.attention_backend)?;
        d.set_item("pooling", &info.pooling)?;
        d.set_item("dimensions", info.dimensions)?;
        d.set_item("max_input_length", info.max_input_length)?;
        d.set_item("vocab_size", info.vocab_size)?;
        d.set_item("max_batch_tokens", info.max_batch_tokens)?;
        d.set_item("max_batch_requests", info.max_batch_requests)?;
        d.set_item("model_path", &info.model_path)?;
        Ok(d)
    }
}

fn to_py(err: IvyError) -> PyErr {
    match err {
        IvyError::Validation(_) | IvyError::Tokenizer(_) | IvyError::TooLarge(_) => {
            PyValueError::new_err(err.to_string())
        }
        IvyError::Unavailable(_) => PyConnectionError::new_err(err.to_string()),
        _ => PyRuntimeError::new_err(err.to_string()),
    }
}
