fn main() -> std::process::ExitCode {
    socialgate::cli::main()
}
