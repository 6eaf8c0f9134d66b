//! The `courier` command line (the same binary as the facade's `courier`).

fn main() -> std::process::ExitCode {
    courier_cli::main()
}
