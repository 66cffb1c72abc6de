//! The Tulip replicas a gateway spreads work over (remote, or the one in this process), and the
//! fan-out of one client batch over them in chunks.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::try_join_all;
use tulip::packing::split;
use tulip::proto::{
    EmbedRequest, Encoding, InfoResponse, ModelInfo, ScoreRequest, TokenizerResponse,
};
use tulip::{Budget, TulipClient};

use crate::error::IvyError;

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

/// Where the slowest chunk of a batch spent its time on the Tulip side.
#[derive(Debug, Default, Clone, Copy)]
pub struct ChunkTimes {
    pub queue: Duration,
    pub inference: Duration,
    /// The rest of its round trip: gRPC, (de)serialization.
    pub transfer: Duration,
}

struct Replica {
    client: TulipClient,
    /// Tokens sent and not yet answered.
    in_flight: AtomicUsize,
}

/// The Tulip replicas of one model; cloning it is cheap.
#[derive(Clone)]
pub struct ReplicaSet {
    replicas: Arc<Vec<Replica>>,
    chunk: Budget,
}

impl ReplicaSet {
    /// Waits up to `patience` for each replica to answer (its engine may still be loading).
    pub async fn connect(
        clients: Vec<TulipClient>,
        patience: Duration,
    ) -> Result<(ReplicaSet, ModelInfo), IvyError> {
        let mut replicas = Vec::new();
        let mut model = None;
        for client in clients {
            let deadline = Instant::now() + patience;
            let info = loop {
                match client.info().await {
                    Ok(InfoResponse {
                        model: Some(info), ..
                    }) => break info,
                    Ok(_) => {
                        return Err(IvyError::Unavailable(format!(
                            "Tulip at {} reports no model",
                            client.target()
                        )))
                    }
                    Err(_) if Instant::now() < deadline => {
                        tokio::time::sleep(Duration::from_millis(100)).await
                    }
                    Err(e) => {
                        return Err(IvyError::Unavailable(format!(
                            "Tulip at {} does not answer: {e}",
                            client.target()
                        )))
                    }
                }
            };
            tracing::info!("Ivy uses Tulip at {} ({})", client.target(), info.model_id);
            model.get_or_insert(info);
            replicas.push(Replica {
                client,
                in_flight: AtomicUsize::new(0),
            });
        }
        let model = model.ok_or_else(|| IvyError::Unavailable("no Tulip replica given".into()))?;
        let set = ReplicaSet {
            replicas: Arc::new(replicas),
            chunk: Budget::of(&model),
        };
        Ok((set, model))
    }

    /// What the first replica serves now (its engine's live state included).
    pub async fn info(&self) -> Result<InfoResponse, IvyError> {
        Ok(self.replicas[0].client.info().await?)
    }

    /// The model's tokenizer, from the first replica.
    pub async fn tokenizer(&self) -> Result<TokenizerResponse, IvyError> {
        Ok(self.replicas[0].client.tokenizer().await?)
    }

    /// True when every replica answers and its engine runs.
    pub async fn is_healthy(&self) -> bool {
        let checks = self.replicas.iter().map(|r| r.client.health());
        futures::future::join_all(checks)
            .await
            .into_iter()
            .all(|h| matches!(h, Ok(true)))
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

    /// Cuts the sequences into chunks, sends each to the least loaded replica through `call`
    /// (client, token ids, lengths, token type ids), and returns the answers in order with
    /// each one's round trip.
    async fn fan_out<T, F, Fut>(
        &self,
        sequences: &[Vec<u32>],
        types: &[Vec<u32>],
        call: F,
    ) -> Result<Vec<(T, Duration)>, IvyError>
    where
        F: Fn(TulipClient, Vec<u32>, Vec<u32>, Vec<u32>) -> Fut,
        Fut: std::future::Future<Output = Result<T, IvyError>>,
    {
        let lengths: Vec<usize> = sequences.iter().map(Vec::len).collect();
        let calls = split(&lengths, self.chunk).into_iter().map(|range| {
            let chunk = &sequences[range.clone()];
            let token_type_ids = if types.is_empty() {
                Vec::new()
            } else {
                types[range].concat()
            };
            let tokens = chunk.iter().map(Vec::len).sum::<usize>();
            let replica = self.least_loaded();
            replica.in_flight.fetch_add(tokens, Ordering::Relaxed);
            let lengths = chunk.iter().map(|s| s.len() as u32).collect();
            let sent = call(
                replica.client.clone(),
                chunk.concat(),
                lengths,
                token_type_ids,
            );
            async move {
                // Decrement even when the caller goes away mid-call.
                let _release = Release(&replica.in_flight, tokens);
                let start = Instant::now();
                let answer = sent.await?;
                Ok((answer, start.elapsed()))
            }
        });
        try_join_all(calls).await
    }

    fn least_loaded(&self) -> &Replica {
        let loads = self
            .replicas
            .iter()
            .map(|r| r.in_flight.load(Ordering::Relaxed));
        &self.replicas[least_loaded(loads)]
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

/// Index of the replica with the least work in flight; the first one on ties (pure logic).
pub fn least_loaded(loads: impl IntoIterator<Item = usize>) -> usize {
    loads
        .into_iter()
        .enumerate()
        .min_by_key(|&(_, load)| load)
        .map_or(0, |(i, _)| i)
}

struct Release<'a>(&'a AtomicUsize, usize);

impl Drop for Release<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(self.1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_least_loaded_replica() {
        assert_eq!(least_loaded([5, 2, 9, 2]), 1);
        assert_eq!(least_loaded([0]), 0);
        assert_eq!(least_loaded([]), 0);
    }
}
