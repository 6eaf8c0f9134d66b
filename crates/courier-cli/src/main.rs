//! The `courier` command line: `courier_cli` with the built-in `scripted` agent.

#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    courier_cli::main()
}
