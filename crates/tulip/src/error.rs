//! The one error type of Tulip, and its mapping to gRPC status codes.

use tonic::{Code, Status};

/// Everything that can go wrong between a request's arrival and its vectors.
#[derive(Debug, thiserror::Error)]
pub enum TulipError {
    /// The client sent something the model cannot take (its own mistake).
    #[error("{0}")]
    Validation(String),
    /// The engine failed on a batch (not the client's mistake).
    #[error("engine error: {0}")]
    Engine(String),
    /// The engine thread is gone; nothing more can be served.
    #[error("the engine has stopped")]
    Stopped,
    /// A client could not reach Tulip, or Tulip answered with an error.
    #[error("{0}")]
    Remote(#[from] Status),
}

impl From<TulipError> for Status {
    fn from(err: TulipError) -> Self {
        match err {
            TulipError::Validation(msg) => Status::invalid_argument(msg),
            TulipError::Engine(msg) => Status::internal(msg),
            TulipError::Stopped => Status::unavailable("the engine has stopped"),
            TulipError::Remote(status) => status,
        }
    }
}

impl TulipError {
    /// True when the error is the client's own mistake (maps to a 4xx over HTTP).
    pub fn is_client_error(&self) -> bool {
        match self {
            TulipError::Validation(_) => true,
            TulipError::Remote(status) => status.code() == Code::InvalidArgument,
            _ => false,
        }
    }
}
