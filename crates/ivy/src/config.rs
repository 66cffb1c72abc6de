//! Ivy's command-line flags (each also readable from an environment variable). Names follow
//! text-embeddings-inference where it has the same flag.

use clap::Args;

/// Flags of the Ivy HTTP gateway.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Ivy (HTTP gateway)")]
pub struct IvyArgs {
    /// HTTP port.
    #[arg(long, env = "PORT", default_value_t = 3000)]
    pub port: u16,

    /// Address to listen on (0.0.0.0 for every interface).
    #[arg(long, env = "IVY_HOSTNAME", default_value = "0.0.0.0")]
    pub hostname: String,

    /// Most inputs in one client request.
    #[arg(long, env = "MAX_CLIENT_BATCH_SIZE", default_value_t = 2048)]
    pub max_client_batch_size: usize,

    /// Most requests handled at once; more are answered 429.
    #[arg(long, env = "MAX_CONCURRENT_REQUESTS", default_value_t = 512)]
    pub max_concurrent_requests: usize,

    /// Largest request body in bytes.
    #[arg(long, env = "PAYLOAD_LIMIT", default_value_t = 2_000_000)]
    pub payload_limit: usize,

    /// Truncate inputs longer than the model's limit instead of rejecting them, unless a request
    /// says otherwise.
    #[arg(long, env = "AUTO_TRUNCATE", default_value_t = false)]
    pub auto_truncate: bool,

    /// Tokenization threads (default: one per CPU core).
    #[arg(long, env = "TOKENIZATION_WORKERS")]
    pub tokenization_workers: Option<usize>,

    /// Prompt (from the model's sentence-transformers config) applied when a request names none.
    #[arg(long, env = "DEFAULT_PROMPT_NAME")]
    pub default_prompt_name: Option<String>,

    /// Tulip servers to use instead of starting one in-process (repeat or comma-separate).
    #[arg(
        long = "tulip-endpoint",
        env = "TULIP_ENDPOINTS",
        value_delimiter = ','
    )]
    pub tulip_endpoints: Vec<String>,
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
