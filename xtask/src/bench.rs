//! Benchmarks (filled in below).
use anyhow::Result;
/// Runs the benchmarks.
pub fn run(_args: &[String]) -> Result<()> {
    anyhow::bail!("not yet")
}
