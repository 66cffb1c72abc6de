//! Tulip's command-line flags (each also readable from an environment variable).

use clap::Args;

use crate::auth::AuthArgs;
use crate::packing::Budget;
use crate::proto::ModelInfo;

/// The groups of `--help`, shared by every command's flags (ivy-serve, tulip-serve).
pub mod heading {
    /// What is served: the model, its task, pooling and prompts.
    pub const MODEL: &str = "Model";
    /// How it is served: ports, device, dtype, kernels.
    pub const SERVING: &str = "Serving";
    /// Batching and replicas.
    pub const SCALING: &str = "Scaling";
    /// What one client may ask for.
    pub const LIMITS: &str = "Limits";
    /// Logs and metrics.
    pub const OBSERVABILITY: &str = "Observability";
    /// API keys and per-key limits.
    pub const SECURITY: &str = "Security";
    /// For the project's own tests, never for serving.
    pub const TESTING: &str = "Testing";
}

/// Flags of the Tulip inference server.
#[derive(Debug, Clone, Args)]
pub struct TulipArgs {
    /// Port of Tulip's gRPC server.
    #[arg(long, env = "GRPC_PORT", default_value_t = 50051, help_heading = heading::SERVING)]
    pub grpc_port: u16,

    /// Most tokens packed into one engine step (default: 16384 on a GPU, 4096 on the CPU, where
    /// smaller batches stay in cache).
    #[arg(long, env = "MAX_BATCH_TOKENS", help_heading = heading::SCALING)]
    pub max_batch_tokens: Option<usize>,

    /// Most sequences packed into one engine step (default: 512).
    #[arg(long, env = "MAX_BATCH_REQUESTS", help_heading = heading::SCALING)]
    pub max_batch_requests: Option<usize>,

    /// The API keys this process accepts (and, for Ivy, sends to its Tulips).
    #[command(flatten)]
    pub auth: AuthArgs,
}

impl Budget {
    /// The limits an engine is sized for (the engine applies the flags and its defaults).
    pub fn of(info: &ModelInfo) -> Budget {
        Budget {
            max_tokens: (info.max_batch_tokens as usize).max(1),
            max_sequences: (info.max_batch_requests as usize).max(1),
        }
    }
}
