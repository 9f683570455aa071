use std::process::ExitCode;

/// A sold-out crowd's answers are small, short-lived allocations on two
/// worker threads, where glibc's allocator spent a sixth of the process's
/// time (consolidating and unlinking free chunks); mimalloc's thread-local
/// free lists are several times cheaper for that pattern.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[actix_web::main]
async fn main() -> ExitCode {
    flashsale::cli::main().await
}
