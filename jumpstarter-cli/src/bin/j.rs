//! `j`: drive the exporter of the current `jmp shell`.
/// jemalloc, as in `jmp` (see there).
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    jumpstarter_cli::j_main()
}
