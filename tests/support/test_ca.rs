//! A test CA and a server certificate it signed for 127.0.0.1, made with the `openssl` CLI
//! (PEM files in a directory of the test's).

// Each test binary that includes this file uses part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

pub(crate) fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl").args(args).current_dir(dir).output().expect("openssl runs");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A test CA and a server certificate it signed for 127.0.0.1 (PEM files in `dir`).
pub(crate) struct TestCa {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

pub(crate) fn make_ca(dir: &Path, name: &str) -> TestCa {
    std::fs::create_dir_all(dir).expect("mkdir");
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
    let subject = format!("/CN=Runway test CA {name} {}", std::process::id());
    let mut args = vec!["req", "-x509"];
    args.extend(ec);
    args.extend(["-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", &subject]);
    args.extend(["-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"]);
    openssl(dir, &args);
    let mut args = vec!["req"];
    args.extend(ec);
    args.extend(["-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1"]);
    openssl(dir, &args);
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .expect("ext");
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "2",
            "-extfile",
            "server.ext",
        ],
    );
    TestCa { ca: dir.join("ca.crt"), cert: dir.join("server.crt"), key: dir.join("server.key") }
}
