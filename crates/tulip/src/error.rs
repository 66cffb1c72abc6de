//! Tulip's errors, and their mapping to gRPC status codes (the one place; protos/tulip.proto
//! lists the codes).

use tonic::{Code, Status};

/// Why the engine could not serve a batch, by whose fault (ROSE raises one class per kind).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// The batch cannot be served as sent: the client's mistake.
    #[error("{0}")]
    InvalidInput(String),
    /// The model or the engine's settings cannot serve it.
    #[error("{0}")]
    Model(String),
    /// The device has no room for it now.
    #[error("the engine is overloaded: {0}")]
    Overloaded(String),
    /// The step failed for a reason that is not the client's.
    #[error("engine fault: {0}")]
    Fault(String),
    /// The step failed and left the device unusable: the engine stops and the process restarts.
    #[error("fatal engine fault, the engine stops: {0}")]
    Fatal(String),
}

/// Everything that can go wrong between a request's arrival and its vectors.
#[derive(Debug, thiserror::Error)]
pub enum TulipError {
    /// The client sent something the model cannot take (its own mistake).
    #[error("{0}")]
    Validation(String),
    /// The engine failed on a batch.
    #[error("{0}")]
    Engine(#[from] EngineError),
    /// The engine thread is gone; nothing more can be served.
    #[error("the engine has stopped")]
    Stopped,
    /// A client could not reach Tulip, or Tulip answered with an error.
    #[error("{}", .0.message())]
    Remote(#[from] Status),
}

impl From<TulipError> for Status {
    fn from(err: TulipError) -> Self {
        let message = err.to_string();
        match err {
            TulipError::Validation(_) | TulipError::Engine(EngineError::InvalidInput(_)) => {
                Status::invalid_argument(message)
            }
            TulipError::Engine(EngineError::Model(_)) => Status::failed_precondition(message),
            TulipError::Engine(EngineError::Overloaded(_)) => Status::resource_exhausted(message),
            TulipError::Engine(EngineError::Fault(_) | EngineError::Fatal(_)) => {
                Status::internal(message)
            }
            TulipError::Stopped => Status::unavailable(message),
            TulipError::Remote(status) => status,
        }
    }
}

impl TulipError {
    /// The gRPC code this error travels with (what a gateway maps to HTTP).
    pub fn code(&self) -> Code {
        match self {
            TulipError::Remote(status) => status.code(),
            TulipError::Validation(_) => Code::InvalidArgument,
            TulipError::Engine(EngineError::InvalidInput(_)) => Code::InvalidArgument,
            TulipError::Engine(EngineError::Model(_)) => Code::FailedPrecondition,
            TulipError::Engine(EngineError::Overloaded(_)) => Code::ResourceExhausted,
            TulipError::Engine(EngineError::Fault(_) | EngineError::Fatal(_)) => Code::Internal,
            TulipError::Stopped => Code::Unavailable,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_travels_with_its_code_and_back() {
        let cases = [
            (TulipError::Validation("x".into()), Code::InvalidArgument),
            (
                EngineError::InvalidInput("x".into()).into(),
                Code::InvalidArgument,
            ),
            (
                EngineError::Model("x".into()).into(),
                Code::FailedPrecondition,
            ),
            (
                EngineError::Overloaded("x".into()).into(),
                Code::ResourceExhausted,
            ),
            (EngineError::Fault("x".into()).into(), Code::Internal),
            (EngineError::Fatal("x".into()).into(), Code::Internal),
            (TulipError::Stopped, Code::Unavailable),
        ];
        for (err, code) in cases {
            assert_eq!(err.code(), code);
            let status = Status::from(err);
            assert_eq!(status.code(), code);
            assert_eq!(TulipError::Remote(status).code(), code);
        }
    }
}
