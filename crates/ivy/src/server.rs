//! The gateway's shared state, and starting the HTTP server.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::serve::ListenerExt;
use metrics_exporter_prometheus::PrometheusHandle;
use tokenizers::Tokenizer;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tulip::proto::InfoResponse;
use tulip::TulipClient;

use crate::backend::Backend;
use crate::config::IvyArgs;
use crate::error::IvyError;
use crate::template::Template;
use crate::tokenization::TokenizerPool;

/// How long `ivy-serve` waits for a Tulip endpoint to answer at start (the engine may be loading).
const CONNECT_PATIENCE: Duration = Duration::from_secs(300);

/// Everything a request handler needs; cloning it is cheap.
#[derive(Clone)]
pub struct Gateway {
    inner: Arc<Inner>,
}

struct Inner {
    args: IvyArgs,
    backend: Backend,
    tokenizer: TokenizerPool,
    template: Template,
    info: InfoResponse,
    limiter: Arc<Semaphore>,
    metrics: PrometheusHandle,
}

impl Gateway {
    /// Connects to the Tulip `replicas` (waiting up to `patience` for each to answer), fetches
    /// the model's tokenizer, and starts the tokenizer pool. `metrics` renders /metrics.
    pub async fn connect(
        args: IvyArgs,
        replicas: Vec<TulipClient>,
        patience: Duration,
        metrics: PrometheusHandle,
    ) -> Result<Gateway, IvyError> {
        let (backend, info) = Backend::connect(replicas, patience).await?;
        let setup = backend.tokenizer().await?;
        let tokenizer = Tokenizer::from_bytes(&setup.tokenizer_json).map_err(|e| {
            IvyError::Backend(format!("the model's tokenizer.json cannot be read: {e}"))
        })?;
        let template = Template::from_json(&setup.template_json)
            .map_err(|e| IvyError::Backend(format!("Tulip sent an unreadable template: {e}")))?;
        let workers = args
            .tokenization_workers
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        let tokenizer = TokenizerPool::new(tokenizer, workers, template.max_input_length);
        let limiter = Arc::new(Semaphore::new(args.max_concurrent_requests));
        Ok(Gateway {
            inner: Arc::new(Inner {
                args,
                backend,
                tokenizer,
                template,
                info,
                limiter,
                metrics,
            }),
        })
    }

    pub fn args(&self) -> &IvyArgs {
        &self.inner.args
    }

    pub fn backend(&self) -> &Backend {
        &self.inner.backend
    }

    pub fn tokenizer(&self) -> &TokenizerPool {
        &self.inner.tokenizer
    }

    /// What Tulip reported about the model at start.
    pub fn info(&self) -> &InfoResponse {
        &self.inner.info
    }

    pub fn metrics(&self) -> &PrometheusHandle {
        &self.inner.metrics
    }

    /// The prompt text for `name` (or the default one).
    pub fn prompt(&self, name: Option<&str>) -> Result<&str, IvyError> {
        self.inner
            .template
            .prompt(name, self.inner.args.default_prompt_name.as_deref())
    }

    /// A slot under `--max-concurrent-requests`, held for the request's life.
    pub fn admit(&self) -> Result<OwnedSemaphorePermit, IvyError> {
        self.inner
            .limiter
            .clone()
            .try_acquire_owned()
            .map_err(|_| IvyError::Overloaded)
    }
}

/// Serves the HTTP API on `--hostname:--port` over the Tulip `replicas` until `shutdown`.
pub async fn run(
    args: IvyArgs,
    replicas: Vec<TulipClient>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), IvyError> {
    let addr = format!("{}:{}", args.hostname, args.port);
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .map_err(|e| IvyError::Unavailable(format!("cannot listen on {addr}: {e}")))?;
    let gateway =
        Gateway::connect(args, replicas, CONNECT_PATIENCE, crate::metrics::install()).await?;
    let info = gateway.info();
    tracing::info!(
        "Ivy listens on http://{addr} serving {} ({} on {}, {} attention)",
        info.model_id,
        info.dtype,
        info.device,
        info.attention_backend
    );
    // Without TCP_NODELAY a response written in two parts can wait for the client's delayed ACK.
    let listener = listener.tap_io(|tcp| {
        if let Err(err) = tcp.set_nodelay(true) {
            tracing::debug!("cannot set TCP_NODELAY on a connection: {err}");
        }
    });
    axum::serve(listener, crate::routes::router(gateway))
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(|e| IvyError::Unavailable(format!("the HTTP server failed: {e}")))
}
