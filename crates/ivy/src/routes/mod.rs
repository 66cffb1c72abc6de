//! The HTTP routes. Each API family is a file that parses its bodies into the one request path
//! (crate::request) and renders the answer; body.rs and timing.rs are what they share.

mod body;
mod cohere;
mod guards;
mod openai;
mod outputs;
mod rerank;
mod schema;
mod status;
mod tei;
mod timing;

use axum::extract::{DefaultBodyLimit, Request};
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use swagger_ui_dist::{ApiDefinition, OpenApiSource};
use tower_http::request_id::{
    MakeRequestUuid, PropagateRequestIdLayer, RequestId, SetRequestIdLayer,
};
use tower_http::trace::TraceLayer;
use utoipa::openapi::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::error::ErrorBody;
use crate::gateway::Gateway;

/// All routes of the gateway, with `/openapi.json` (the spec, generated from the routes'
/// annotations as they are registered, so a route cannot be served without being described) and
/// `/docs` (Swagger UI, whose assets are compiled in). Every answer carries an `x-request-id`
/// (the client's when it sent one, else a new UUID), which every log line about it names.
pub fn router(gateway: Gateway) -> Router {
    let payload_limit = gateway.args().payload_limit;
    let keys = axum::middleware::from_fn_with_state(gateway.clone(), guards::require_key);
    let deadline = axum::middleware::from_fn_with_state(gateway.clone(), guards::deadline);
    let drain = axum::middleware::from_fn_with_state(gateway.clone(), guards::close_when_draining);
    let (routes, spec) = api().split_for_parts();
    let docs = ApiDefinition {
        uri_prefix: "/docs",
        api_definition: OpenApiSource::Uri("/openapi.json"),
        title: Some("Ivy API"),
    };
    routes
        .route("/openapi.json", get(move || async move { Json(spec) }))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(payload_limit))
        .with_state(gateway)
        .merge(swagger_ui_dist::generate_routes(docs))
        // Inside the request id's layers, so that a refused request is logged with its id too.
        .layer(deadline)
        .layer(keys)
        .layer(drain)
        // Outermost first: the id is set, then the request's span opens with it, then it goes
        // back on the answer.
        .layer(PropagateRequestIdLayer::x_request_id())
        .layer(TraceLayer::new_for_http().make_span_with(request_span))
        .layer(SetRequestIdLayer::x_request_id(MakeRequestUuid))
}

/// The span every log line about one request sits in; with `--otlp-endpoint`, the root of its
/// trace (or a child of the client's, when it sent a `traceparent`).
fn request_span(request: &Request) -> tracing::Span {
    let id = request.extensions().get::<RequestId>();
    let id = id
        .and_then(|id| id.header_value().to_str().ok())
        .unwrap_or("-");
    let span = tracing::info_span!("request", id = %id, method = %request.method(), path = %request.uri().path());
    tulip::trace_context::continue_from(request.headers(), &span);
    span
}

/// The routes and their OpenAPI description, built together.
fn api() -> OpenApiRouter<Gateway> {
    OpenApiRouter::with_openapi(info())
        .routes(routes!(openai::embeddings))
        .routes(routes!(openai::models))
        .routes(routes!(cohere::embed))
        .routes(routes!(tei::embed))
        .routes(routes!(outputs::embed_sparse))
        .routes(routes!(outputs::embed_all))
        .routes(routes!(outputs::encode))
        .routes(routes!(tei::tokenize))
        .routes(routes!(tei::decode))
        .routes(routes!(tei::similarity))
        .routes(routes!(tei::predict))
        .routes(routes!(rerank::tei))
        .routes(routes!(rerank::cohere_v1))
        .routes(routes!(rerank::cohere_v2))
        .routes(routes!(status::health))
        .routes(routes!(status::live))
        .routes(routes!(status::info))
        .routes(routes!(status::metrics))
}

/// The spec's title, version and description.
fn info() -> OpenApi {
    let mut spec = OpenApi::default();
    spec.info.title = "Ivy".into();
    spec.info.version = env!("CARGO_PKG_VERSION").into();
    spec.info.description = Some(
        "Embedding and reranking server: OpenAI-, TEI- and Cohere-compatible routes. Every \
         successful answer carries TEI's timing headers (x-total-time, x-compute-time, \
         x-tokenization-time, x-queue-time, x-inference-time in ms; x-compute-tokens, \
         x-compute-characters)."
            .into(),
    );
    spec
}

async fn not_found() -> (StatusCode, Json<ErrorBody>) {
    let body = ErrorBody {
        error: "no such route".into(),
        error_type: "not_found",
    };
    (StatusCode::NOT_FOUND, Json(body))
}
