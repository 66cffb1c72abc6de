//! Ivy, the HTTP gateway: JSON parsing, templating, tokenization on a worker pool, and fan-out of
//! large client batches in chunks to Tulip replicas over gRPC.

pub mod backend;
pub mod chunks;
pub mod config;
pub mod embed;
pub mod error;
pub mod input;
pub mod metrics;
pub mod routes;
pub mod server;
pub mod template;
pub mod tokenization;

pub use config::IvyArgs;
pub use error::IvyError;
pub use server::{run, EarlyTokenizer, Gateway};
