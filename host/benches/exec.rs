//! Wall time of `runway exec` for a job whose script is `echo ok`: process start, YAML,
//! plugin host (compiled shell plugin from the on-disk cache), four stage scripts, exit.

// criterion_group! generates undocumented public functions.
#![allow(missing_docs)]

use std::process::Command;

use criterion::{criterion_group, criterion_main, Criterion};

fn benches(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join(".gitlab-ci.yml"), "ok:\n  script: echo ok\n").expect("write");
    for args in
        [&["init", "-q"][..], &["add", "."], &["-c", "user.email=b@e", "-c", "user.name=b", "commit", "-q", "-m", "x"]]
    {
        Command::new("git").arg("-C").arg(dir.path()).args(args).output().expect("git");
    }
    let cache = dir.path().join("cache");
    let run = || {
        let out = Command::new(env!("CARGO_BIN_EXE_runway"))
            .args(["exec", "ok"])
            .current_dir(dir.path())
            .env("XDG_CACHE_HOME", &cache)
            .output()
            .expect("runway exec");
        assert!(out.status.success());
    };
    run(); // fills the compiled-plugin cache, as any first run does
    let mut group = c.benchmark_group("runway exec");
    group.sample_size(30);
    group.bench_function("job with script `echo ok` (warm plugin cache)", |b| b.iter(run));
    group.bench_function("bash -c 'echo ok' (for scale)", |b| {
        b.iter(|| Command::new("bash").args(["-c", "echo ok"]).output().expect("bash"))
    });
    group.finish();
}

criterion_group!(exec, benches);
criterion_main!(exec);
