//! Builds the guest workspace (`plugins/`: first-party plugins and test plugins) for
//! `wasm32-wasip2`, in the style of wasmtime's test-programs artifacts crate, and tells the
//! host crate where the `.wasm` files are (`RUNWAY_GUEST_DIR`). The shell executor is then
//! embedded in the binary so `runway exec` works with no plugin directory.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let root = manifest_dir.parent().expect("host/ lives in the workspace root").to_path_buf();
    for dir in ["plugins", "sdk", "wit", "examples/executor-hello/src"] {
        println!("cargo:rerun-if-changed={}", root.join(dir).display());
    }
    // Keep guest builds out of the host's target directory lock.
    let target_dir =
        std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| root.join("target")).join("guest");
    // The guest workspace, then the SDK example (its own workspace, as an author's would be).
    for workspace in [root.join("plugins"), root.join("examples/executor-hello")] {
        build_guests(&workspace, &target_dir);
    }
    let out = target_dir.join("wasm32-wasip2").join("release");
    println!("cargo:rustc-env=RUNWAY_GUEST_DIR={}", out.display());
    println!("cargo:rustc-env=RUNWAY_REVISION={}", revision(&root));
}

/// The commit being built (`git rev-parse --short=8 HEAD`), so the job header names it; `RUNWAY_REVISION` in the environment wins (release
/// builds from a tarball), and `unknown` outside a checkout.
fn revision(root: &std::path::Path) -> String {
    println!("cargo:rerun-if-env-changed=RUNWAY_REVISION");
    if let Ok(rev) = std::env::var("RUNWAY_REVISION") {
        return rev;
    }
    let git =
        |args: &[&str]| Command::new("git").current_dir(root).args(args).output().ok().filter(|o| o.status.success());
    // Rebuild when HEAD moves (a commit, a checkout).
    if let Some(dir) = git(&["rev-parse", "--git-dir"]) {
        let dir = root.join(String::from_utf8_lossy(&dir.stdout).trim());
        println!("cargo:rerun-if-changed={}", dir.join("HEAD").display());
        println!("cargo:rerun-if-changed={}", dir.join("logs").join("HEAD").display());
    }
    let Some(head) = git(&["rev-parse", "--short=8", "HEAD"]) else { return "unknown".into() };
    String::from_utf8_lossy(&head.stdout).trim().to_string()
}

fn build_guests(workspace: &std::path::Path, target_dir: &std::path::Path) {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(workspace)
        .args(["build", "--release", "--target", "wasm32-wasip2", "--target-dir"])
        .arg(target_dir);
    // The outer build's flags are for the host target; never leak them into the guests.
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy().into_owned();
        if key.starts_with("CARGO_") && key != "CARGO_HOME" || key == "RUSTFLAGS" || key == "RUSTC_WRAPPER" {
            cmd.env_remove(&key);
        }
    }
    let status = cmd.status().expect("running cargo for the wasm plugins");
    if !status.success() {
        panic!(
            "building the wasm plugins in {} failed. Is the target installed? Run `rustup target add wasm32-wasip2` and build again.",
            workspace.display()
        );
    }
}
