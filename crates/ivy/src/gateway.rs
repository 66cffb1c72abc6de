//! The gateway's state, shared by every request handler: the replica pool, and per served model
//! its replicas, tokenizer pool and template; the limits. A [`Gateway`] is that state seen
//! through one model (the request's), so the request paths never name a model themselves.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use metrics_exporter_prometheus::PrometheusHandle;
use tokenizers::Tokenizer;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tulip::proto::ModelInfo;
use tulip::TulipClient;

use crate::admission::{longest_wait, DrainRate};
use crate::config::{self, IvyArgs};
use crate::error::IvyError;
use crate::fast_tokenizer::FastTokenizer;
use crate::key_limits::KeyLimits;
use crate::replicas::discovery::{Resolve, SystemResolver};
use crate::replicas::{Pool, ReplicaSet};
use crate::template::{ColbertTemplate, PairTemplate, Template};
use crate::tokenization::TokenizerPool;
use tulip::scheduler::SMALL_REQUEST_TOKENS;

/// Where the gateway's Tulips are.
pub enum Tulips {
    /// The one in this process (`ivy-serve` without `--tulip-endpoint`).
    InProcess(TulipClient),
    /// `--tulip-endpoint` values: addresses, or DNS names re-resolved for replicas.
    Endpoints(Vec<String>),
}

/// Everything a request handler needs, for the model it serves; cloning it is cheap.
#[derive(Clone)]
pub struct Gateway {
    shared: Arc<Shared>,
    /// Which of `shared.models` this handle serves.
    index: usize,
}

struct Shared {
    args: IvyArgs,
    pool: Arc<Pool>,
    models: Vec<Served>,
    metrics: PrometheusHandle,
    limits: KeyLimits,
    /// Set at SIGTERM: /health answers 503 and answers close their connections.
    draining: AtomicBool,
}

/// One served model: what its replicas serve, and what Ivy needs to send them requests.
struct Served {
    info: ModelInfo,
    replicas: ReplicaSet,
    tokenizer: TokenizerPool,
    template: Template,
    /// A causal reranker's prompt prefix and suffix as token ids, tokenized once.
    affixes: (Arc<[u32]>, Arc<[u32]>),
    /// Its own `--max-concurrent-requests`, so that one model's flood does not refuse another's.
    limiter: Arc<Semaphore>,
    /// Tokens of large requests admitted and not yet answered (`--max-queued-tokens`).
    queued_tokens: Arc<Semaphore>,
    /// How fast those tokens drain, for refusing what would wait past its deadline.
    drain: Arc<DrainRate>,
}

/// A large request's place in the queue, held until it is answered; its tokens then count
/// towards the drain rate.
pub struct Admission {
    permit: OwnedSemaphorePermit,
    tokens: usize,
    admitted: Instant,
    drain: Arc<DrainRate>,
    budget: usize,
}

impl Drop for Admission {
    fn drop(&mut self) {
        let queue = self.permit.semaphore();
        let others = self.budget - queue.available_permits() - self.permit.num_permits();
        (self.drain).finished(self.tokens, others > 0, self.admitted, Instant::now());
    }
}

/// The model folder's tokenizer.json, read and parsed on a blocking thread while the engine
/// loads (a large one takes tens of milliseconds), so that it is off the start's critical path.
pub struct EarlyTokenizer(tokio::task::JoinHandle<Option<(Vec<u8>, Tokenizer)>>);

impl EarlyTokenizer {
    /// Starts reading `path`; call inside the async runtime.
    pub fn start(path: PathBuf) -> EarlyTokenizer {
        EarlyTokenizer(tokio::task::spawn_blocking(move || {
            let bytes = std::fs::read(path).ok()?;
            let tokenizer = Tokenizer::from_bytes(&bytes).ok()?;
            Some((bytes, tokenizer))
        }))
    }

    /// The parsed tokenizer, if it was read from exactly the bytes that Tulip sent.
    async fn take(self, sent: &[u8]) -> Option<Tokenizer> {
        match self.0.await {
            Ok(Some((read, tokenizer))) if read == sent => Some(tokenizer),
            _ => None,
        }
    }
}

impl Gateway {
    /// Finds the `tulips` (waiting up to `patience` for each endpoint to answer: an engine may
    /// still be loading), groups them by the model they serve, fetches each model's tokenizer
    /// (taking `early`'s when it is the same file) and starts its tokenizer pool. `metrics`
    /// renders /metrics.
    pub async fn connect(
        args: IvyArgs,
        tulips: Tulips,
        patience: Duration,
        metrics: PrometheusHandle,
        early: Option<EarlyTokenizer>,
    ) -> Result<Gateway, IvyError> {
        Gateway::connect_with(
            args,
            tulips,
            Arc::new(SystemResolver),
            patience,
            metrics,
            early,
        )
        .await
    }

    /// [`Gateway::connect`] with names resolved by `resolver`.
    pub async fn connect_with(
        args: IvyArgs,
        tulips: Tulips,
        resolver: Arc<dyn Resolve>,
        patience: Duration,
        metrics: PrometheusHandle,
        early: Option<EarlyTokenizer>,
    ) -> Result<Gateway, IvyError> {
        let pool = crate::replicas::start::start(&args, tulips, resolver, patience).await?;
        let mut early = early;
        let mut models = Vec::new();
        for info in pool.models() {
            let replicas = ReplicaSet::new(pool.clone(), &info, args.replica_timeout);
            models.push(Served::load(&args, info, replicas, early.take()).await?);
        }
        let limits = KeyLimits::new(
            args.api_key_requests_per_second,
            args.api_key_tokens_per_minute,
        );
        let shared = Shared {
            args,
            pool,
            models,
            metrics,
            limits,
            draining: AtomicBool::new(false),
        };
        Ok(Gateway {
            shared: Arc::new(shared),
            index: 0,
        })
    }

    /// The gateway seen through the model a request names (`name`: its `model` field), or, when
    /// it names none, the only model served for `task` ("embed" or "score"). With one model
    /// served every name is taken, as OpenAI clients send names of their own.
    pub fn select(&self, name: Option<&str>, task: &str) -> Result<Gateway, IvyError> {
        let models = &self.shared.models;
        let pick = |index| {
            Ok(Gateway {
                shared: self.shared.clone(),
                index,
            })
        };
        if models.len() == 1 {
            return pick(0);
        }
        let names = || {
            let names: Vec<&str> = models.iter().map(|m| m.info.model_id.as_str()).collect();
            names.join(", ")
        };
        if let Some(name) = name {
            return match models
                .iter()
                .position(|m| names_model(name, &m.info.model_id))
            {
                Some(index) => pick(index),
                None => Err(IvyError::NotFound(format!(
                    "the model {name:?} is not served here; served: {}",
                    names()
                ))),
            };
        }
        let of_task: Vec<usize> = (0..models.len())
            .filter(|&i| models[i].info.task == task)
            .collect();
        match of_task[..] {
            [index] => pick(index),
            _ => Err(IvyError::Validation(format!(
                "several models are served ({}): name one in the request's `model` field",
                names()
            ))),
        }
    }

    /// Every served model's handle, in the order they were found.
    pub fn all(&self) -> Vec<Gateway> {
        (0..self.shared.models.len())
            .map(|index| Gateway {
                shared: self.shared.clone(),
                index,
            })
            .collect()
    }

    fn served(&self) -> &Served {
        &self.shared.models[self.index]
    }

    pub fn args(&self) -> &IvyArgs {
        &self.shared.args
    }

    /// Every replica, whatever model it serves.
    pub fn pool(&self) -> &Pool {
        &self.shared.pool
    }

    /// True once the server drains (after SIGTERM).
    pub fn is_draining(&self) -> bool {
        self.shared.draining.load(Ordering::Relaxed)
    }

    /// Starts draining: /health answers 503 from now on.
    pub fn drain(&self) {
        self.shared.draining.store(true, Ordering::Relaxed);
    }

    /// The per-key limits (of --api-key-requests-per-second, --api-key-tokens-per-minute).
    pub fn key_limits(&self) -> &KeyLimits {
        &self.shared.limits
    }

    pub fn replicas(&self) -> &ReplicaSet {
        &self.served().replicas
    }

    pub fn tokenizer(&self) -> &TokenizerPool {
        &self.served().tokenizer
    }

    /// What the model's first replica reported at start.
    pub fn model(&self) -> &ModelInfo {
        &self.served().info
    }

    pub fn metrics(&self) -> &PrometheusHandle {
        &self.shared.metrics
    }

    /// The prompt text for `name` (or the default one).
    pub fn prompt(&self, name: Option<&str>) -> Result<&str, IvyError> {
        (self.served().template).prompt(name, self.args().default_prompt_name.as_deref())
    }

    /// A ColBERT model's query and document template.
    pub fn colbert(&self) -> Option<&ColbertTemplate> {
        self.served().template.multi_vector.as_ref()
    }

    /// A score model's pair template.
    pub fn pair_template(&self) -> Option<&PairTemplate> {
        self.served().template.score.as_ref()
    }

    /// A rendered pair prompt's prefix and suffix as token ids (empty for other templates).
    pub fn affixes(&self) -> &(Arc<[u32]>, Arc<[u32]>) {
        &self.served().affixes
    }

    /// A slot under the model's `--max-concurrent-requests`, held for the request's life.
    pub fn admit(&self) -> Result<OwnedSemaphorePermit, IvyError> {
        (self.served().limiter.clone())
            .try_acquire_owned()
            .map_err(|_| IvyError::Overloaded)
    }

    /// Admits a tokenized request's `tokens` into the queue: 413 past --max-request-tokens, 429 at
    /// once when the queue is full or its work would take longer than half the --request-timeout
    /// at the rate it drains. Small requests (queries) have a budget of their own, the request
    /// count alone, so that a flood of large batches cannot shut them out; a request larger than
    /// the whole budget runs alone.
    pub fn admit_tokens(&self, tokens: usize) -> Result<Option<Admission>, IvyError> {
        let args = self.args();
        self.check_request_tokens(tokens)?;
        if tokens <= SMALL_REQUEST_TOKENS {
            return Ok(None);
        }
        let served = self.served();
        let queued = args.max_queued_tokens - served.queued_tokens.available_permits();
        let longest = longest_wait(args.request_timeout);
        if let Some(wait) = served.drain.wait(queued + tokens) {
            if queued > 0 && wait > longest {
                return Err(IvyError::Backlogged { wait, longest });
            }
        }
        let wanted = tokens.min(args.max_queued_tokens).max(1) as u32;
        let permit = (served.queued_tokens.clone())
            .try_acquire_many_owned(wanted)
            .map_err(|_| IvyError::Overloaded)?;
        Ok(Some(self.admission(permit, tokens)))
    }

    /// Queues a later part of an admitted request (a pipelined rerank's next group of pairs;
    /// `total`: the request's tokens so far, this part's included): 413 past
    /// --max-request-tokens; otherwise it waits for room in the queue instead of refusing work
    /// the request has begun, and the drain rate is not asked again, since the request's own
    /// earlier parts are most of the queue it would see.
    pub async fn join_queue(
        &self,
        tokens: usize,
        total: usize,
    ) -> Result<Option<Admission>, IvyError> {
        self.check_request_tokens(total)?;
        if tokens <= SMALL_REQUEST_TOKENS {
            return Ok(None);
        }
        let wanted = tokens.min(self.args().max_queued_tokens).max(1) as u32;
        let permit = (self.served().queued_tokens.clone())
            .acquire_many_owned(wanted)
            .await
            .map_err(|_| IvyError::Overloaded)?;
        Ok(Some(self.admission(permit, tokens)))
    }

    fn check_request_tokens(&self, tokens: usize) -> Result<(), IvyError> {
        let most = self.args().max_request_tokens;
        if tokens > most {
            return Err(IvyError::TooLarge(format!(
                "the request has {tokens} tokens, more than the server's --max-request-tokens ({most})"
            )));
        }
        Ok(())
    }

    fn admission(&self, permit: OwnedSemaphorePermit, tokens: usize) -> Admission {
        Admission {
            permit,
            tokens,
            admitted: Instant::now(),
            drain: self.served().drain.clone(),
            budget: self.args().max_queued_tokens,
        }
    }
}

/// Whether a request's `model` names `id`: the id itself, or its last path part
/// (`all-MiniLM-L6-v2` for `sentence-transformers/all-MiniLM-L6-v2`).
fn names_model(name: &str, id: &str) -> bool {
    name == id || id.rsplit('/').next() == Some(name)
}

/// Reads the v1 pipeline of `json` (the pool's tokenizer.json) on a blocking thread and hands it
/// to `pool` if it gives the classic tokenizer's ids: the classic one serves until then, so that a
/// large vocabulary's second read does not delay the first answer.
fn load_fast_tokenizer(pool: &TokenizerPool, json: Vec<u8>, model: &str) {
    let (pool, model) = (pool.clone(), model.to_string());
    tokio::task::spawn_blocking(move || {
        let start = Instant::now();
        match FastTokenizer::load(&json, pool.reference()) {
            Ok(fast) => {
                pool.use_fast(fast);
                let took = start.elapsed();
                tracing::info!("{model}: token ids from the v1 tokenizer pipeline after {took:?}");
            }
            Err(why) => tracing::warn!("{model}: the classic tokenizer only, since v1 {why}"),
        }
    });
}

impl Served {
    /// Fetches the model's tokenizer and template from a replica and starts its tokenizer pool.
    async fn load(
        args: &IvyArgs,
        info: ModelInfo,
        replicas: ReplicaSet,
        early: Option<EarlyTokenizer>,
    ) -> Result<Served, IvyError> {
        let setup = replicas.tokenizer().await?;
        let parsed = match early {
            Some(early) => early.take(&setup.tokenizer_json).await,
            None => None,
        };
        tracing::debug!(
            "tokenizer parsed while the engine loaded: {}",
            parsed.is_some()
        );
        let tokenizer = match parsed {
            Some(tokenizer) => tokenizer,
            None => Tokenizer::from_bytes(&setup.tokenizer_json).map_err(|e| {
                IvyError::Engine(format!(
                    "the tokenizer.json of {} cannot be read: {e}",
                    info.model_id
                ))
            })?,
        };
        let template = Template::from_json(&setup.template_json)
            .map_err(|e| IvyError::Engine(format!("Tulip sent an unreadable template: {e}")))?;
        let workers = args
            .tokenization_workers
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        let tokenizer = TokenizerPool::new(tokenizer, workers, template.max_input_length);
        if args.fast_tokenizer == config::FastTokenizerMode::Auto {
            load_fast_tokenizer(&tokenizer, setup.tokenizer_json.clone(), &info.model_id);
        }
        let affixes = match &template.score {
            Some(PairTemplate::Rendered { prefix, suffix, .. }) => (
                tokenizer.plain_ids(prefix)?.into(),
                tokenizer.plain_ids(suffix)?.into(),
            ),
            _ => (Arc::from([]), Arc::from([])),
        };
        Ok(Served {
            info,
            replicas,
            tokenizer,
            template,
            affixes,
            limiter: Arc::new(Semaphore::new(args.max_concurrent_requests)),
            queued_tokens: Arc::new(Semaphore::new(args.max_queued_tokens)),
            drain: Arc::new(DrainRate::new(Instant::now())),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKENIZER: &str = r#"{"version": "1.0", "added_tokens": [], "normalizer": null, "decoder": null,
        "truncation": null, "padding": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
        "model": {"type": "WordLevel", "vocab": {"[UNK]": 0, "a": 1}, "unk_token": "[UNK]"}}"#;

    #[test]
    fn a_request_names_a_model_by_id_or_its_last_part() {
        assert!(names_model("org/m", "org/m"));
        assert!(names_model("m", "org/m"));
        assert!(!names_model("org", "org/m"));
        assert!(!names_model("n", "org/m"));
    }

    #[tokio::test]
    async fn an_early_tokenizer_is_taken_only_for_the_same_bytes() {
        let path = std::env::temp_dir().join(format!("ivy-early-{}.json", std::process::id()));
        std::fs::write(&path, TOKENIZER).unwrap();
        let same = EarlyTokenizer::start(path.clone())
            .take(TOKENIZER.as_bytes())
            .await;
        assert_eq!(
            same.unwrap().encode("a b", false).unwrap().get_ids(),
            &[1, 0]
        );
        let other = format!("{TOKENIZER} ");
        assert!(EarlyTokenizer::start(path.clone())
            .take(other.as_bytes())
            .await
            .is_none());
        std::fs::remove_file(&path).unwrap();
        assert!(EarlyTokenizer::start(path)
            .take(TOKENIZER.as_bytes())
            .await
            .is_none());
    }
}
