//! The one error type of Ivy, mapped to an HTTP status and a JSON body in one place.

use std::time::Duration;

use axum::http::header::{RETRY_AFTER, WWW_AUTHENTICATE};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use tonic::Code;
use tulip::{AuthFailure, TulipError};

use crate::admission::MAX_RETRY_AFTER;

/// Everything a request can fail with, as the client sees it.
#[derive(Debug, thiserror::Error)]
pub enum IvyError {
    /// The request asks for something the model cannot do.
    #[error("{0}")]
    Validation(String),
    /// The tokenizer rejected an input.
    #[error("{0}")]
    Tokenizer(String),
    /// The body is not valid JSON.
    #[error("{0}")]
    InvalidJson(String),
    /// The body is not `application/json`.
    #[error("expected a JSON body with Content-Type: application/json")]
    UnsupportedMediaType,
    /// Too many inputs, or too many bytes.
    #[error("{0}")]
    TooLarge(String),
    /// More requests in flight than `--max-concurrent-requests`.
    #[error("the server is handling as many requests as it allows; try again")]
    Overloaded,
    /// The queued work would take longer than the request may wait.
    #[error(
        "the queued work takes about {} s to drain, longer than a request may wait ({} s, half the --request-timeout); try again",
        wait.as_secs(), longest.as_secs()
    )]
    Backlogged { wait: Duration, longest: Duration },
    /// No API key, or a wrong one.
    #[error("{0}")]
    Unauthorized(#[from] AuthFailure),
    /// The key's own limit is spent for now; it may come back after the duration.
    #[error("this API key's limit is reached; retry in {} s", retry_after(*.0))]
    RateLimited(Duration),
    /// The served model does not do what the route asks (its task is the other one).
    #[error("{0}")]
    Unsupported(String),
    /// The request names a model this gateway does not serve.
    #[error("{0}")]
    NotFound(String),
    /// Tulip cannot be reached or its engine stopped.
    #[error("{0}")]
    Unavailable(String),
    /// The request took longer than `--request-timeout`.
    #[error("the request took longer than the server's --request-timeout ({0:?})")]
    Timeout(Duration),
    /// The engine failed (not the client's mistake).
    #[error("{0}")]
    Engine(String),
}

impl IvyError {
    fn status_and_type(&self) -> (StatusCode, &'static str) {
        match self {
            IvyError::Validation(_) => (StatusCode::UNPROCESSABLE_ENTITY, "validation"),
            IvyError::Tokenizer(_) => (StatusCode::UNPROCESSABLE_ENTITY, "tokenizer"),
            IvyError::InvalidJson(_) => (StatusCode::BAD_REQUEST, "invalid_json"),
            IvyError::UnsupportedMediaType => {
                (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type")
            }
            IvyError::TooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
            IvyError::Overloaded | IvyError::Backlogged { .. } => {
                (StatusCode::TOO_MANY_REQUESTS, "overloaded")
            }
            IvyError::Unauthorized(_) => (StatusCode::UNAUTHORIZED, "unauthorized"),
            IvyError::RateLimited(_) => (StatusCode::TOO_MANY_REQUESTS, "rate_limited"),
            IvyError::Unsupported(_) => (StatusCode::BAD_REQUEST, "unsupported"),
            IvyError::NotFound(_) => (StatusCode::NOT_FOUND, "model_not_found"),
            IvyError::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unhealthy"),
            IvyError::Timeout(_) => (StatusCode::GATEWAY_TIMEOUT, "timeout"),
            IvyError::Engine(_) => (StatusCode::INTERNAL_SERVER_ERROR, "engine"),
        }
    }
}

/// The body of every error answer.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// What is wrong, naming the field or limit.
    pub error: String,
    /// The kind: validation, tokenizer, invalid_json, unsupported_media_type, payload_too_large,
    /// overloaded, unauthorized, rate_limited, unsupported, model_not_found, unhealthy,
    /// not_found, timeout or engine.
    pub error_type: &'static str,
}

/// The error answers every route documents beside its own (OpenAPI's 4XX and 5XX ranges).
#[derive(utoipa::IntoResponses)]
pub enum ErrorResponses {
    #[response(status = "4XX", description = "The request cannot be served as sent")]
    Client(ErrorBody),
    #[response(status = "5XX", description = "The engine failed or is not ready")]
    Server(ErrorBody),
}

impl IntoResponse for IvyError {
    fn into_response(self) -> Response {
        let (status, error_type) = self.status_and_type();
        metrics::counter!("ivy_errors_total", "error_type" => error_type).increment(1);
        let body = ErrorBody {
            error: self.to_string(),
            error_type,
        };
        let mut response = (status, Json(body)).into_response();
        let headers = response.headers_mut();
        match self {
            IvyError::Overloaded => {
                headers.insert(RETRY_AFTER, HeaderValue::from_static("1"));
            }
            IvyError::RateLimited(wait) => {
                headers.insert(RETRY_AFTER, HeaderValue::from(retry_after(wait)));
            }
            // When enough of the queue has drained for a request to wait no longer than allowed,
            // by the estimate, which may be wrong: at most MAX_RETRY_AFTER.
            IvyError::Backlogged { wait, longest } => {
                let drained = wait.saturating_sub(longest).min(MAX_RETRY_AFTER);
                headers.insert(RETRY_AFTER, HeaderValue::from(retry_after(drained)));
            }
            IvyError::Unauthorized(_) => {
                headers.insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            _ => {}
        }
        response
    }
}

/// Whole seconds to wait, at least one (Retry-After takes no fractions).
fn retry_after(wait: Duration) -> u64 {
    wait.as_nanos().div_ceil(1_000_000_000).max(1) as u64
}

impl From<TulipError> for IvyError {
    /// By the gRPC code the error travels with (protos/tulip.proto lists them).
    fn from(err: TulipError) -> Self {
        let code = err.code();
        let message = err.to_string();
        match code {
            Code::InvalidArgument => IvyError::Validation(message),
            Code::FailedPrecondition => IvyError::Unsupported(message),
            Code::ResourceExhausted => IvyError::Overloaded,
            // A Tulip that needs a key Ivy did not send: Ivy's configuration, not the client's.
            Code::Unauthenticated => {
                IvyError::Unavailable(format!("a Tulip refused Ivy's key: {message}"))
            }
            Code::Unavailable | Code::DeadlineExceeded => IvyError::Unavailable(message),
            _ => IvyError::Engine(message),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_is_whole_seconds_rounded_up_and_at_least_one() {
        assert_eq!(retry_after(Duration::ZERO), 1);
        assert_eq!(retry_after(Duration::from_millis(300)), 1);
        assert_eq!(retry_after(Duration::from_secs(2)), 2);
        assert_eq!(retry_after(Duration::from_millis(2500)), 3);
    }

    #[test]
    fn refusals_carry_the_headers_a_client_acts_on() {
        let limited = IvyError::RateLimited(Duration::from_millis(1500)).into_response();
        assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(limited.headers()[RETRY_AFTER], "2");
        let overloaded = IvyError::Overloaded.into_response();
        assert_eq!(overloaded.headers()[RETRY_AFTER], "1");
        let backlogged = IvyError::Backlogged {
            wait: Duration::from_millis(7200),
            longest: Duration::from_secs(5),
        };
        let backlogged = backlogged.into_response();
        assert_eq!(backlogged.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(backlogged.headers()[RETRY_AFTER], "3");
        // An estimate held low by a slow start says minutes: the client comes back sooner.
        let far = IvyError::Backlogged {
            wait: Duration::from_secs(3600),
            longest: Duration::from_secs(300),
        };
        assert_eq!(far.into_response().headers()[RETRY_AFTER], "5");
        let refused = IvyError::Unauthorized(AuthFailure::Wrong).into_response();
        assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(refused.headers()[WWW_AUTHENTICATE], "Bearer");
        let late = IvyError::Timeout(Duration::from_secs(1)).into_response();
        assert_eq!(late.status(), StatusCode::GATEWAY_TIMEOUT);
    }
}
