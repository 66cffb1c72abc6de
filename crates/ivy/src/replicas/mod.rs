//! The Tulip replicas a gateway spreads work over (remote, or the one in this process), and the
//! fan-out of one client batch over them in chunks: `pool` keeps every replica's state,
//! `balance` picks one per chunk, `discovery` follows DNS names, `identity` tells models apart.

pub mod balance;
pub mod discovery;
pub mod identity;
pub mod pool;
pub mod start;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::try_join_all;
use tonic::Status;
use tulip::packing::split;
use tulip::proto::{
    EmbedRequest, EncodeRequest, EncodeResponse, Encoding, InfoResponse, ModelInfo, ScoreRequest,
    TokenizerResponse,
};
use tulip::{Budget, TulipClient, TulipError};

use crate::error::IvyError;
use balance::retryable;
pub use pool::{Pool, Replica, Watch};

/// How the client wants its vectors.
#[derive(Debug, Clone, Copy)]
pub struct VectorShape {
    pub normalize: bool,
    /// 0 keeps the model's full dimension.
    pub dimensions: u32,
    pub encoding: Encoding,
}

/// The vectors of a whole client batch, in input order, packed as Tulip sent them.
#[derive(Debug, Default)]
pub struct Vectors {
    pub count: usize,
    pub dimensions: usize,
    pub encoding: Encoding,
    pub data: Vec<u8>,
}

impl Vectors {
    /// Bytes of vector `i`.
    pub fn row(&self, i: usize) -> &[u8] {
        let width = self.data.len() / self.count.max(1);
        &self.data[i * width..(i + 1) * width]
    }
}

/// Float32 values from their little-endian bytes (a float32 row of [`Vectors`]).
pub fn floats(bytes: &[u8]) -> Vec<f32> {
    (bytes.chunks_exact(4))
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// Where the slowest chunk of a batch spent its time on the Tulip side.
#[derive(Debug, Default, Clone, Copy)]
pub struct ChunkTimes {
    pub queue: Duration,
    pub inference: Duration,
    /// The rest of its round trip: gRPC, (de)serialization.
    pub transfer: Duration,
}

/// The replicas of one model; cloning it is cheap.
#[derive(Clone)]
pub struct ReplicaSet {
    pool: Arc<Pool>,
    model: String,
    chunk: Budget,
    /// Longest a chunk may take on one replica before it is retried on another.
    timeout: Duration,
}

impl ReplicaSet {
    /// `model`'s replicas in `pool`; chunks are cut by its batch limits.
    pub fn new(pool: Arc<Pool>, model: &ModelInfo, timeout: Duration) -> ReplicaSet {
        ReplicaSet {
            pool,
            model: model.model_id.clone(),
            chunk: Budget::of(model),
            timeout,
        }
    }

    /// What a ready replica serves now (its engine's live state included); a replica that does
    /// not answer within the health timeout is not waited for.
    pub async fn info(&self) -> Result<InfoResponse, IvyError> {
        let replica = self.ready()?;
        match tokio::time::timeout(self.pool.health_timeout(), replica.client.info()).await {
            Ok(answer) => Ok(answer?),
            Err(_) => Err(IvyError::Unavailable(format!(
                "Tulip at {} did not answer Info in time",
                replica.url
            ))),
        }
    }

    /// The model's tokenizer, from a ready replica.
    pub async fn tokenizer(&self) -> Result<TokenizerResponse, IvyError> {
        let replica = self.ready()?;
        Ok(replica.client.tokenizer().await?)
    }

    fn ready(&self) -> Result<Arc<Replica>, IvyError> {
        self.pool
            .pick(&self.model, None)
            .ok_or_else(|| self.none_ready())
    }

    fn none_ready(&self) -> IvyError {
        IvyError::Unavailable(format!("no replica of {} is ready", self.model))
    }

    /// Embeds `sequences` (`types`: their token type ids, or empty): split into chunks (the
    /// rule Tulip packs its steps by), sent to replicas in parallel, put back in order.
    pub async fn embed(
        &self,
        sequences: &[Vec<u32>],
        types: &[Vec<u32>],
        shape: VectorShape,
    ) -> Result<(Vectors, ChunkTimes), IvyError> {
        let answers = self
            .fan_out(
                sequences,
                types,
                |client, token_ids, lengths, token_type_ids| async move {
                    let request = EmbedRequest {
                        token_ids,
                        lengths,
                        token_type_ids,
                        normalize: shape.normalize,
                        dimensions: shape.dimensions,
                        encoding: shape.encoding.into(),
                    };
                    let answer = client.embed(request).await?;
                    let times = (answer.queue_us, answer.inference_us);
                    Ok((answer, times))
                },
            )
            .await?;
        let times = slowest(answers.iter().map(|(a, t)| (a.1, *t)));
        let mut data = Vec::with_capacity(answers.iter().map(|((a, _), _)| a.data.len()).sum());
        answers
            .iter()
            .for_each(|((a, _), _)| data.extend_from_slice(&a.data));
        let vectors = Vectors {
            count: sequences.len(),
            dimensions: answers
                .first()
                .map_or(0, |((a, _), _)| a.dimensions as usize),
            encoding: shape.encoding,
            data,
        };
        Ok((vectors, times))
    }

    /// Encodes `sequences` as `template` asks (its outputs, normalization and pruning), in
    /// chunks as `embed` does; the chunks' answers joined in order.
    pub async fn encode(
        &self,
        sequences: &[Vec<u32>],
        template: &EncodeRequest,
    ) -> Result<(EncodeResponse, ChunkTimes), IvyError> {
        let answers = self
            .fan_out(
                sequences,
                &[],
                |client, token_ids, lengths, token_type_ids| async move {
                    let request = EncodeRequest {
                        token_ids,
                        lengths,
                        token_type_ids,
                        ..template.clone()
                    };
                    let answer = client.encode(request).await?;
                    let times = (answer.queue_us, answer.inference_us);
                    Ok((answer, times))
                },
            )
            .await?;
        let times = slowest(answers.iter().map(|(a, t)| (a.1, *t)));
        let merged = tulip::outputs::merge(answers.into_iter().map(|((a, _), _)| a));
        Ok((merged, times))
    }

    /// Scores `sequences` (a score model's): one row of `labels` values a sequence, in order.
    pub async fn score(
        &self,
        sequences: &[Vec<u32>],
        types: &[Vec<u32>],
        raw_scores: bool,
    ) -> Result<(Vec<f32>, usize, ChunkTimes), IvyError> {
        let answers = self
            .fan_out(
                sequences,
                types,
                |client, token_ids, lengths, token_type_ids| async move {
                    let request = ScoreRequest {
                        token_ids,
                        lengths,
                        token_type_ids,
                        raw_scores,
                    };
                    let answer = client.score(request).await?;
                    let times = (answer.queue_us, answer.inference_us);
                    Ok((answer, times))
                },
            )
            .await?;
        let times = slowest(answers.iter().map(|(a, t)| (a.1, *t)));
        let labels = answers.first().map_or(1, |((a, _), _)| a.labels as usize);
        let scores = answers
            .into_iter()
            .flat_map(|((a, _), _)| a.scores)
            .collect();
        Ok((scores, labels, times))
    }

    /// Cuts the sequences into chunks and sends each to the least loaded ready replica through
    /// `call` (client, token ids, lengths, token type ids); returns the answers in order with
    /// each one's round trip. A chunk that fails for a transport reason (or takes longer than the
    /// replica timeout) goes once to another replica.
    async fn fan_out<T, F, Fut>(
        &self,
        sequences: &[Vec<u32>],
        types: &[Vec<u32>],
        call: F,
    ) -> Result<Vec<(T, Duration)>, IvyError>
    where
        F: Fn(TulipClient, Vec<u32>, Vec<u32>, Vec<u32>) -> Fut,
        Fut: std::future::Future<Output = Result<T, TulipError>>,
    {
        let lengths: Vec<usize> = sequences.iter().map(Vec::len).collect();
        let call = &call;
        let calls = split(&lengths, self.chunk)
            .into_iter()
            .map(|range| async move {
                let chunk = &sequences[range.clone()];
                let types = if types.is_empty() {
                    &[][..]
                } else {
                    &types[range]
                };
                let tokens = chunk.iter().map(Vec::len).sum::<usize>();
                let send = |replica: Arc<Replica>| {
                    let lengths = chunk.iter().map(|s| s.len() as u32).collect();
                    let sent = call(
                        replica.client.clone(),
                        chunk.concat(),
                        lengths,
                        types.concat(),
                    );
                    self.attempt(replica, tokens, sent)
                };
                let first = self.ready()?;
                match send(first.clone()).await {
                    Err(err) if retryable(err.code()) => {
                        self.pool.failed(&first, &err.to_string());
                        let Some(second) = self.pool.pick(&self.model, Some(&first)) else {
                            return Err(IvyError::from(err));
                        };
                        metrics::counter!("ivy_chunk_retries_total").increment(1);
                        send(second).await.map_err(IvyError::from)
                    }
                    answer => answer.map_err(IvyError::from),
                }
            });
        try_join_all(calls).await
    }

    /// One chunk's call on `replica`, counted in its load, given up when the replica is found
    /// down (a hung one fails its health checks) or after the replica timeout.
    async fn attempt<T>(
        &self,
        replica: Arc<Replica>,
        tokens: usize,
        sent: impl std::future::Future<Output = Result<T, TulipError>>,
    ) -> Result<(T, Duration), TulipError> {
        replica.in_flight.fetch_add(tokens, Ordering::Relaxed);
        replica.counted_chunk();
        // Decrements even when the caller goes away mid-call.
        let _release = Release(&replica.in_flight, tokens);
        let start = Instant::now();
        let down = replica.went_down();
        tokio::select! {
            answer = tokio::time::timeout(self.timeout, sent) => match answer {
                Ok(answer) => Ok((answer?, start.elapsed())),
                Err(_) => Err(TulipError::Remote(Status::deadline_exceeded(format!(
                    "Tulip at {} did not answer a chunk within {:?} (--replica-timeout)",
                    replica.url, self.timeout
                )))),
            },
            _ = down => Err(TulipError::Remote(Status::unavailable(format!(
                "Tulip at {} went down with the chunk in flight",
                replica.url
            )))),
        }
    }
}

/// The times of the chunk whose round trip was the longest: (its (queue, inference) in
/// microseconds as Tulip reported them, its round trip).
fn slowest(chunks: impl Iterator<Item = ((u64, u64), Duration)>) -> ChunkTimes {
    chunks
        .max_by_key(|(_, rpc)| *rpc)
        .map(|((queue_us, inference_us), rpc)| {
            let queue = Duration::from_micros(queue_us);
            let inference = Duration::from_micros(inference_us);
            ChunkTimes {
                queue,
                inference,
                transfer: rpc.saturating_sub(queue + inference),
            }
        })
        .unwrap_or_default()
}

struct Release<'a>(&'a AtomicUsize, usize);

impl Drop for Release<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(self.1, Ordering::Relaxed);
    }
}
