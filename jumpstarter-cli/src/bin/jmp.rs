//! `jmp`: the Jumpstarter CLI.
/// jemalloc rather than the C library's malloc: a transfer frees and allocates a chunk
/// buffer per quarter MiB, across threads, and glibc's malloc hands that memory back to the
/// kernel only to fault it in again (about 20 page faults per chunk, an eighth of the
/// exporter's CPU while flashing). jemalloc keeps it for reuse.
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    jumpstarter_cli::jmp_main()
}
