//! The `runway` command line.

fn main() -> std::process::ExitCode {
    runway::cli::main()
}
