//! Ivy's side of the gRPC contract: Tulip replicas (remote, or the one in this process), and the
//! fan-out of one client batch over them.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::try_join_all;
use tulip::proto::{EmbedRequest, Encoding, InfoResponse, TokenizerResponse};
use tulip::TulipClient;

use crate::chunks::{least_loaded, split};
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
#[derive(Debug)]
pub struct Embeddings {
    pub count: usize,
    pub dimensions: usize,
    pub encoding: Encoding,
    pub data: Vec<u8>,
    /// Where the slowest chunk's time went.
    pub queue_time: Duration,
    pub inference_time: Duration,
    pub transfer_time: Duration,
}

impl Embeddings {
    /// Bytes of vector `i`.
    pub fn row(&self, i: usize) -> &[u8] {
        let width = self.data.len() / self.count.max(1);
        &self.data[i * width..(i + 1) * width]
    }
}

struct Replica {
    client: TulipClient,
    /// Tokens sent and not yet answered.
    in_flight: AtomicUsize,
}

/// The Tulip replicas Ivy spreads chunks over.
#[derive(Clone)]
pub struct Backend {
    replicas: Arc<Vec<Replica>>,
    max_chunk_tokens: usize,
    max_chunk_sequences: usize,
}

impl Backend {
    /// Waits up to `patience` for each replica to answer (its engine may still be loading).
    pub async fn connect(
        clients: Vec<TulipClient>,
        patience: Duration,
    ) -> Result<(Backend, InfoResponse), IvyError> {
        let mut replicas = Vec::new();
        let mut info = None;
        for client in clients {
            let deadline = Instant::now() + patience;
            let replica_info = loop {
                match client.info().await {
                    Ok(replica_info) => break replica_info,
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
            tracing::info!(
                "Ivy uses Tulip at {} ({})",
                client.target(),
                replica_info.model_id
            );
            info.get_or_insert(replica_info);
            replicas.push(Replica {
                client,
                in_flight: AtomicUsize::new(0),
            });
        }
        let info = info.ok_or_else(|| IvyError::Unavailable("no Tulip replica given".into()))?;
        let backend = Backend {
            replicas: Arc::new(replicas),
            max_chunk_tokens: info.max_batch_tokens.max(1) as usize,
            max_chunk_sequences: info.max_batch_requests.max(1) as usize,
        };
        Ok((backend, info))
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

    /// Embeds `sequences`: split into chunks, sent to replicas in parallel, put back in order.
    pub async fn embed(
        &self,
        sequences: &[Vec<u32>],
        shape: VectorShape,
    ) -> Result<Embeddings, IvyError> {
        let lengths: Vec<usize> = sequences.iter().map(Vec::len).collect();
        let chunks = split(&lengths, self.max_chunk_tokens, self.max_chunk_sequences);
        let calls = chunks.into_iter().map(|range| {
            let chunk = &sequences[range];
            let request = EmbedRequest {
                token_ids: chunk.concat(),
                lengths: chunk.iter().map(|s| s.len() as u32).collect(),
                normalize: shape.normalize,
                dimensions: shape.dimensions,
                encoding: shape.encoding.into(),
            };
            self.send(request)
        });
        let answers = try_join_all(calls).await?;
        let slowest = answers
            .iter()
            .max_by_key(|(_, rpc)| *rpc)
            .map(|(a, rpc)| (a.queue_us, a.inference_us, *rpc));
        let (queue_us, inference_us, rpc) = slowest.unwrap_or_default();
        let queue_time = Duration::from_micros(queue_us);
        let inference_time = Duration::from_micros(inference_us);
        let dimensions = answers.first().map_or(0, |(a, _)| a.dimensions as usize);
        let mut data = Vec::with_capacity(answers.iter().map(|(a, _)| a.data.len()).sum());
        answers
            .iter()
            .for_each(|(a, _)| data.extend_from_slice(&a.data));
        Ok(Embeddings {
            count: sequences.len(),
            dimensions,
            encoding: shape.encoding,
            data,
            queue_time,
            inference_time,
            transfer_time: rpc.saturating_sub(queue_time + inference_time),
        })
    }

    async fn send(
        &self,
        request: EmbedRequest,
    ) -> Result<(tulip::proto::EmbedResponse, Duration), IvyError> {
        let tokens = request.token_ids.len();
        let replica = &self.replicas[least_loaded(
            self.replicas
                .iter()
                .map(|r| r.in_flight.load(Ordering::Relaxed)),
        )];
        replica.in_flight.fetch_add(tokens, Ordering::Relaxed);
        // Decrement even when the caller goes away mid-call.
        let _release = Release(&replica.in_flight, tokens);
        let start = Instant::now();
        let answer = replica.client.embed(request).await?;
        Ok((answer, start.elapsed()))
    }
}

struct Release<'a>(&'a AtomicUsize, usize);

impl Drop for Release<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(self.1, Ordering::Relaxed);
    }
}
