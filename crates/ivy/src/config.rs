//! Ivy's command-line flags (each also readable from an environment variable). Names follow
//! text-embeddings-inference where it has the same flag.

use std::num::NonZeroU32;
use std::time::Duration;

use clap::Args;
use tulip::config::heading;
use tulip::ApiKeys;

/// Flags of the Ivy HTTP gateway.
#[derive(Debug, Clone, Args)]
pub struct IvyArgs {
    /// HTTP port.
    #[arg(long, env = "PORT", default_value_t = 3000, help_heading = heading::SERVING)]
    pub port: u16,

    /// Address to listen on (0.0.0.0 for every interface).
    #[arg(long, env = "IVY_HOSTNAME", default_value = "0.0.0.0", help_heading = heading::SERVING)]
    pub hostname: String,

    /// Most inputs in one client request.
    #[arg(long, env = "MAX_CLIENT_BATCH_SIZE", default_value_t = 2048, help_heading = heading::LIMITS)]
    pub max_client_batch_size: usize,

    /// Most requests handled at once (for each served model); more are answered 429.
    #[arg(long, env = "MAX_CONCURRENT_REQUESTS", default_value_t = 512, help_heading = heading::LIMITS)]
    pub max_concurrent_requests: usize,

    /// Most tokens of large requests (over 1,024 tokens) admitted and not yet answered, for each
    /// served model; a request past it, or one whose wait at the measured drain rate would pass
    /// half the --request-timeout, is answered 429 at once. Small requests are bounded by
    /// --max-concurrent-requests alone.
    #[arg(long, env = "MAX_QUEUED_TOKENS", default_value_t = 1 << 20, help_heading = heading::LIMITS)]
    pub max_queued_tokens: usize,

    /// Most tokens one request may have, all its inputs together (after truncation); past it,
    /// 413 at once.
    #[arg(long, env = "MAX_REQUEST_TOKENS", default_value_t = 1 << 20, help_heading = heading::LIMITS)]
    pub max_request_tokens: usize,

    /// Largest request body in bytes.
    #[arg(long, env = "PAYLOAD_LIMIT", default_value_t = 2_000_000, help_heading = heading::LIMITS)]
    pub payload_limit: usize,

    /// Truncate inputs longer than the model's limit instead of rejecting them, unless a request
    /// says otherwise.
    #[arg(long, env = "AUTO_TRUNCATE", default_value_t = false, help_heading = heading::LIMITS)]
    pub auto_truncate: bool,

    /// Inputs longer than the model's limit: `truncate` (cut, or 422, by `truncate` and
    /// --auto-truncate) or `chunk` (embedded in overlapping windows whose vectors are averaged,
    /// weighted by their tokens); a request's `long_inputs` field overrides it.
    #[arg(long, env = "LONG_INPUTS", value_enum, default_value_t = LongInputs::Truncate,
          help_heading = heading::LIMITS)]
    pub long_inputs: LongInputs,

    /// Tokens two consecutive windows of a chunked input share.
    #[arg(long, env = "CHUNK_OVERLAP", default_value_t = 32, help_heading = heading::LIMITS)]
    pub chunk_overlap: usize,

    /// Seconds a request may take from arrival to answer; past it, 504 and its work is dropped
    /// (its chunks leave the queue before they reach the engine).
    #[arg(long, env = "REQUEST_TIMEOUT", default_value = "600", value_parser = seconds,
          help_heading = heading::LIMITS)]
    pub request_timeout: Duration,

    /// Seconds to keep serving after SIGTERM with /health answering 503, so that a load balancer
    /// takes this server out before it refuses new connections.
    #[arg(long, env = "DRAIN_DELAY", default_value = "0", value_parser = seconds,
          help_heading = heading::SERVING)]
    pub drain_delay: Duration,

    /// Seconds the admitted requests have to finish once new connections are refused; past it
    /// the server exits anyway (0) and stops its workers.
    #[arg(long, env = "SHUTDOWN_TIMEOUT", default_value = "30", value_parser = seconds,
          help_heading = heading::SERVING)]
    pub shutdown_timeout: Duration,

    /// Tokenization threads (default: one per CPU core).
    #[arg(long, env = "TOKENIZATION_WORKERS", help_heading = heading::SERVING)]
    pub tokenization_workers: Option<usize>,

    /// Token ids from the tokenizers crate's v1 pipeline, several times faster: `auto` uses it
    /// where it gives the classic tokenizer's ids on probe texts at start (/info says whether),
    /// `off` never.
    #[arg(long, env = "FAST_TOKENIZER", value_enum, default_value_t = FastTokenizerMode::Auto,
          help_heading = heading::SERVING)]
    pub fast_tokenizer: FastTokenizerMode,

    /// Prompt (from the model's sentence-transformers config) applied when a request names none.
    #[arg(long, env = "DEFAULT_PROMPT_NAME", help_heading = heading::MODEL)]
    pub default_prompt_name: Option<String>,

    /// Tulip servers to use instead of starting one in-process (repeat or comma-separate):
    /// http://ADDRESS:PORT for one replica, http://NAME:PORT for every address NAME resolves to.
    #[arg(
        long = "tulip-endpoint",
        env = "TULIP_ENDPOINTS",
        value_delimiter = ',',
        help_heading = heading::SCALING
    )]
    pub tulip_endpoints: Vec<String>,

    /// Seconds a chunk may take on one Tulip before it is sent to another. A replica that fails
    /// its health checks gives its chunks up at once; this bounds the rest (an engine's first
    /// batches may wait for its kernels to compile).
    #[arg(long, env = "REPLICA_TIMEOUT", default_value = "600", value_parser = seconds,
          help_heading = heading::SCALING)]
    pub replica_timeout: Duration,

    /// Seconds between two gRPC health checks of each Tulip.
    #[arg(long, env = "HEALTH_INTERVAL", default_value = "1", value_parser = seconds,
          help_heading = heading::SCALING)]
    pub health_interval: Duration,

    /// Seconds a health check may take before the Tulip counts as down (and gets no chunks).
    #[arg(long, env = "HEALTH_TIMEOUT", default_value = "3", value_parser = seconds,
          help_heading = heading::SCALING)]
    pub health_timeout: Duration,

    /// Seconds between two lookups of a --tulip-endpoint that is a DNS name (a headless
    /// Service: one address per replica), so that replicas join and leave without a restart.
    #[arg(long, env = "DISCOVERY_INTERVAL", default_value = "5", value_parser = seconds,
          help_heading = heading::SCALING)]
    pub discovery_interval: Duration,

    /// Requests a second each API key may send (a token bucket a second deep); past it, 429
    /// with Retry-After. Needs --api-key.
    #[arg(long, env = "API_KEY_REQUESTS_PER_SECOND", help_heading = heading::SECURITY)]
    pub api_key_requests_per_second: Option<NonZeroU32>,

    /// Tokens a minute each API key may have embedded or scored (a token bucket a minute deep,
    /// charged as answers go out: a key past it waits for its bucket to refill). Needs --api-key.
    #[arg(long, env = "API_KEY_TOKENS_PER_MINUTE", help_heading = heading::SECURITY)]
    pub api_key_tokens_per_minute: Option<NonZeroU32>,

    /// The keys of --api-key (read with Tulip's flags, tulip::AuthArgs).
    #[arg(skip)]
    pub keys: ApiKeys,

    /// Where traces go (the process's --otlp-endpoint), for /info.
    #[arg(skip)]
    pub otlp_endpoint: Option<String>,

    /// The Tulips are this process's own workers (`ivy-serve --replicas`, several `--model`s),
    /// which no one else scrapes: /metrics adds theirs, each sample labelled by `worker`.
    #[arg(skip)]
    pub worker_metrics: bool,
}

/// What happens to an input longer than the model's limit.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    clap::ValueEnum,
    serde::Deserialize,
    serde::Serialize,
    utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum LongInputs {
    /// Cut to the limit (or refused), as `truncate` and --auto-truncate say.
    Truncate,
    /// Split into overlapping windows, each embedded, their vectors averaged by tokens.
    Chunk,
}

/// Whether ids come from the tokenizers crate's v1 pipeline (see `ivy::fast_tokenizer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FastTokenizerMode {
    /// Where it agrees with the classic tokenizer on the probe texts.
    Auto,
    /// Never.
    Off,
}

/// A duration given in (fractional) seconds.
fn seconds(value: &str) -> Result<Duration, String> {
    let secs: f64 = value
        .parse()
        .map_err(|_| format!("{value:?} is not a number of seconds"))?;
    Duration::try_from_secs_f64(secs).map_err(|e| format!("{value:?}: {e}"))
}

impl Default for IvyArgs {
    /// The defaults of every flag, for clients that embed without serving HTTP.
    fn default() -> Self {
        #[derive(clap::Parser)]
        struct Defaults {
            #[command(flatten)]
            args: IvyArgs,
        }
        <Defaults as clap::Parser>::parse_from(["ivy"]).args
    }
}
