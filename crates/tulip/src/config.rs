//! Tulip's command-line flags (each also readable from an environment variable).

use clap::Args;

use crate::packing::Budget;
use crate::proto::ModelInfo;

/// Flags of the Tulip inference server.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Tulip (gRPC inference server)")]
pub struct TulipArgs {
    /// Port of Tulip's gRPC server.
    #[arg(long, env = "GRPC_PORT", default_value_t = 50051)]
    pub grpc_port: u16,

    /// Most tokens packed into one engine step (default: 16384 on a GPU, 4096 on the CPU, where
    /// smaller batches stay in cache).
    #[arg(long, env = "MAX_BATCH_TOKENS")]
    pub max_batch_tokens: Option<usize>,

    /// Most sequences packed into one engine step (default: 512).
    #[arg(long, env = "MAX_BATCH_REQUESTS")]
    pub max_batch_requests: Option<usize>,
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
