//! Ivy, the HTTP gateway: JSON parsing, templating, tokenization on a worker pool, and fan-out of
//! large client batches in chunks to Tulip replicas over gRPC.
//!
//! `gateway` holds the shared state, `request` the one path every embedding route takes, `score`
//! the one path of the rerank, predict and similarity routes,
//! `routes` one file per API family, `http` the server around them, `replicas` the fan-out.

pub mod admission;
pub mod chunking;
pub mod config;
pub mod encode;
pub mod error;
pub mod fast_tokenizer;
pub mod gateway;
pub mod http;
pub mod input;
pub mod key_limits;
pub mod late_interaction;
pub mod listener;
pub mod metrics;
pub mod replicas;
pub mod request;
pub mod routes;
pub mod score;
pub mod startup;
pub mod template;
pub mod tokenization;

pub use config::IvyArgs;
pub use error::IvyError;
pub use gateway::{EarlyTokenizer, Gateway, Tulips};
pub use http::run;
