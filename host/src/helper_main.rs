//! The `runway-helper` command line: the helper commands job scripts run in the job
//! environment, without the runner (see `runway::helper::command`).

fn main() -> std::process::ExitCode {
    runway::helper::command::main()
}
