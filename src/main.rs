fn main() -> std::process::ExitCode {
    courier_cli::main()
}
