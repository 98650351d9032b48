//! An executor that misbehaves where the runner manager must stay in charge: at startup
//! (`info`) and after the job (`cleanup`). What it does is chosen by a word anywhere in its
//! config section (`[runners.stubborn] mode = "..."`):
//!
//! - `info_trap`: `info` panics (a trap);
//! - `info_loop`: `info` spins forever (the call deadline must stop it);
//! - `info_huge`: `info` returns a 50 MB error message;
//! - `cleanup_loop`: `cleanup` spins forever;
//! - otherwise it behaves: every stage writes `ok <stage>` to the trace and exits 0.

use runway_sdk::executor::*;

struct Stubborn;
struct Env {
    cleanup_loops: bool,
}

fn spin() -> ! {
    let mut x: u64 = 0;
    loop {
        x = std::hint::black_box(x.wrapping_add(1));
    }
}

impl Executor for Stubborn {
    type Environment = Env;
    fn info(config: &str) -> Result<ProviderInfo, ExecutorError> {
        if config.contains("info_trap") {
            panic!("stubborn plugin traps in info on purpose");
        }
        if config.contains("info_loop") {
            spin();
        }
        if config.contains("info_huge") {
            return Err(ExecutorError::InvalidConfig("e".repeat(50 << 20)));
        }
        Ok(ProviderInfo::new("stubborn", "bash"))
    }
    fn prepare(job: Job) -> Result<Env, ExecutorError> {
        Ok(Env { cleanup_loops: job.config.contains("cleanup_loop") })
    }
}

impl Environment for Env {
    fn run(&self, stage: StageScript) -> Result<ExitStatus, ExecutorError> {
        runway_sdk::trace::write_str(&format!("ok {}\n", stage.name));
        Ok(ExitStatus { code: 0 })
    }
    fn cleanup(&self) {
        if self.cleanup_loops {
            spin();
        }
    }
}

runway_sdk::export_executor!(Stubborn, name: "stubborn", description: "misbehaves at startup or cleanup (tests only)");
