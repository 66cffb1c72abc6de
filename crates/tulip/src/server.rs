//! Tulip's gRPC service: validates requests, hands them to the scheduler, packs the answers.

use std::future::Future;
use std::time::Duration;

use tonic::metadata::MetadataMap;
use tonic::server::NamedService;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;
use tracing::Instrument;

use crate::auth::ApiKeys;
use crate::deadline;
use crate::error::{EngineError, TulipError};
use crate::outputs::{Cut, Wanted, MAX_TOKEN_VECTOR_BYTES};
use crate::postprocess::{append_row, score_row, Shape};
use crate::proto::tulip_server::{Tulip, TulipServer};
use crate::proto::{self, Encoding, ModelInfo};
use crate::scheduler::{Scheduler, Sequences};
use crate::sparse::Pruning;
use crate::trace_context;

/// Largest gRPC message Tulip accepts or a client takes (a whole model tokenizer fits).
pub const MAX_MESSAGE_BYTES: usize = 256 << 20;

/// How often the health service looks at the engine.
const HEALTH_POLL: Duration = Duration::from_millis(250);

/// Serves `scheduler` over gRPC on `listener` until `shutdown` resolves, with the standard health
/// service (grpc.health.v1): SERVING while the engine runs, NOT_SERVING from the moment it stops
/// or `shutdown` resolves. With `keys`, every Tulip RPC needs one (health stays open for probes).
pub async fn serve(
    scheduler: Scheduler,
    listener: tokio::net::TcpListener,
    keys: ApiKeys,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    let (reporter, health) = tonic_health::server::health_reporter();
    let watch = tokio::spawn(report_health(scheduler.clone(), reporter.clone()));
    let service = TulipServer::new(TulipService::new(scheduler))
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let service = InterceptedService::new(service, move |request| authorize(&keys, request));
    let shutdown = async move {
        shutdown.await;
        watch.abort();
        set_health(&reporter, ServingStatus::NotServing).await;
    };
    tonic::transport::Server::builder()
        .add_service(health)
        .add_service(service)
        .serve_with_incoming_shutdown(
            TcpIncoming::from(listener).with_nodelay(Some(true)),
            shutdown,
        )
        .await
}

/// Lets a request through when no key is needed or its `authorization` metadata holds one.
fn authorize(keys: &ApiKeys, request: Request<()>) -> Result<Request<()>, Status> {
    if keys.is_empty() {
        return Ok(request);
    }
    let header = request.metadata().get("authorization");
    match keys.check(header.and_then(|v| v.to_str().ok())) {
        Ok(_) => Ok(request),
        Err(failure) => {
            metrics::counter!("tulip_auth_failures_total", "reason" => failure.reason())
                .increment(1);
            Err(Status::unauthenticated(failure.to_string()))
        }
    }
}

/// Keeps the health service's answer equal to the engine's state.
async fn report_health(scheduler: Scheduler, reporter: HealthReporter) {
    let mut reported = None;
    loop {
        let ready = scheduler.is_ready();
        if reported != Some(ready) {
            let status = if ready {
                ServingStatus::Serving
            } else {
                ServingStatus::NotServing
            };
            set_health(&reporter, status).await;
            reported = Some(ready);
        }
        tokio::time::sleep(HEALTH_POLL).await;
    }
}

/// Sets the status of the whole server ("") and of the Tulip service.
async fn set_health(reporter: &HealthReporter, status: ServingStatus) {
    for service in ["", <TulipServer<TulipService> as NamedService>::NAME] {
        reporter.set_service_status(service, status).await;
    }
}

/// The gRPC contract's implementation; `TulipClient::in_process` calls it without a socket.
#[derive(Clone)]
pub struct TulipService {
    scheduler: Scheduler,
}

impl TulipService {
    pub(crate) fn new(scheduler: Scheduler) -> TulipService {
        TulipService { scheduler }
    }

    /// True while the engine runs.
    pub(crate) fn is_ready(&self) -> bool {
        self.scheduler.is_ready()
    }

    /// Embed, inside its span.
    async fn embed_traced(
        &self,
        request: Request<proto::EmbedRequest>,
    ) -> Result<Response<proto::EmbedResponse>, Status> {
        let limit = deadline::of(request.metadata());
        let request = request.into_inner();
        let model = &self.scheduler.served().model;
        require_task(model, "embed")?;
        let shape = validate(&request, model)?;
        let count = request.lengths.len();
        let sequences = sequences(request.token_ids, request.token_type_ids, &request.lengths);
        let embedded =
            deadline::within(limit, async { Ok(self.scheduler.run(sequences).await?) }).await?;
        let mut data = Vec::with_capacity(count * shape.row_bytes());
        for row in 0..count {
            append_row(embedded.pooled.row(row), shape, &mut data);
        }
        Ok(Response::new(proto::EmbedResponse {
            count: count as u32,
            dimensions: shape.dimensions as u32,
            encoding: shape.encoding.into(),
            data,
            queue_us: embedded.queue_time.as_micros() as u64,
            inference_us: embedded.inference_time.as_micros() as u64,
        }))
    }

    /// Encode, inside its span: a token step, a pooled step, or both where the dense vector is
    /// not a pooling of the hidden states.
    async fn encode_traced(
        &self,
        request: Request<proto::EncodeRequest>,
    ) -> Result<Response<proto::EncodeResponse>, Status> {
        let limit = deadline::of(request.metadata());
        let request = request.into_inner();
        let model = &self.scheduler.served().model;
        require_task(model, "embed")?;
        let lengths = (
            &request.token_ids,
            &request.token_type_ids,
            &request.lengths,
        );
        validate_sequences(lengths, model)?;
        let wanted = Wanted::parse(&request.outputs, model)?;
        let bytes =
            wanted.token_vector_bytes(model, request.token_ids.len(), request.lengths.len());
        if bytes > MAX_TOKEN_VECTOR_BYTES {
            return Err(TulipError::Validation(format!(
                "the token vectors asked for would take {} MiB, over the {} MiB a request may have",
                bytes >> 20,
                MAX_TOKEN_VECTOR_BYTES >> 20
            ))
            .into());
        }
        let pruning = Pruning {
            top_k: (request.sparse_top_k > 0).then_some(request.sparse_top_k as usize),
            min_value: request.sparse_min_value,
        };
        let per_token = wanted.per_token(model);
        let both = wanted.needs_both_steps(model);
        let mut token_step = sequences(request.token_ids, request.token_type_ids, &request.lengths);
        token_step.per_token = per_token;
        let pooled_step = Sequences {
            per_token: false,
            ..token_step.clone()
        };
        let cut = Cut {
            token_ids: &token_step.token_ids,
            offsets: &token_step.offsets,
            normalize: request.normalize,
            pruning,
            skip_ids: &request.multi_vector_skip_ids,
            encoding: encoding(request.encoding)?,
        };
        let run = |seqs: Sequences| async { Ok::<_, Status>(self.scheduler.run(seqs).await?) };
        let mut answer = if both {
            let (rows, pooled) = deadline::within(limit, async {
                tokio::try_join!(run(token_step.clone()), run(pooled_step))
            })
            .await?;
            let mut out = cut.from_token_rows(&rows.pooled.data, model, wanted);
            let dense = Wanted {
                dense: true,
                ..Wanted::default()
            };
            out.dense = cut
                .from_pooled_rows(&pooled.pooled.data, pooled.pooled.dim, model, dense)
                .dense;
            (
                out,
                rows.queue_time.max(pooled.queue_time),
                rows.inference_time.max(pooled.inference_time),
            )
        } else {
            let rows = deadline::within(limit, run(token_step.clone())).await?;
            let out = match per_token {
                true => cut.from_token_rows(&rows.pooled.data, model, wanted),
                false => cut.from_pooled_rows(&rows.pooled.data, rows.pooled.dim, model, wanted),
            };
            (out, rows.queue_time, rows.inference_time)
        };
        answer.0.queue_us = answer.1.as_micros() as u64;
        answer.0.inference_us = answer.2.as_micros() as u64;
        Ok(Response::new(answer.0))
    }

    /// Score, inside its span.
    async fn score_traced(
        &self,
        request: Request<proto::ScoreRequest>,
    ) -> Result<Response<proto::ScoreResponse>, Status> {
        let limit = deadline::of(request.metadata());
        let request = request.into_inner();
        let model = &self.scheduler.served().model;
        require_task(model, "score")?;
        let lengths = (
            &request.token_ids,
            &request.token_type_ids,
            &request.lengths,
        );
        validate_sequences(lengths, model)?;
        let count = request.lengths.len();
        let sequences = sequences(request.token_ids, request.token_type_ids, &request.lengths);
        let answer =
            deadline::within(limit, async { Ok(self.scheduler.run(sequences).await?) }).await?;
        let mut scores = Vec::with_capacity(count * answer.pooled.dim);
        for row in 0..count {
            score_row(answer.pooled.row(row), request.raw_scores, &mut scores);
        }
        Ok(Response::new(proto::ScoreResponse {
            count: count as u32,
            labels: answer.pooled.dim as u32,
            scores,
            queue_us: answer.queue_time.as_micros() as u64,
            inference_us: answer.inference_time.as_micros() as u64,
        }))
    }
}

/// `span`, the span of one call, made a child of the caller's (Ivy's request, in this process
/// or across gRPC).
fn rpc_span(span: tracing::Span, metadata: &MetadataMap) -> tracing::Span {
    trace_context::continue_from(metadata.as_ref(), &span);
    span
}

#[tonic::async_trait]
impl Tulip for TulipService {
    async fn embed(
        &self,
        request: Request<proto::EmbedRequest>,
    ) -> Result<Response<proto::EmbedResponse>, Status> {
        let sequences = request.get_ref().lengths.len();
        let span = rpc_span(
            tracing::info_span!("embed", sequences = sequences as i64),
            request.metadata(),
        );
        self.embed_traced(request).instrument(span).await
    }

    async fn encode(
        &self,
        request: Request<proto::EncodeRequest>,
    ) -> Result<Response<proto::EncodeResponse>, Status> {
        let sequences = request.get_ref().lengths.len();
        let span = rpc_span(
            tracing::info_span!("encode", sequences = sequences as i64),
            request.metadata(),
        );
        self.encode_traced(request).instrument(span).await
    }

    async fn score(
        &self,
        request: Request<proto::ScoreRequest>,
    ) -> Result<Response<proto::ScoreResponse>, Status> {
        let sequences = request.get_ref().lengths.len();
        let span = rpc_span(
            tracing::info_span!("score", sequences = sequences as i64),
            request.metadata(),
        );
        self.score_traced(request).instrument(span).await
    }

    async fn info(
        &self,
        _: Request<proto::InfoRequest>,
    ) -> Result<Response<proto::InfoResponse>, Status> {
        let scheduler = self.scheduler.clone();
        let engine_json = tokio::task::spawn_blocking(move || scheduler.probe())
            .await
            .map_err(|e| Status::internal(format!("the engine probe failed: {e}")))?;
        Ok(Response::new(proto::InfoResponse {
            model: Some(self.scheduler.served().model.clone()),
            engine_json,
        }))
    }

    async fn tokenizer(
        &self,
        _: Request<proto::TokenizerRequest>,
    ) -> Result<Response<proto::TokenizerResponse>, Status> {
        Ok(Response::new(self.scheduler.served().tokenization.clone()))
    }

    async fn metrics(
        &self,
        _: Request<proto::MetricsRequest>,
    ) -> Result<Response<proto::MetricsResponse>, Status> {
        let text = crate::metrics::install().render();
        Ok(Response::new(proto::MetricsResponse { text }))
    }
}

/// A request's sequences for the scheduler.
fn sequences(token_ids: Vec<u32>, token_type_ids: Vec<u32>, lengths: &[u32]) -> Sequences {
    Sequences {
        token_ids,
        token_type_ids,
        offsets: offsets(lengths),
        per_token: false,
    }
}

/// Refuses a request of the other task (an embedding model asked to score, or the reverse).
fn require_task(model: &ModelInfo, task: &str) -> Result<(), TulipError> {
    if model.task == task {
        return Ok(());
    }
    let other = if task == "embed" { "Score" } else { "Embed" };
    Err(EngineError::Model(format!(
        "{} is a model of task {:?}; it answers {other}, not this call",
        model.model_id, model.task
    ))
    .into())
}

fn offsets(lengths: &[u32]) -> Vec<usize> {
    std::iter::once(0)
        .chain(lengths.iter().scan(0, |end, &len| {
            *end += len as usize;
            Some(*end)
        }))
        .collect()
}

/// Checks an embedding request against the model; Ivy checks too, but Tulip trusts no client.
fn validate(request: &proto::EmbedRequest, info: &ModelInfo) -> Result<Shape, TulipError> {
    validate_sequences(
        (
            &request.token_ids,
            &request.token_type_ids,
            &request.lengths,
        ),
        info,
    )?;
    let dimensions = match request.dimensions {
        0 => info.dimensions as usize,
        d if d <= info.dimensions => d as usize,
        d => {
            return Err(TulipError::Validation(format!(
                "dimensions must be between 1 and {}; got {d}",
                info.dimensions
            )))
        }
    };
    let encoding = encoding(request.encoding)?;
    Ok(Shape {
        dimensions,
        normalize: request.normalize,
        encoding,
    })
}

/// A request's Encoding value, or the error naming an unknown one.
fn encoding(value: i32) -> Result<Encoding, TulipError> {
    Encoding::try_from(value)
        .map_err(|_| TulipError::Validation(format!("unknown encoding {value}")))
}

/// Checks the sequences of a request (token ids, their type ids, the lengths) against the model.
fn validate_sequences(
    (token_ids, token_type_ids, lengths): (&Vec<u32>, &Vec<u32>, &Vec<u32>),
    info: &ModelInfo,
) -> Result<(), TulipError> {
    let invalid = |msg: String| Err(TulipError::Validation(msg));
    if lengths.is_empty() {
        return invalid("a request needs at least one sequence".into());
    }
    let total: u64 = lengths.iter().map(|&len| len as u64).sum();
    if total != token_ids.len() as u64 {
        return invalid(format!(
            "lengths add up to {total} tokens but {} were sent",
            token_ids.len()
        ));
    }
    if let Some(i) = lengths.iter().position(|&len| len == 0) {
        return invalid(format!("sequence {i} is empty"));
    }
    if let Some(i) = lengths.iter().position(|&len| len > info.max_input_length) {
        return invalid(format!(
            "sequence {i} has {} tokens; the model takes at most {}",
            lengths[i], info.max_input_length
        ));
    }
    if let Some(&id) = token_ids.iter().find(|&&id| id >= info.vocab_size) {
        return invalid(format!(
            "token id {id} is outside the vocabulary (size {})",
            info.vocab_size
        ));
    }
    if !token_type_ids.is_empty() && token_type_ids.len() != token_ids.len() {
        return invalid(format!(
            "{} token type ids for {} token ids",
            token_type_ids.len(),
            token_ids.len()
        ));
    }
    if let Some(&t) = token_type_ids
        .iter()
        .find(|&&t| t >= info.type_vocab_size.max(1))
    {
        return invalid(format!(
            "token type id {t} is outside the model's {} token types",
            info.type_vocab_size.max(1)
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> ModelInfo {
        ModelInfo {
            dimensions: 8,
            max_input_length: 4,
            vocab_size: 100,
            type_vocab_size: 2,
            ..Default::default()
        }
    }

    fn request(token_ids: Vec<u32>, lengths: Vec<u32>) -> proto::EmbedRequest {
        proto::EmbedRequest {
            token_ids,
            lengths,
            ..Default::default()
        }
    }

    fn error(request: proto::EmbedRequest) -> String {
        validate(&request, &info()).unwrap_err().to_string()
    }

    #[test]
    fn offsets_are_cumulative_lengths() {
        assert_eq!(offsets(&[2, 1, 3]), [0, 2, 3, 6]);
    }

    #[test]
    fn accepts_a_valid_request_with_the_full_dimension_by_default() {
        let shape = validate(&request(vec![1, 2, 3], vec![2, 1]), &info()).unwrap();
        assert_eq!(shape.dimensions, 8);
    }

    #[test]
    fn names_what_is_wrong() {
        assert!(error(request(vec![], vec![])).contains("at least one sequence"));
        assert!(error(request(vec![1, 2], vec![3])).contains("add up to 3 tokens but 2"));
        assert!(error(request(vec![1], vec![0, 1])).contains("sequence 0 is empty"));
        assert!(error(request(vec![1; 5], vec![5])).contains("at most 4"));
        assert!(error(request(vec![100], vec![1])).contains("token id 100"));
        let mut too_wide = request(vec![1], vec![1]);
        too_wide.dimensions = 9;
        assert!(error(too_wide).contains("between 1 and 8"));
        let mut types = request(vec![1, 2], vec![2]);
        types.token_type_ids = vec![0];
        assert!(error(types.clone()).contains("1 token type ids for 2 token ids"));
        types.token_type_ids = vec![0, 2];
        assert!(error(types).contains("token type id 2 is outside the model's 2 token types"));
    }
}
