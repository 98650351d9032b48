//! `runway exec --executor docker`: a `.gitlab-ci.yml` job run locally in its `image:` with its
//! `services:`, on the engine `DOCKER_HOST` names (a real `dockerd` this binary starts,
//! `support/dockerd.rs`), the project bind-mounted into the containers; artifacts kept in the
//! project and handed to dependants, caches kept in the engine's cache volume between runs,
//! both moved by the runner's binary in Runway's helper image.

#[path = "support/dockerd.rs"]
mod dockerd;

use std::process::Command;

const RUNWAY: &str = env!("CARGO_BIN_EXE_runway");

/// The tests check that the engine holds no job containers after them: one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn exec_runs_a_job_in_its_image_with_its_service_and_the_project_mounted() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let docker = dockerd::shared();
    let (image, service) = (docker.job_image(), docker.service_image());
    let project = tempfile::tempdir().expect("tempdir");
    std::fs::write(project.path().join("input.txt"), "from the project\n").expect("input");
    let pipeline = format!(
        r#"image: {image}
services:
  - name: {service}
    alias: db
check:
  script:
    - cat input.txt
    - echo "made in the container" > output.txt
    - 'for i in 1 2 3 4 5 6 7 8 9 10; do (exec 3<>/dev/tcp/db/{port}) 2>/dev/null && break; sleep 1; done'
    - (exec 3<>/dev/tcp/db/{port}) && echo "service db answers"
    - echo "project dir is $CI_PROJECT_DIR"
"#,
        port = dockerd::SERVICE_PORT
    );
    std::fs::write(project.path().join(".gitlab-ci.yml"), pipeline).expect("pipeline");
    let home = tempfile::tempdir().expect("home");
    let output = Command::new(RUNWAY)
        .args(["exec", "--executor", "docker", "check"])
        .current_dir(project.path())
        .env("DOCKER_HOST", docker.host())
        .env("HOME", home.path())
        .env("NO_COLOR", "1")
        .output()
        .expect("runway exec");
    let log = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "exit {:?}\n{log}\n{}", output.status, String::from_utf8_lossy(&output.stderr));
    assert!(log.contains(&format!("Using Docker executor with image {image}")), "{log}");
    assert!(log.contains("from the project"), "the project is in the container: {log}");
    assert!(log.contains("service db answers"), "{log}");
    let name = project.path().file_name().expect("name").to_string_lossy().into_owned();
    assert!(log.contains(&format!("project dir is /builds/{name}")), "{log}");
    // The project was mounted, not copied: what the job wrote is in it.
    let made = std::fs::read_to_string(project.path().join("output.txt")).expect("output.txt");
    assert_eq!(made, "made in the container\n");
    // Nothing of the job is left on the engine but cache volumes.
    assert!(docker.containers_labelled("runway.job.id").is_empty(), "containers left");
    assert!(docker.networks_labelled("runway.job.id").is_empty(), "networks left");
}

fn exec(project: &std::path::Path, home: &std::path::Path, docker: &dockerd::Dockerd, job: &str) -> (bool, String) {
    let output = Command::new(RUNWAY)
        .args(["exec", "--executor", "docker", job])
        .current_dir(project)
        .env("DOCKER_HOST", docker.host())
        .env("HOME", home)
        .env("NO_COLOR", "1")
        .output()
        .expect("runway exec");
    let log = format!("{}\n{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    (output.status.success(), log)
}

#[test]
fn exec_hands_artifacts_to_a_dependant_and_keeps_the_cache_between_runs() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let docker = dockerd::shared();
    let image = docker.job_image();
    let project = tempfile::tempdir().expect("tempdir");
    let pipeline = format!(
        r#"image: {image}
stages: [build, test]
build:
  stage: build
  script:
    - mkdir -p dist vendor
    - echo built > dist/app.txt
    - test -e vendor/lib.txt && echo "cache restored" || echo v > vendor/lib.txt
  artifacts:
    paths: [dist/]
  cache:
    key: deps
    paths: [vendor/]
test:
  stage: test
  needs: [build]
  script:
    - cat dist/app.txt
"#
    );
    std::fs::write(project.path().join(".gitlab-ci.yml"), pipeline).expect("pipeline");
    let home = tempfile::tempdir().expect("home");
    let (ok, log) = exec(project.path(), home.path(), docker, "build");
    assert!(ok, "{log}");
    assert!(!log.contains("not supported by this executor") && !log.contains("is disabled"), "{log}");
    let kept = project.path().join(".runway/artifacts/build/artifacts.zip");
    assert!(kept.is_file(), "the archive is kept in the project: {log}");

    // The dependant gets build's archive in its container before its script.
    std::fs::remove_dir_all(project.path().join("dist")).expect("rm dist");
    let (ok, log) = exec(project.path(), home.path(), docker, "test");
    assert!(ok, "{log}");
    assert!(log.contains("Downloading artifacts for build") && log.contains("\nbuilt\n"), "{log}");

    // The cache volume keeps the cache for the next run.
    std::fs::remove_dir_all(project.path().join("vendor")).expect("rm vendor");
    let (ok, log) = exec(project.path(), home.path(), docker, "build");
    assert!(ok, "{log}");
    assert!(log.contains("Successfully extracted cache") && log.contains("cache restored"), "{log}");
    assert!(docker.containers_labelled("runway.job.id").is_empty(), "containers left");
}
