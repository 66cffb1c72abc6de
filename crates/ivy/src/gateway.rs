//! The gateway's state, shared by every request handler: the replicas, the tokenizer pool, the
//! model's template, the limits.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use tokenizers::Tokenizer;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tulip::proto::ModelInfo;
use tulip::TulipClient;

use crate::config::IvyArgs;
use crate::error::IvyError;
use crate::replicas::ReplicaSet;
use crate::template::{PairTemplate, Template};
use crate::tokenization::TokenizerPool;

/// Everything a request handler needs; cloning it is cheap.
#[derive(Clone)]
pub struct Gateway {
    inner: Arc<Inner>,
}

struct Inner {
    args: IvyArgs,
    replicas: ReplicaSet,
    tokenizer: TokenizerPool,
    template: Template,
    /// A causal reranker's prompt prefix and suffix as token ids, tokenized once.
    affixes: (Arc<[u32]>, Arc<[u32]>),
    model: ModelInfo,
    limiter: Arc<Semaphore>,
    metrics: PrometheusHandle,
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
    /// Connects to the Tulip `replicas` (waiting up to `patience` for each to answer), fetches
    /// the model's tokenizer (taking `early`'s when it is the same file), and starts the tokenizer
    /// pool. `metrics` renders /metrics.
    pub async fn connect(
        args: IvyArgs,
        replicas: Vec<TulipClient>,
        patience: Duration,
        metrics: PrometheusHandle,
        early: Option<EarlyTokenizer>,
    ) -> Result<Gateway, IvyError> {
        let (replicas, model) = ReplicaSet::connect(replicas, patience).await?;
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
                IvyError::Engine(format!("the model's tokenizer.json cannot be read: {e}"))
            })?,
        };
        let template = Template::from_json(&setup.template_json)
            .map_err(|e| IvyError::Engine(format!("Tulip sent an unreadable template: {e}")))?;
        let workers = args
            .tokenization_workers
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        let tokenizer = TokenizerPool::new(tokenizer, workers, template.max_input_length);
        let affixes = match &template.score {
            Some(PairTemplate::Rendered { prefix, suffix, .. }) => (
                tokenizer.plain_ids(prefix)?.into(),
                tokenizer.plain_ids(suffix)?.into(),
            ),
            _ => (Arc::from([]), Arc::from([])),
        };
        let limiter = Arc::new(Semaphore::new(args.max_concurrent_requests));
        Ok(Gateway {
            inner: Arc::new(Inner {
                args,
                replicas,
                tokenizer,
                template,
                affixes,
                model,
                limiter,
                metrics,
            }),
        })
    }

    pub fn args(&self) -> &IvyArgs {
        &self.inner.args
    }

    pub fn replicas(&self) -> &ReplicaSet {
        &self.inner.replicas
    }

    pub fn tokenizer(&self) -> &TokenizerPool {
        &self.inner.tokenizer
    }

    /// What Tulip reported about the model at start.
    pub fn model(&self) -> &ModelInfo {
        &self.inner.model
    }

    pub fn metrics(&self) -> &PrometheusHandle {
        &self.inner.metrics
    }

    /// The prompt text for `name` (or the default one).
    pub fn prompt(&self, name: Option<&str>) -> Result<&str, IvyError> {
        self.inner
            .template
            .prompt(name, self.inner.args.default_prompt_name.as_deref())
    }

    /// A score model's pair template.
    pub fn pair_template(&self) -> Option<&PairTemplate> {
        self.inner.template.score.as_ref()
    }

    /// A rendered pair prompt's prefix and suffix as token ids (empty for other templates).
    pub fn affixes(&self) -> &(Arc<[u32]>, Arc<[u32]>) {
        &self.inner.affixes
    }

    /// A slot under `--max-concurrent-requests`, held for the request's life.
    pub fn admit(&self) -> Result<OwnedSemaphorePermit, IvyError> {
        self.inner
            .limiter
            .clone()
            .try_acquire_owned()
            .map_err(|_| IvyError::Overloaded)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKENIZER: &str = r#"{"version": "1.0", "added_tokens": [], "normalizer": null, "decoder": null,
        "truncation": null, "padding": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
        "model": {"type": "WordLevel", "vocab": {"[UNK]": 0, "a": 1}, "unk_token": "[UNK]"}}"#;

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
