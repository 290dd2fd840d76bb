//! What the bench examples share: the runtime they run on, chosen as `j`'s or `jmp`'s.

/// Runs `main` on tokio's current-thread runtime with `BENCH_RUNTIME=current_thread` (as
/// `j` does), otherwise on the multi-thread one (as `jmp` does), with `TOKIO_WORKER_THREADS`
/// workers; with a global `tracing` subscriber, as `j` and `jmp` install one.
pub fn run<F: std::future::Future<Output = anyhow::Result<()>>>(main: F) -> anyhow::Result<()> {
    // Without any subscriber, every span of h2 and tower would also be offered to the `log`
    // crate (tracing's `log` feature, which the workspace's kube-client turns on): about 10%
    // of a call's instructions that `j` never pays.
    tracing::subscriber::set_global_default(tracing::subscriber::NoSubscriber::default())?;
    let current = std::env::var("BENCH_RUNTIME").is_ok_and(|v| v == "current_thread");
    let mut builder = if current {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    };
    builder.enable_all().build()?.block_on(main)
}
