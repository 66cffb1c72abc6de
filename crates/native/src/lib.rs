//! `tulip._native`: the one Python extension module of the wheel. It is a thin layer: ROSE is
//! driven as Tulip's engine, `ivy-serve` / `tulip-serve` start the servers, and `Client` wraps
//! Ivy's embedding path over gRPC for Python callers.

mod client;
mod engine;
mod serve;

use pyo3::prelude::*;

// Ivy's tokenizer threads allocate a string per token; glibc's allocator, shared by 16 threads,
// made them about a fifth slower than mimalloc (as TEI's router uses too).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(serve::serve, m)?)?;
    m.add_class::<client::Client>()?;
    Ok(())
}
