//! Tulip's command-line flags (each also readable from an environment variable).

use clap::Args;

use crate::queue::Budget;

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

    /// Most sequences packed into one engine step.
    #[arg(long, env = "MAX_BATCH_REQUESTS", default_value_t = 512)]
    pub max_batch_requests: usize,
}

impl TulipArgs {
    /// The batch limits these flags set for an engine on `device`.
    pub fn budget(&self, device: &str) -> Budget {
        let default_tokens = if device.starts_with("cuda") {
            16384
        } else {
            4096
        };
        Budget {
            max_tokens: self.max_batch_tokens.unwrap_or(default_tokens),
            max_sequences: self.max_batch_requests,
        }
    }
}
