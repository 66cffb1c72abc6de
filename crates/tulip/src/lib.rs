//! Tulip accumulates embedding requests, packs them first-come first-served into batches under a
//! token budget, and drives an [`Engine`] (ROSE, through the `native` crate) from one thread.
//!
//! It knows nothing of Python: the engine is a trait, and the gRPC contract lives in `protos/`.

pub mod auth;
pub mod client;
pub mod codec;
pub mod config;
pub mod deadline;
pub mod engine;
pub mod error;
pub mod metrics;
pub mod outputs;
pub mod packing;
pub mod postprocess;
pub mod scheduler;
pub mod server;
pub mod sparse;
pub mod trace_context;

/// Types generated from `protos/tulip.proto`.
pub mod proto {
    tonic::include_proto!("tulip.v1");
}

pub use auth::{ApiKeys, AuthArgs, AuthFailure};
pub use client::TulipClient;
pub use config::TulipArgs;
pub use engine::{Batch, Engine, Pending, Pooled, Probe, Served};
pub use error::{EngineError, TulipError};
pub use packing::Budget;
pub use scheduler::Scheduler;
