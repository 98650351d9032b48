//! The `aws` fleeting plugin end to end against moto's server (a real implementation of the
//! Auto Scaling and EC2 Query APIs, started on 127.0.0.1 by the test): the Auto Scaling group
//! is created through moto's API in a VPC whose subnet is a loopback range, so the instances
//! moto launches get 127.0.x.y addresses where one real `sshd` listens — `runway run` scales
//! the group with the plugin, and the instance executor runs jobs over SSH on the instances
//! the plugin reported. The plugin reaches moto only because the grant names it
//! (`allow_hosts`) and signs with credentials only from the granted environment.
//!
//! The runner has no SSH key of its own (`use_static_credentials` is false, as by default):
//! before each connection the plugin pushes an ephemeral key with EC2 Instance Connect, and
//! the instances' `sshd` authorizes what was pushed for it, as EC2 Instance Connect's agent
//! does on an instance — here by reading the pushes from moto's request recording.

#[path = "support/dockerd.rs"]
mod dockerd;
#[path = "support/object_servers.rs"]
mod object_servers;
#[path = "support/runway_process.rs"]
mod runway_process;
#[path = "support/sshd.rs"]
mod sshd;

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use fake_gitlab::{CreatedRunner, FakeGitLab, JobRecord, JobSpec, JobStatus};
use object_servers::Server;
use runway_process::RunwayProcess;
use sshd::{ClientKey, SshServer};

const WAIT: Duration = Duration::from_secs(120);
const GROUP: &str = "runners";

/// moto's server with one Auto Scaling group whose instances get addresses of 127.0.`net`.0/28.
struct Moto {
    server: Server,
    http: reqwest::Client,
}

/// The group as DescribeAutoScalingGroups lists it.
#[derive(Debug)]
struct GroupState {
    desired: u32,
    /// (instance id, lifecycle state)
    instances: Vec<(String, String)>,
}

impl GroupState {
    fn in_service(&self) -> BTreeSet<String> {
        self.instances.iter().filter(|(_, s)| s == "InService").map(|(id, _)| id.clone()).collect()
    }
}

/// Every `<tag>…</tag>` text of `xml`, in order.
fn tags(xml: &str, tag: &str) -> Vec<String> {
    let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
    let mut out = Vec::new();
    let mut rest = xml;
    while let Some(start) = rest.find(&open) {
        let after = &rest[start + open.len()..];
        let Some(end) = after.find(&close) else { break };
        out.push(after[..end].to_string());
        rest = &after[end + close.len()..];
    }
    out
}

impl Moto {
    /// moto with a VPC 127.0.`net`.0/24, a subnet 127.0.`net`.0/28 (moto hands out .4 to .14),
    /// a launch template and the group (MinSize 0, MaxSize `max`, desired 0) in that subnet.
    async fn with_group(net: u8, max: u32) -> Moto {
        let (moto, _vpc, subnet) = Moto::with_subnet(net).await;
        moto.call(
            "ec2",
            &[
                ("Action", "CreateLaunchTemplate"),
                ("LaunchTemplateName", "runner-template"),
                ("LaunchTemplateData.ImageId", "ami-12c6146b"),
                ("LaunchTemplateData.InstanceType", "t3.micro"),
            ],
        )
        .await;
        moto.call(
            "autoscaling",
            &[
                ("Action", "CreateAutoScalingGroup"),
                ("AutoScalingGroupName", GROUP),
                ("LaunchTemplate.LaunchTemplateName", "runner-template"),
                ("MinSize", "0"),
                ("MaxSize", &max.to_string()),
                ("DesiredCapacity", "0"),
                ("VPCZoneIdentifier", &subnet),
            ],
        )
        .await;
        moto
    }

    /// moto with a VPC 127.0.`net`.0/24 and a subnet 127.0.`net`.0/28 in `us-east-1a`; the
    /// VPC's and the subnet's ids.
    async fn with_subnet(net: u8) -> (Moto, String, String) {
        let moto = Moto { server: Server::moto(), http: reqwest::Client::new() };
        // The instances' sshd reads pushed keys from the recording (see EIC_AGENT).
        let started = moto.http.post(moto.server.url() + "/moto-api/recorder/start-recording").send().await;
        assert!(started.is_ok_and(|r| r.status().is_success()), "moto records requests");
        let vpc = moto.call("ec2", &[("Action", "CreateVpc"), ("CidrBlock", &format!("127.0.{net}.0/24"))]).await;
        let vpc = tags(&vpc, "vpcId").remove(0);
        let subnet = moto
            .call(
                "ec2",
                &[
                    ("Action", "CreateSubnet"),
                    ("VpcId", &vpc),
                    ("CidrBlock", &format!("127.0.{net}.0/28")),
                    ("AvailabilityZone", "us-east-1a"),
                ],
            )
            .await;
        let subnet = tags(&subnet, "subnetId").remove(0);
        (moto, vpc, subnet)
    }

    /// One Query API call (moto routes by the credential scope and does not check signatures).
    async fn call(&self, service: &str, params: &[(&str, &str)]) -> String {
        let version = if service == "ec2" { "2016-11-15" } else { "2011-01-01" };
        let mut form: Vec<(&str, &str)> = params.to_vec();
        form.push(("Version", version));
        let auth = format!(
            "AWS4-HMAC-SHA256 Credential=testing/20250101/us-east-1/{service}/aws4_request, SignedHeaders=host, Signature=00"
        );
        let response = self
            .http
            .post(self.server.url() + "/")
            .header("Authorization", auth)
            .form(&form)
            .send()
            .await
            .expect("moto answers");
        let status = response.status();
        let body = response.text().await.expect("moto's body");
        assert!(status.is_success(), "{params:?}: {status}\n{body}");
        body
    }

    async fn group(&self) -> GroupState {
        let body = self
            .call("autoscaling", &[("Action", "DescribeAutoScalingGroups"), ("AutoScalingGroupNames.member.1", GROUP)])
            .await;
        let desired = tags(&body, "DesiredCapacity").first().and_then(|d| d.parse().ok()).expect("DesiredCapacity");
        let ids = tags(&body, "InstanceId");
        let states = tags(&body, "LifecycleState");
        GroupState { desired, instances: ids.into_iter().zip(states).collect() }
    }

    /// EC2's state of `id` (`running`, `terminated`, ...).
    async fn ec2_state(&self, id: &str) -> String {
        let body = self.call("ec2", &[("Action", "DescribeInstances"), ("InstanceId.1", id)]).await;
        let state = body.split("<instanceState>").nth(1).map(|s| tags(s, "name").remove(0));
        state.unwrap_or_else(|| panic!("no state for {id}: {body}"))
    }

    /// The instance whose private address is `address`.
    async fn instance_at(&self, address: &str) -> String {
        let body = self
            .call(
                "ec2",
                &[
                    ("Action", "DescribeInstances"),
                    ("Filter.1.Name", "private-ip-address"),
                    ("Filter.1.Value.1", address),
                ],
            )
            .await;
        tags(&body, "instanceId").into_iter().next().unwrap_or_else(|| panic!("no instance at {address}: {body}"))
    }

    /// The EC2 Instance Connect pushes moto received: (instance, user, public key).
    async fn pushed_keys(&self) -> Vec<(String, String, String)> {
        let url = self.server.url() + "/moto-api/recorder/download-recording";
        let text = self.http.get(url).send().await.expect("recording").text().await.expect("recording body");
        let mut out = Vec::new();
        for line in text.lines() {
            let record: serde_json::Value = serde_json::from_str(line).expect("recorded request");
            let headers = record["headers"].as_object().cloned().unwrap_or_default();
            let target = headers.iter().find(|(k, _)| k.eq_ignore_ascii_case("x-amz-target")).map(|(_, v)| v.clone());
            if target.as_ref().and_then(|t| t.as_str()) != Some("AWSEC2InstanceConnectService.SendSSHPublicKey") {
                continue;
            }
            let raw = record["body"].as_str().unwrap_or_default();
            let body = if record["body_encoded"].as_bool() == Some(true) {
                use base64::Engine as _;
                String::from_utf8(base64::engine::general_purpose::STANDARD.decode(raw).expect("base64"))
                    .expect("utf-8")
            } else {
                raw.to_string()
            };
            let push: serde_json::Value = serde_json::from_str(&body).expect("SendSSHPublicKey body");
            let field = |k: &str| push[k].as_str().unwrap_or_default().to_string();
            out.push((field("InstanceId"), field("InstanceOSUser"), field("SSHPublicKey")));
        }
        out
    }

    /// Wait until the group satisfies `check`.
    async fn wait_group(&self, what: &str, runway: &RunwayProcess, check: impl Fn(&GroupState) -> bool) -> GroupState {
        let deadline = Instant::now() + WAIT;
        loop {
            let group = self.group().await;
            if check(&group) {
                return group;
            }
            if Instant::now() > deadline {
                panic!("{what}: the group is {group:?}\nrunway log:\n{}", runway.log());
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

/// What EC2 Instance Connect's agent does on an instance (sshd's `AuthorizedKeysCommand`): the
/// keys pushed with SendSSHPublicKey for the login user are authorized. The pushes come from
/// moto's recording. One sshd serves every instance address and this sshd cannot tell its
/// command the local address (`%C` is newer than Debian 12's OpenSSH), so it authorizes pushes
/// for any instance; the test checks that each job's instance is the one its key was pushed to.
/// Arguments: moto's URL, `%u`.
const EIC_AGENT: &str = r#"#!/usr/bin/python3
import base64, json, sys, urllib.request
moto, user = sys.argv[1], sys.argv[2]
for line in urllib.request.urlopen(moto + "/moto-api/recorder/download-recording").read().decode().splitlines():
    record = json.loads(line)
    headers = {k.lower(): v for k, v in record.get("headers", {}).items()}
    if headers.get("x-amz-target") != "AWSEC2InstanceConnectService.SendSSHPublicKey":
        continue
    body = record.get("body") or ""
    if record.get("body_encoded"):
        body = base64.b64decode(body).decode()
    push = json.loads(body)
    if push.get("InstanceOSUser") == user:
        print(push["SSHPublicKey"])
"#;

/// A fake GitLab, one `sshd` on every address moto may hand out (authorizing the keys pushed
/// with EC2 Instance Connect), and a config directory.
struct Setup {
    fake: FakeGitLab,
    runner: CreatedRunner,
    sshd: SshServer,
    dir: tempfile::TempDir,
    /// The agent script: sshd wants it and every directory above it owned by root and
    /// writable by no one else, so it lives under /run, not /tmp.
    _agent: tempfile::TempDir,
}

impl Setup {
    async fn new(net: u8, moto: &Moto) -> Setup {
        let fake =
            FakeGitLab::start_with(fake_gitlab::Config { long_poll: Duration::from_secs(1), trace_update_interval: 1 })
                .await;
        let runner = fake.create_runner("aws-fleet");
        fake.create_repo("group/project");
        fake.commit_files("group/project", "main", &[("README.md", "hi\n")], "init");
        // sshd's own authorized_keys holds a key the runner never sees.
        let key = ClientKey::generate();
        let agent = tempfile::Builder::new().prefix("runway-eic").tempdir_in("/run").expect("a directory in /run");
        let script = agent.path().join("eic-authorized-keys");
        std::fs::write(&script, EIC_AGENT).expect("agent script");
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
        std::fs::set_permissions(agent.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
        let extra = format!(
            "AuthorizedKeysCommand {} {} %u\nAuthorizedKeysCommandUser root\n",
            script.display(),
            moto.server.url()
        );
        let addrs: Vec<Ipv4Addr> = (4..15).map(|last| Ipv4Addr::new(127, 0, net, last)).collect();
        let port = sshd::free_port(addrs[0]);
        let sshd = SshServer::start_on_many_with(&addrs, port, &key, &extra);
        Setup { fake, runner, sshd, dir: tempfile::tempdir().expect("tempdir"), _agent: agent }
    }

    /// config.toml for the `aws` plugin on `moto`, with `grant` as the `[plugins.aws]` body
    /// and `policy` as one `[[runners.autoscaler.policy]]`.
    fn write_config(&self, moto: &Moto, grant: &str, autoscaler: &str, policy: &str) {
        let text = format!(
            r#"concurrent = 4
check_interval = 1
shutdown_timeout = 30

[plugins.aws]
{grant}

[[runners]]
name = "aws-fleet"
url = "{url}"
token = "{token}"
executor = "instance"
builds_dir = "{builds}"

[runners.autoscaler]
plugin = "aws"
capacity_per_instance = 1
update_interval = "1s"
update_interval_when_expecting = "1s"
deletion_retry_interval = "2s"
{autoscaler}

[runners.autoscaler.plugin_config]
name = "{GROUP}"
region = "us-east-1"
endpoint = "{endpoint}"

[runners.autoscaler.connector_config]
username = "{user}"
protocol_port = {port}
timeout = "10s"

[[runners.autoscaler.policy]]
{policy}
"#,
            url = self.fake.url(),
            token = self.runner.token,
            builds = self.dir.path().join("builds").display(),
            endpoint = moto.server.url(),
            user = self.sshd.user,
            port = self.sshd.port,
        );
        std::fs::write(self.dir.path().join("config.toml"), text).expect("config.toml");
    }

    fn runway(&self) -> RunwayProcess {
        RunwayProcess::new(self.dir.path().to_path_buf())
            .env("AWS_ACCESS_KEY_ID", "testing")
            .env("AWS_SECRET_ACCESS_KEY", "testing")
            .env_remove("AWS_SESSION_TOKEN")
            .env_remove("AWS_PROFILE")
    }

    async fn finished(&self, job: i64, runway: &RunwayProcess) -> JobRecord {
        match self.fake.wait_for_job_state(job, |j| j.final_state.is_some(), WAIT).await {
            Some(record) => record,
            None => panic!(
                "job {job} did not finish; trace:\n{}\nrunway log:\n{}",
                self.fake.job(job).map(|j| j.trace_text()).unwrap_or_default(),
                runway.log()
            ),
        }
    }
}

/// A grant that lets the plugin reach moto and read the two credential variables.
fn moto_grant(moto: &Moto) -> String {
    format!(
        "allow_hosts = [\"127.0.0.1:{}\"]\nenv = [\"AWS_ACCESS_KEY_ID\", \"AWS_SECRET_ACCESS_KEY\"]",
        moto.server.port
    )
}

/// Wait for `runway` to exit; its log.
async fn exited(runway: &mut RunwayProcess) -> String {
    let deadline = Instant::now() + WAIT;
    while Instant::now() < deadline {
        let Some(pid) = runway.pid() else { return runway.log() };
        // SAFETY: polling our own child without reaping anything else.
        let gone = unsafe { libc::waitpid(pid as i32, std::ptr::null_mut(), libc::WNOHANG) } == pid as i32;
        if gone {
            return runway.log();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("runway did not exit:\n{}", runway.log());
}

/// Wait until `runway`'s log holds every one of `parts`; the log.
async fn logged(runway: &RunwayProcess, parts: &[&str]) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        let log = runway.log();
        if parts.iter().all(|p| log.contains(p)) {
            return log;
        }
        assert!(Instant::now() < deadline, "{parts:?} not logged:\n{log}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// SIGQUIT `runway` and wait for it to exit; its log.
async fn quit(runway: &mut RunwayProcess) -> String {
    // SAFETY: signalling our own child.
    unsafe {
        libc::kill(runway.pid().expect("running") as i32, libc::SIGQUIT);
    }
    exited(runway).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_auto_scaling_group_follows_idle_count_demand_and_idle_time_and_empties_on_shutdown() {
    let net = 20;
    let moto = Moto::with_group(net, 5).await;
    let setup = Setup::new(net, &moto).await;
    setup.write_config(
        &moto,
        &moto_grant(&moto),
        "max_instances = 4\ndelete_instances_on_shutdown = true",
        "idle_count = 2\nidle_time = \"5s\"",
    );
    let mut runway = setup.runway();
    runway.start();

    // idle_count 2: two instances in service, nothing else.
    moto.wait_group("two idle instances", &runway, |g| g.in_service().len() == 2 && g.desired == 2).await;

    // Three overlapping jobs: demand beyond the idle instances scales the group up, and every
    // job runs over SSH on an instance at the address EC2 gave it.
    let jobs: Vec<i64> = (0..3)
        .map(|i| {
            setup.fake.enqueue(setup.fake.job_payload(&JobSpec::new(
                "group/project",
                &format!("job{i}"),
                &["echo \"on $SSH_CONNECTION\"", "sleep 6"],
            )))
        })
        .collect();
    // Three acquired, one reserved by the job request, two idle: max_instances (4).
    let grown = moto.wait_group("scaled up for demand", &runway, |g| g.in_service().len() == 4).await;
    let mut addresses = BTreeSet::new();
    for job in &jobs {
        let record = setup.finished(*job, &runway).await;
        let trace = record.trace_text();
        assert_eq!(record.status, JobStatus::Success, "{trace}\nsshd:\n{}", setup.sshd.log());
        let line = trace.lines().find(|l| l.starts_with("on ")).unwrap_or_else(|| panic!("no SSH line:\n{trace}"));
        let server = line.split_whitespace().nth(3).unwrap_or_default().to_string();
        assert!(server.starts_with(&format!("127.0.{net}.")), "ran on {server}, not on a moto instance:\n{trace}");
        addresses.insert(server);
    }
    assert_eq!(addresses.len(), 3, "the three jobs ran on three instances: {addresses:?}");

    // The runner holds no key: every connection used a key pushed for it with EC2 Instance
    // Connect, a new one each time, for the configured user on an instance of the group.
    let pushed = moto.pushed_keys().await;
    let keys: BTreeSet<&String> = pushed.iter().map(|(_, _, k)| k).collect();
    assert!(pushed.len() >= jobs.len(), "{pushed:?}");
    assert_eq!(keys.len(), pushed.len(), "one ephemeral key per connection: {pushed:?}");
    for (instance, user, key) in &pushed {
        assert!(grown.instances.iter().any(|(id, _)| id == instance), "{instance} is not in the group");
        assert_eq!(user, &setup.sshd.user);
        assert!(key.starts_with("ssh-ed25519 "), "{key}");
    }
    for address in &addresses {
        let instance = moto.instance_at(address).await;
        assert!(pushed.iter().any(|(id, _, _)| *id == instance), "no key was pushed to {instance} ({address})");
    }

    // Idle again: after idle_time the group goes back to idle_count by terminating the
    // instances the manager chose (desired capacity decremented, no replacement launched).
    // (The runner's job request holds one reservation, so idle_count 2 keeps three.)
    let peak = grown.in_service().len();
    let shrunk = moto
        .wait_group("scaled down after idle_time", &runway, |g| {
            (g.desired as usize) < peak && g.instances.len() == g.desired as usize && g.in_service().len() >= 2
        })
        .await;
    let remaining = shrunk.in_service();
    let removed: Vec<String> = grown.in_service().difference(&remaining).cloned().collect();
    assert!(!removed.is_empty(), "{grown:?} -> {shrunk:?}");
    for id in &removed {
        assert_eq!(moto.ec2_state(id).await, "terminated", "{id} was terminated, not just dropped from the group");
    }

    // Graceful shutdown with delete_instances_on_shutdown: the group is emptied.
    // SAFETY: signalling our own child.
    unsafe {
        libc::kill(runway.pid().expect("running") as i32, libc::SIGQUIT);
    }
    let log = exited(&mut runway).await;
    let group = moto.group().await;
    assert_eq!((group.desired, group.instances.len()), (0, 0), "{group:?}\n{log}");
    for id in &remaining {
        assert_eq!(moto.ec2_state(id).await, "terminated", "{id}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plugin_reaches_only_granted_hosts_with_only_granted_credentials() {
    let net = 21;
    let moto = Moto::with_group(net, 5).await;
    let setup = Setup::new(net, &moto).await;
    let policy = "idle_count = 1\nidle_time = \"1h\"";

    // moto is not in allow_hosts (another loopback port is): the host refuses the request.
    let elsewhere = sshd::free_port(Ipv4Addr::LOCALHOST);
    let grant =
        format!("allow_hosts = [\"127.0.0.1:{elsewhere}\"]\nenv = [\"AWS_ACCESS_KEY_ID\", \"AWS_SECRET_ACCESS_KEY\"]");
    setup.write_config(&moto, &grant, "max_instances = 2", policy);
    // A provider error does not stop `runway run`: the runner keeps retrying; stop it.
    let mut runway = setup.runway();
    runway.start();
    let denied = format!("denied the request to 127.0.0.1:{}", moto.server.port);
    let log = logged(&runway, &[&denied, "allow_hosts", "HTTP request denied"]).await;
    assert!(log.contains("fleet provider failed to start"), "{log}");
    let log = quit(&mut runway).await;
    assert!(!log.contains("panicked"), "{log}");

    // moto is reachable but the credential variables are not granted: the plugin sees none
    // (the runner's own environment has them) and signs nothing.
    setup.write_config(
        &moto,
        &format!("allow_hosts = [\"127.0.0.1:{}\"]", moto.server.port),
        "max_instances = 2",
        policy,
    );
    let mut runway = setup.runway();
    runway.start();
    logged(&runway, &["no AWS credentials in the environment"]).await;
    quit(&mut runway).await;

    let group = moto.group().await;
    assert_eq!((group.desired, group.instances.len()), (0, 0), "nothing was scaled: {group:?}");

    // With the grant, the same config scales the group.
    setup.write_config(&moto, &moto_grant(&moto), "max_instances = 2", policy);
    let mut runway = setup.runway().quit_on_drop();
    runway.start();
    moto.wait_group("one idle instance", &runway, |g| g.in_service().len() == 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_the_group_launches_by_itself_is_adopted_and_runs_jobs() {
    let net = 22;
    let moto = Moto::with_group(net, 3).await;
    let setup = Setup::new(net, &moto).await;
    setup.write_config(&moto, &moto_grant(&moto), "max_instances = 2", "idle_count = 1\nidle_time = \"1h\"");
    let mut runway = setup.runway();
    runway.start();
    let first = moto.wait_group("one idle instance", &runway, |g| g.in_service().len() == 1 && g.desired == 1).await;
    let first = first.in_service().into_iter().next().expect("an instance");

    // Detached without decrementing the desired capacity: the group launches a replacement on
    // its own, as it does after a health check failure or a rebalance.
    moto.call(
        "autoscaling",
        &[
            ("Action", "DetachInstances"),
            ("AutoScalingGroupName", GROUP),
            ("InstanceIds.member.1", &first),
            ("ShouldDecrementDesiredCapacity", "false"),
        ],
    )
    .await;
    let group = moto.wait_group("a replacement", &runway, |g| g.in_service().iter().any(|id| *id != first)).await;
    let replacement = group.in_service().into_iter().find(|id| *id != first).expect("replacement");
    let described = moto.call("ec2", &[("Action", "DescribeInstances"), ("InstanceId.1", &replacement)]).await;
    let address = tags(&described, "privateIpAddress").remove(0);

    // The manager adopts it (no deletion as unknown, no instance of its own instead): the job
    // runs on the instance the group launched.
    let job = setup.fake.enqueue(setup.fake.job_payload(&JobSpec::new(
        "group/project",
        "on-replacement",
        &["echo \"on $SSH_CONNECTION\""],
    )));
    let record = setup.finished(job, &runway).await;
    let trace = record.trace_text();
    assert_eq!(record.status, JobStatus::Success, "{trace}");
    let line = trace.lines().find(|l| l.starts_with("on ")).unwrap_or_else(|| panic!("no SSH line:\n{trace}"));
    assert_eq!(line.split_whitespace().nth(3), Some(address.as_str()), "{trace}\n{}", runway.log());
    assert_eq!(moto.ec2_state(&replacement).await, "running");
    let log = runway.log();
    let removed = log.lines().find(|l| l.contains("removing instance") && l.contains(&replacement));
    assert!(removed.is_none(), "{removed:?}\n{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_still_being_created_when_the_manager_stops_are_deleted_too() {
    let net = 23;
    let moto = Moto::with_group(net, 5).await;
    let setup = Setup::new(net, &moto).await;
    setup.write_config(
        &moto,
        &moto_grant(&moto),
        // The engine lists the group only every 30 s: when the manager stops right after
        // asking for two instances, it has not seen them yet.
        "max_instances = 4\ndelete_instances_on_shutdown = true\nshutdown_deletion_interval = \"1s\"\nshutdown_deletion_retries = 10",
        "idle_count = 2\nidle_time = \"5m\"",
    );
    let config = setup.dir.path().join("config.toml");
    let text = std::fs::read_to_string(&config).expect("config").replace(
        "update_interval = \"1s\"\nupdate_interval_when_expecting = \"1s\"",
        "update_interval = \"30s\"\nupdate_interval_when_expecting = \"30s\"",
    );
    std::fs::write(&config, text).expect("config");
    let mut runway = setup.runway();
    runway.start();
    moto.wait_group("the scale-up to two", &runway, |g| g.desired == 2).await;
    let log = quit(&mut runway).await;
    let group = moto.group().await;
    assert_eq!((group.desired, group.instances.len()), (0, 0), "{group:?}\n{log}");
    assert!(log.contains("deleting instances that appeared while stopping"), "{log}");
}

/// One machine as EC2 describes it.
#[derive(Debug, Clone)]
struct Machine {
    id: String,
    state: String,
    /// Its tags, `key=value`.
    tags: BTreeSet<String>,
    instance_type: String,
    private_ip: String,
}

impl Moto {
    /// Every instance carrying the docker+machine tag, in any state.
    async fn machines(&self) -> Vec<Machine> {
        let body = self
            .call(
                "ec2",
                &[
                    ("Action", "DescribeInstances"),
                    ("Filter.1.Name", "tag-key"),
                    ("Filter.1.Value.1", "runway-machine"),
                ],
            )
            .await;
        let mut ids = tags(&body, "instanceId");
        ids.dedup();
        let mut out = Vec::new();
        for id in ids {
            // One instance per answer: its network interfaces name it too.
            let item = self.call("ec2", &[("Action", "DescribeInstances"), ("InstanceId.1", &id)]).await;
            let tag_sets: Vec<String> = tags(&item, "tagSet");
            let mut machine_tags = BTreeSet::new();
            for set in &tag_sets {
                machine_tags
                    .extend(tags(set, "key").into_iter().zip(tags(set, "value")).map(|(k, v)| format!("{k}={v}")));
            }
            out.push(Machine {
                state: item.split("<instanceState>").nth(1).map(|s| tags(s, "name").remove(0)).unwrap_or_default(),
                tags: machine_tags,
                instance_type: tags(&item, "instanceType").into_iter().next().unwrap_or_default(),
                private_ip: tags(&item, "privateIpAddress").into_iter().next().unwrap_or_default(),
                id,
            });
        }
        out
    }

    /// Wait until the machines satisfy `check`.
    async fn wait_machines(
        &self,
        what: &str,
        runway: &RunwayProcess,
        check: impl Fn(&[Machine]) -> bool,
    ) -> Vec<Machine> {
        let deadline = Instant::now() + WAIT;
        loop {
            let machines = self.machines().await;
            if check(&machines) {
                return machines;
            }
            if Instant::now() > deadline {
                panic!("{what}: the machines are {machines:#?}\nrunway log:\n{}", runway.log());
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

fn running(machines: &[Machine]) -> Vec<&Machine> {
    machines.iter().filter(|m| m.state == "running").collect()
}

/// GitLab's docker+machine example for AWS (docs/runner/configuration/runners_autoscale_aws,
/// "The runners.machine section", gitlab-runner 19.4) as an administrator has it, with what
/// this machine needs instead of AWS: moto's endpoint and loopback VPC, the sshd's port and
/// user, the private address (moto's public ones are not on loopback), the Docker Engine's
/// socket. No `[plugins.aws]`: the grant comes from the driver flags.
/// `docker` is the job image and the engine's `host`.
fn docker_machine_config(setup: &Setup, moto: &Moto, docker: (&str, &str), vpc: &str, subnet: &str) -> String {
    format!(
        r#"concurrent = 4
check_interval = 1
shutdown_timeout = 30

[[runners]]
  name = "gitlab-aws-autoscaler"
  url = "{url}"
  token = "{token}"
  executor = "docker+machine"
  limit = 3
  [runners.docker]
    image = "{image}"
    host = "{host}"
    pull_policy = ["if-not-present"]
    network_mode = "host"
    privileged = false
    disable_cache = true
  [runners.machine]
    IdleCount = 1
    IdleTime = 1800
    MaxBuilds = 1
    MachineDriver = "amazonec2"
    MachineName = "gitlab-docker-machine-%s"
    MachineOptions = [
      "amazonec2-access-key=testing",
      "amazonec2-secret-key=testing",
      "amazonec2-region=us-east-1",
      "amazonec2-vpc-id={vpc}",
      "amazonec2-subnet-id={subnet}",
      "amazonec2-zone=a",
      "amazonec2-use-private-address=true",
      "amazonec2-tags=runner-manager-name,gitlab-aws-autoscaler,gitlab,true,gitlab-runner-autoscale,true",
      "amazonec2-security-group=docker-machine-scaler",
      "amazonec2-instance-type=m4.2xlarge",
      "amazonec2-ami=ami-12c6146b",
      "amazonec2-endpoint={endpoint}",
      "amazonec2-ssh-user={user}",
      "amazonec2-ssh-port={port}",
      "engine-registry-mirror=https://mirror.example",
    ]
    [[runners.machine.autoscaling]]
      Periods = ["* * 9-17 * * mon-fri *"]
      IdleCount = 50
      IdleTime = 3600
      Timezone = "UTC"
"#,
        url = setup.fake.url(),
        token = setup.runner.token,
        image = docker.0,
        host = docker.1,
        endpoint = moto.server.url(),
        user = setup.sshd.user,
        port = setup.sshd.port,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_docker_machine_config_launches_ec2_machines_and_runs_jobs_in_docker_on_them() {
    let net = 24;
    let docker = tokio::task::spawn_blocking(dockerd::shared).await.expect("daemon");
    let (moto, vpc, subnet) = Moto::with_subnet(net).await;
    let setup = Setup::new(net, &moto).await;
    // The seed's period (IdleCount 50 on weekdays 9–17) must not apply now: pin it to a day
    // that is not today, so the IdleCount of 1 outside the period holds.
    let mut text = docker_machine_config(&setup, &moto, (docker.job_image(), &docker.host()), &vpc, &subnet);
    let today = chrono::Datelike::weekday(&chrono::Utc::now()).num_days_from_sunday() as usize;
    let other = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"][(today + 3) % 7];
    text = text.replace("* * 9-17 * * mon-fri *", &format!("* * * * * {other} *"));
    std::fs::write(setup.dir.path().join("config.toml"), text).expect("config.toml");
    let mut runway = setup.runway();
    runway.start();

    // IdleCount 1: one machine, launched as docker-machine's driver launches it.
    let machines = moto.wait_machines("one idle machine", &runway, |m| running(m).len() == 1).await;
    let first = running(&machines)[0].clone();
    let name = first
        .tags
        .iter()
        .find_map(|t| t.strip_prefix("Name="))
        .unwrap_or_else(|| panic!("no Name tag: {first:?}"))
        .to_string();
    assert!(name.starts_with("runner-") && name.contains("-gitlab-docker-machine-"), "{name}");
    assert!(!name.contains("%s"), "{name}");
    for tag in ["runner-manager-name=gitlab-aws-autoscaler", "gitlab=true", "gitlab-runner-autoscale=true"] {
        assert!(first.tags.contains(tag), "{tag} missing: {:?}", first.tags);
    }
    assert_eq!(first.instance_type, "m4.2xlarge");
    assert!(first.private_ip.starts_with(&format!("127.0.{net}.")), "{first:?}");
    let groups = moto
        .call(
            "ec2",
            &[
                ("Action", "DescribeSecurityGroups"),
                ("Filter.1.Name", "group-name"),
                ("Filter.1.Value.1", "docker-machine-scaler"),
            ],
        )
        .await;
    assert_eq!(tags(&groups, "vpcId"), [vpc.as_str()], "the security group is created in the VPC:\n{groups}");
    logged(&runway, &["MachineOptions engine-registry-mirror: not used by Runway (ignored)"]).await;

    // A job runs in the job image, in Docker on the machine (reached over SSH).
    let job = setup.fake.enqueue(setup.fake.job_payload(&JobSpec::new(
        "group/project",
        "build",
        &["cat /etc/runway-image", "echo done"],
    )));
    let record = setup.finished(job, &runway).await;
    let trace = record.trace_text();
    assert_eq!(record.status, JobStatus::Success, "{trace}\nrunway log:\n{}", runway.log());
    assert!(trace.lines().any(|l| l.trim() == "job"), "ran in the job image:\n{trace}");
    let on = trace
        .lines()
        .find_map(|l| l.split("Connected to instance ").nth(1).and_then(|r| r.split_whitespace().next()))
        .unwrap_or_else(|| panic!("no instance line:\n{trace}"))
        .to_string();
    assert!(machines.iter().any(|m| m.id == on), "ran on {on}, a docker+machine machine:\n{trace}");

    // MaxBuilds 1: the machine that ran it is terminated, and IdleCount brings a new one.
    let after = moto
        .wait_machines("the used machine gone and a new idle one", &runway, |m| {
            m.iter().any(|x| x.id == on && x.state == "terminated") && running(m).iter().any(|x| x.id != on)
        })
        .await;
    assert_eq!(running(&after).len(), 1, "{after:#?}");

    // A restarted manager adopts its idle machine instead of launching another.
    let idle = running(&after)[0].id.clone();
    quit(&mut runway).await;
    let mut again = setup.runway();
    again.start();
    logged(&again, &["fleet provider ready"]).await;
    let job = setup.fake.enqueue(setup.fake.job_payload(&JobSpec::new("group/project", "again", &["echo again"])));
    let record = setup.finished(job, &again).await;
    let trace = record.trace_text();
    assert_eq!(record.status, JobStatus::Success, "{trace}");
    assert!(trace.contains(&format!("Connected to instance {idle} over SSH")), "ran on the adopted {idle}:\n{trace}");
    quit(&mut again).await;
}

/// A UTC time as EC2 writes it (`2026-11-28T13:20:05.000Z`, or `2026-11-28 13:20:05` in a
/// state transition reason), to the second.
fn ec2_time(text: &str) -> chrono::NaiveDateTime {
    let head = text.get(..19).unwrap_or(text).replace('T', " ");
    chrono::NaiveDateTime::parse_from_str(&head, "%Y-%m-%d %H:%M:%S").unwrap_or_else(|e| panic!("{text:?}: {e}"))
}

impl Moto {
    /// When EC2 launched `id`, and when it was terminated (from the user-initiated state
    /// transition reason) if it was.
    async fn lifetime(&self, id: &str) -> (chrono::NaiveDateTime, Option<chrono::NaiveDateTime>) {
        let body = self.call("ec2", &[("Action", "DescribeInstances"), ("InstanceId.1", id)]).await;
        let launched = tags(&body, "launchTime").first().map(|t| ec2_time(t)).unwrap_or_else(|| panic!("{body}"));
        let terminated = tags(&body, "reason").iter().find_map(|r| r.strip_prefix("User initiated (").map(ec2_time));
        (launched, terminated)
    }
}

/// The seed's `[[runners.machine.autoscaling]]` with periods of seconds: `IdleCount = 3` in
/// the first 8 seconds of every 20 (seconds 0–7, 20–27, 40–47), the `[runners.machine]`
/// `IdleCount = 1` with `IdleTime = 8` otherwise. The switch to 3 launches two more
/// machines; when the period ends, the idle machines beyond one are terminated once idle for
/// 8 seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_machine_periods_switch_the_idle_count_and_idle_machines_go_after_idle_time() {
    const HIGH: &str = "0-7,20-27,40-47";
    let in_high = |t: chrono::NaiveDateTime| chrono::Timelike::second(&t) % 20 < 8;
    let idle_time = chrono::Duration::seconds(8);
    let net = 25;
    let (moto, vpc, subnet) = Moto::with_subnet(net).await;
    let setup = Setup::new(net, &moto).await;
    // No job runs here: the Docker Engine is never reached.
    let text = docker_machine_config(&setup, &moto, ("alpine:3", "unix:///var/run/docker.sock"), &vpc, &subnet)
        .replace("IdleTime = 1800\n    MaxBuilds = 1\n", "IdleTime = 8\n")
        .replace("* * 9-17 * * mon-fri *", &format!("{HIGH} * * * * * *"))
        .replace("IdleCount = 50", "IdleCount = 3");
    assert!(text.contains("IdleTime = 8\n") && text.contains("IdleCount = 3\n"), "{text}");
    std::fs::write(setup.dir.path().join("config.toml"), text).expect("config.toml");
    let mut runway = setup.runway();
    runway.start();

    // Outside the period: IdleCount 1 (when the manager starts inside one, its three machines
    // come down to one when it ends).
    let base = moto.wait_machines("one idle machine", &runway, |m| running(m).len() == 1).await;
    let base: BTreeSet<String> = running(&base).iter().map(|m| m.id.clone()).collect();

    // The period starts: IdleCount 3 launches two more machines, while it applies.
    let high = moto.wait_machines("IdleCount 3 in the period", &runway, |m| running(m).len() == 3).await;
    let three: Vec<String> = running(&high).iter().map(|m| m.id.clone()).collect();
    let extra: Vec<&String> = three.iter().filter(|id| !base.contains(*id)).collect();
    assert_eq!(extra.len(), 2, "{high:#?}");
    for id in &extra {
        let (launched, _) = moto.lifetime(id).await;
        assert!(in_high(launched), "{id} was launched at {launched}, outside the period");
    }

    // The period ends: back to IdleCount 1. The idle machines beyond it are terminated once
    // idle for IdleTime (8 s, the value outside the period; the period's 3600 no longer
    // applies), and EC2 shows them terminated.
    let after = moto
        .wait_machines("two machines terminated after the period", &runway, |m| {
            m.iter().filter(|x| three.contains(&x.id) && x.state == "terminated").count() == 2
        })
        .await;
    let kept: Vec<&Machine> = after.iter().filter(|m| three.contains(&m.id) && m.state == "running").collect();
    assert_eq!(kept.len(), 1, "{after:#?}");
    for id in three.iter().filter(|id| **id != kept[0].id) {
        assert_eq!(moto.ec2_state(id).await, "terminated");
        let (launched, terminated) = moto.lifetime(id).await;
        let terminated = terminated.unwrap_or_else(|| panic!("{id}: no termination time"));
        assert!(!in_high(terminated), "{id} was terminated at {terminated}, inside the period");
        // Second-granular times: idle for IdleTime, give or take the rounding.
        assert!(
            terminated - launched >= idle_time - chrono::Duration::seconds(1),
            "{id} was terminated at {terminated}, launched at {launched}: before IdleTime\n{}",
            runway.log()
        );
    }
    quit(&mut runway).await;
}
