//! `tulip._native`: the one Python extension module of the wheel. It is a thin layer over the
//! crates: ROSE is driven as Tulip's engine (engine.rs), `ivy-serve` and `tulip-serve` start the
//! servers (serve.rs), and `GatewayClient` runs Ivy's request path over Tulip's gRPC for Python
//! callers (client.rs).

mod client;
mod engine;
mod serve;
mod telemetry;
mod workers;

use pyo3::prelude::*;
use tulip::packing::split;
use tulip::Budget;

// Ivy's tokenizer threads allocate a string per token; glibc's allocator, shared by many
// threads, made them slower than mimalloc (as TEI's router uses too).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Tulip's packing rule (crates/tulip/src/packing.rs) over sequence `lengths`: the (start, end)
/// ranges that each fill one batch of at most `max_tokens` tokens and `max_sequences` sequences.
#[pyfunction]
fn split_batches(
    lengths: Vec<usize>,
    max_tokens: usize,
    max_sequences: usize,
) -> Vec<(usize, usize)> {
    let budget = Budget {
        max_tokens,
        max_sequences,
    };
    split(&lengths, budget)
        .into_iter()
        .map(|r| (r.start, r.end))
        .collect()
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(serve::serve_ivy, m)?)?;
    m.add_function(wrap_pyfunction!(serve::serve_tulip, m)?)?;
    m.add_function(wrap_pyfunction!(split_batches, m)?)?;
    m.add_class::<client::GatewayClient>()?;
    m.add("Overloaded", m.py().get_type::<client::Overloaded>())?;
    Ok(())
}
