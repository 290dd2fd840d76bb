//! `jumpstarter-controller`: the controller on one machine (embedded store, in-process router).
/// jemalloc rather than the C library's malloc, as in `jmp`: with 1,000 leases granted at
/// once, glibc's malloc (its arenas, frees across threads and consolidation) took about a
/// fifth of the controller's CPU.
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    jumpstarter_controller::cli::main()
}
