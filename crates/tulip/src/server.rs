//! Tulip's gRPC service: validates requests, hands them to the scheduler, packs the answers.

use std::future::Future;

use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};

use crate::error::TulipError;
use crate::postprocess::{append_row, Shape};
use crate::proto::tulip_server::{Tulip, TulipServer};
use crate::proto::{self, Encoding, ModelInfo};
use crate::scheduler::Scheduler;

/// Largest gRPC message Tulip accepts or a client takes (a whole model tokenizer fits).
pub const MAX_MESSAGE_BYTES: usize = 256 << 20;

/// Serves `scheduler` over gRPC on `listener` until `shutdown` resolves.
pub async fn serve(
    scheduler: Scheduler,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    let service = TulipServer::new(TulipService::new(scheduler))
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    tonic::transport::Server::builder()
        .add_service(service)
        .serve_with_incoming_shutdown(
            TcpIncoming::from(listener).with_nodelay(Some(true)),
            shutdown,
        )
        .await
}

/// The gRPC contract's implementation; `TulipClient::in_process` calls it without a socket.
#[derive(Clone)]
pub(crate) struct TulipService {
    scheduler: Scheduler,
}

impl TulipService {
    pub(crate) fn new(scheduler: Scheduler) -> TulipService {
        TulipService { scheduler }
    }
}

#[tonic::async_trait]
impl Tulip for TulipService {
    async fn embed(
        &self,
        request: Request<proto::EmbedRequest>,
    ) -> Result<Response<proto::EmbedResponse>, Status> {
        let request = request.into_inner();
        let shape = validate(&request, &self.scheduler.served().model)?;
        let offsets = offsets(&request.lengths);
        let count = request.lengths.len();
        let embedded = self.scheduler.embed(request.token_ids, offsets).await?;
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

    async fn health(
        &self,
        _: Request<proto::HealthRequest>,
    ) -> Result<Response<proto::HealthResponse>, Status> {
        Ok(Response::new(proto::HealthResponse {
            ready: self.scheduler.is_ready(),
        }))
    }

    async fn tokenizer(
        &self,
        _: Request<proto::TokenizerRequest>,
    ) -> Result<Response<proto::TokenizerResponse>, Status> {
        Ok(Response::new(self.scheduler.served().tokenization.clone()))
    }
}

fn offsets(lengths: &[u32]) -> Vec<usize> {
    std::iter::once(0)
        .chain(lengths.iter().scan(0, |end, &len| {
            *end += len as usize;
            Some(*end)
        }))
        .collect()
}

/// Checks a request against the model; Ivy checks too, but Tulip trusts no client.
fn validate(request: &proto::EmbedRequest, info: &ModelInfo) -> Result<Shape, TulipError> {
    let invalid = |msg: String| Err(TulipError::Validation(msg));
    if request.lengths.is_empty() {
        return invalid("a request needs at least one sequence".into());
    }
    let total: u64 = request.lengths.iter().map(|&len| len as u64).sum();
    if total != request.token_ids.len() as u64 {
        return invalid(format!(
            "lengths add up to {total} tokens but {} were sent",
            request.token_ids.len()
        ));
    }
    if let Some(i) = request.lengths.iter().position(|&len| len == 0) {
        return invalid(format!("sequence {i} is empty"));
    }
    if let Some(i) = request
        .lengths
        .iter()
        .position(|&len| len > info.max_input_length)
    {
        return invalid(format!(
            "sequence {i} has {} tokens; the model takes at most {}",
            request.lengths[i], info.max_input_length
        ));
    }
    if let Some(&id) = request.token_ids.iter().find(|&&id| id >= info.vocab_size) {
        return invalid(format!(
            "token id {id} is outside the vocabulary (size {})",
            info.vocab_size
        ));
    }
    let dimensions = match request.dimensions {
        0 => info.dimensions as usize,
        d if d <= info.dimensions => d as usize,
        d => {
            return invalid(format!(
                "dimensions must be between 1 and {}; got {d}",
                info.dimensions
            ))
        }
    };
    let Ok(encoding) = Encoding::try_from(request.encoding) else {
        return invalid(format!("unknown encoding {}", request.encoding));
    };
    Ok(Shape {
        dimensions,
        normalize: request.normalize,
        encoding,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> ModelInfo {
        ModelInfo {
            dimensions: 8,
            max_input_length: 4,
            vocab_size: 100,
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
    }
}
