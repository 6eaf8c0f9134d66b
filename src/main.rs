//! The `courier` command line: `courier_cli` with the built-in `scripted` agent.
fn main() -> std::process::ExitCode {
    courier_cli::main()
}
