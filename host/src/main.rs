//! The `socialgate` binary; everything lives in the library (see `lib.rs`).

fn main() -> std::process::ExitCode {
    socialgate::cli::main()
}
