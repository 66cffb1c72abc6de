//! What stands in front of every route: the API-key check with the per-key limits after it, the
//! request's deadline, and the drain's `Connection: close`.

use axum::extract::{Request, State};
use axum::http::header::{AUTHORIZATION, CONNECTION};
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::IvyError;
use crate::gateway::Gateway;

/// Routes a load balancer or Kubernetes probes without a key.
const OPEN: [&str; 2] = ["/health", "/live"];

/// Refuses a request without one of `--api-key`'s keys (401) or past its key's limits (429);
/// charges the tokens of the answer (its x-compute-tokens) to the key.
pub(super) async fn require_key(
    State(gateway): State<Gateway>,
    request: Request,
    next: Next,
) -> Response {
    let keys = &gateway.args().keys;
    if keys.is_empty() || OPEN.contains(&request.uri().path()) {
        return next.run(request).await;
    }
    let header = request.headers().get(AUTHORIZATION);
    let key = match keys.check(header.and_then(|v| v.to_str().ok())) {
        Ok(key) => key,
        Err(failure) => {
            metrics::counter!("ivy_auth_failures_total", "reason" => failure.reason()).increment(1);
            return IvyError::from(failure).into_response();
        }
    };
    if let Err(wait) = gateway.key_limits().admit(key) {
        metrics::counter!("ivy_key_limited_total").increment(1);
        return IvyError::RateLimited(wait).into_response();
    }
    let response = next.run(request).await;
    let tokens = (response.headers().get("x-compute-tokens"))
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if let Some(tokens) = tokens {
        gateway.key_limits().charge(key, tokens);
    }
    response
}

/// While the server drains, every answer closes its connection, so that a client's next request
/// opens a new one (refused once the drain delay is over) instead of racing the close.
pub(super) async fn close_when_draining(
    State(gateway): State<Gateway>,
    request: Request,
    next: Next,
) -> Response {
    let mut response = next.run(request).await;
    if gateway.is_draining() {
        (response.headers_mut()).insert(CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// Answers 504 when a request takes longer than `--request-timeout`; the request's work is
/// dropped with it, so its chunks leave Tulip's queue (a dropped call frees its place).
pub(super) async fn deadline(
    State(gateway): State<Gateway>,
    request: Request,
    next: Next,
) -> Response {
    let limit = gateway.args().request_timeout;
    match tokio::time::timeout(limit, next.run(request)).await {
        Ok(response) => response,
        Err(_) => IvyError::Timeout(limit).into_response(),
    }
}
