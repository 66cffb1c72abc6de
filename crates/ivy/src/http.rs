//! Serving the HTTP API: binding the port, the router, graceful shutdown.

use std::future::{Future, IntoFuture};
use std::time::Duration;

use crate::config::IvyArgs;
use crate::error::IvyError;
use crate::gateway::{EarlyTokenizer, Gateway, Tulips};
use crate::listener::ClosingListener;

/// How long `ivy-serve` waits for a Tulip endpoint to answer at start (the engine may be loading).
const CONNECT_PATIENCE: Duration = Duration::from_secs(300);

/// Serves the HTTP API on `--hostname:--port` over the `tulips` until `shutdown`;
/// `early`: the model's tokenizer, already being read (see [`EarlyTokenizer`]); `grpc`: where this
/// process's own Tulip listens, if it runs one (for the start-up table).
pub async fn run(
    args: IvyArgs,
    tulips: Tulips,
    early: Option<EarlyTokenizer>,
    grpc: Option<String>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), IvyError> {
    let addr = format!("{}:{}", args.hostname, args.port);
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .map_err(|e| IvyError::Unavailable(format!("cannot listen on {addr}: {e}")))?;
    let metrics = tulip::metrics::install();
    let gateway = Gateway::connect(args, tulips, CONNECT_PATIENCE, metrics, early).await?;
    let engine = gateway
        .replicas()
        .info()
        .await
        .ok()
        .and_then(|info| serde_json::from_str(&info.engine_json).ok())
        .unwrap_or_default();
    let tulips = match grpc {
        Some(grpc) => format!("in this process; gRPC on {grpc}"),
        None => gateway.args().tulip_endpoints.join(", "),
    };
    let endpoints = [("http", format!("http://{addr}")), ("tulip", tulips)];
    for model in gateway.all() {
        let table = crate::startup::table(model.model(), &engine, &endpoints);
        tracing::info!("Ivy serves:\n{table}");
    }
    // SIGTERM: /health answers 503 at once, new connections are still served for --drain-delay
    // (a load balancer takes the server out meanwhile), then refused; the admitted requests have
    // --shutdown-timeout to finish.
    let (delay, timeout) = (gateway.args().drain_delay, gateway.args().shutdown_timeout);
    let draining = gateway.clone();
    let closing = async move {
        shutdown.await;
        draining.drain();
        tracing::info!("draining: /health answers 503; new connections refused in {delay:?}");
        tokio::time::sleep(delay).await;
    };
    let listener = ClosingListener::new(listener, closing);
    let (closed, deadline) = (listener.closed(), listener.closed());
    let serving =
        axum::serve(listener, crate::routes::router(gateway)).with_graceful_shutdown(closed);
    let deadline = async move {
        deadline.await;
        tokio::time::sleep(timeout).await;
    };
    tokio::select! {
        served = serving.into_future() => {
            served.map_err(|e| IvyError::Unavailable(format!("the HTTP server failed: {e}")))
        }
        () = deadline => {
            tracing::warn!("requests still running {timeout:?} after new connections were refused: exiting");
            Ok(())
        }
    }
}
