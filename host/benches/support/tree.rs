//! The 200 MB benchmark tree of the artifact benches: 2,000 files of 100 KB (half log-like
//! text, half random bytes) in 20 directories under `<root>/data`, the same bytes every time.

use std::io::Write;
use std::path::Path;

pub(crate) const FILES: usize = 2_000;
const FILE_SIZE: usize = 100 * 1024;
const DIRS: usize = 20;

/// Writes the 2,000 files under `root/data`; returns the total bytes.
pub(crate) fn generate(root: &Path) -> u64 {
    const WORDS: &[&str] = &[
        "INFO",
        "DEBUG",
        "compiling",
        "module",
        "runner",
        "artifact",
        "upload",
        "cache",
        "job",
        "step",
        "build",
        "test",
        "passed",
        "failed",
        "warning:",
        "src/main.rs",
        "target/release",
        "=>",
        "ok",
        "duration",
        "bytes",
    ];
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut total = 0;
    for i in 0..FILES {
        let dir = root.join("data").join(format!("d{:02}", i % DIRS));
        std::fs::create_dir_all(&dir).expect("create data dir");
        let mut content = Vec::with_capacity(FILE_SIZE);
        if i % 2 == 0 {
            let mut line = 0u64;
            while content.len() < FILE_SIZE {
                line += 1;
                write!(content, "2026-11-23T12:{:02}:{:02}Z [{line}]", (line / 60) % 60, line % 60).expect("write");
                for _ in 0..(6 + next() % 8) {
                    content.push(b' ');
                    content.extend_from_slice(WORDS[(next() % WORDS.len() as u64) as usize].as_bytes());
                }
                writeln!(content, " id={}", next() % 100_000).expect("write");
            }
        } else {
            while content.len() < FILE_SIZE {
                content.extend_from_slice(&next().to_le_bytes());
            }
        }
        content.truncate(FILE_SIZE);
        total += content.len() as u64;
        std::fs::write(dir.join(format!("f{i:04}.{}", if i % 2 == 0 { "log" } else { "bin" })), &content)
            .expect("write data file");
    }
    total
}
