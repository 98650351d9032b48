//! get_sources as gitlab-runner writes it (shells/abstract.go): lock files and (with
//! `clean_git_config`) configs and hooks left by earlier jobs removed, a template directory
//! whose config includes an external config file in the job's temporary directory, the
//! remote without credentials and the job token only in that file as `url.<with token>.insteadOf`
//! rewrites (the repository, the GitLab host — so submodules on the same host get it — and,
//! with `GIT_SUBMODULE_FORCE_HTTPS`, its SSH forms), `safe.directory`, fetch and checkout,
//! `git lfs pull` unless `GIT_LFS_SKIP_SMUDGE`, submodules with the parent's credentials, and
//! `clear_worktree` for a retry after a failed fetch.
//!
//! Owns: the git commands of a job. Must not touch: variables, stage order, other stages.

use url::Url;

use super::shell::{echo_info, echo_warning, make_dir_unless_present, quote, remove_if_present};
use super::{user_lines, GitStrategy, JobPlan};
use crate::payload::flags;

/// The template directory, under the job's temporary directory.
const GIT_TEMPLATE_DIR: &str = "git-template";
/// The external config holding the credentials, under the job's temporary directory.
const EXTERNAL_GIT_CONFIG: &str = ".gitlab-runner.ext.conf";
/// The variable holding the external config's absolute path (submodule commands use it).
const EXTERNAL_GIT_CONFIG_VAR: &str = "GLR_EXT_GIT_CONFIG_PATH";
/// The user of the job token in git URLs.
const TOKEN_USER: &str = "gitlab-ci-token";

/// Executors whose jobs get `safe.directory` by default (gitlab-runner's
/// `DefaultSafeDirectoryCheckout`: the container and VM executors).
const SAFE_DIRECTORY_EXECUTORS: &[&str] =
    &["docker", "docker-autoscaler", "docker+machine", "docker-windows", "kubernetes", "parallels", "virtualbox"];

/// Go's `regexp.QuoteMeta`.
fn quote_meta(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// `url` without a trailing `/` (Go's `strings.TrimRight(u.String(), "/")`).
fn trimmed(url: &Url) -> String {
    url.as_str().trim_end_matches('/').to_string()
}

fn without_credentials(url: &Url) -> Url {
    let mut plain = url.clone();
    let _ = plain.set_username("");
    let _ = plain.set_password(None);
    plain
}

/// gitlab-runner's `applyAuth`: the job token for HTTP(S), `git@` for SSH.
fn with_credentials(url: &Url, token: &str) -> Url {
    let mut authed = url.clone();
    if url.scheme() == "ssh" {
        if url.username().is_empty() {
            let _ = authed.set_username("git");
        }
    } else {
        let _ = authed.set_username(TOKEN_USER);
        let _ = authed.set_password(Some(token));
    }
    authed
}

fn is_http(url: &Url) -> bool {
    matches!(url.scheme(), "http" | "https")
}

/// `scheme://host[:port]` of `url`.
fn scheme_and_host(url: &Url) -> Option<String> {
    let host = url.host_str()?;
    Some(match url.port() {
        Some(port) => format!("{}://{host}:{port}", url.scheme()),
        None => format!("{}://{host}", url.scheme()),
    })
}

impl JobPlan {
    /// A boolean job variable read as gitlab-runner does (Go's `ParseBool`; else `default`).
    pub(super) fn flag(&self, key: &str, default: bool) -> bool {
        self.value(key).and_then(flags::parse_bool).unwrap_or(default)
    }

    fn tmp_file(&self, name: &str) -> String {
        format!("{}/{name}", self.tmp_dir.display())
    }

    /// `GIT_LFS_SKIP_SMUDGE` set true by the job: no `git lfs pull`.
    fn lfs_smudge_disabled(&self) -> bool {
        self.flag("GIT_LFS_SKIP_SMUDGE", false)
    }

    /// `clean_git_config`: by default on, except for the shell executor or `GIT_STRATEGY: none`.
    fn clean_git_config(&self) -> bool {
        self.settings
            .clean_git_config
            .unwrap_or(self.settings.executor != "shell" && self.strategy != GitStrategy::None)
    }

    /// `safe_directory_checkout`: by default on for the container and VM executors.
    fn safe_directory_checkout(&self) -> bool {
        self.settings
            .safe_directory_checkout
            .unwrap_or_else(|| SAFE_DIRECTORY_EXECUTORS.contains(&self.settings.executor.as_str()))
    }

    /// The remote with the job token (`clone_url` + project path, else the payload's URL).
    fn remote_with_credentials(&self) -> Option<Url> {
        if let Some(mut base) = self.settings.clone_url.as_deref().and_then(|u| Url::parse(u).ok()) {
            let project = self.value("CI_PROJECT_PATH").filter(|p| !p.is_empty()).unwrap_or(&self.slug);
            let path = format!("{}/{project}.git", base.path().trim_end_matches('/'));
            base.set_path(&path);
            return Some(with_credentials(&base, &self.job.token));
        }
        Url::parse(self.job.git_info.repo_url.trim()).ok()
    }

    /// What git is told the remote is: the URL without credentials.
    pub(super) fn remote_url(&self) -> String {
        match self.remote_with_credentials() {
            Some(url) => without_credentials(&url).to_string(),
            None => self.job.git_info.repo_url.clone(),
        }
    }

    /// gitlab-runner's `insteadOf` rewrites (`GetInsteadOfs`), deduplicated: (with the token,
    /// without).
    fn instead_ofs(&self) -> Vec<(String, String)> {
        let mut rewrites = Vec::new();
        if let Some(with) = self.remote_with_credentials() {
            let (with, without) = (with.to_string(), without_credentials(&with).to_string());
            if with != without {
                rewrites.push((with, without));
            }
        }
        let clone_url = self.settings.clone_url.as_deref().and_then(|u| Url::parse(u).ok());
        let base = clone_url.or_else(|| Url::parse(&self.settings.gitlab_url).ok()).filter(is_http);
        if let Some(base) = base {
            let authed = trimmed(&with_credentials(&base, &self.job.token));
            rewrites.push((authed.clone(), trimmed(&base)));
            if self.flag("GIT_SUBMODULE_FORCE_HTTPS", false) {
                let host = self
                    .value("CI_SERVER_SHELL_SSH_HOST")
                    .filter(|h| !h.is_empty())
                    .or(self.value("CI_SERVER_HOST"))
                    .unwrap_or("");
                match self.value("CI_SERVER_SHELL_SSH_PORT").filter(|p| !p.is_empty() && *p != "22") {
                    None => {
                        rewrites.push((format!("{authed}/"), format!("git@{host}:")));
                        rewrites.push((authed.clone(), format!("ssh://git@{host}")));
                    }
                    Some(port) => rewrites.push((authed.clone(), format!("ssh://git@{host}:{port}"))),
                }
            }
            // The repository's own host, which may differ from clone_url (GitLab's view).
            if let Some(repo) = Url::parse(self.job.git_info.repo_url.trim()).ok().filter(is_http) {
                let mut repo_base = repo.clone();
                repo_base.set_path("");
                let plain = without_credentials(&repo_base);
                rewrites.push((trimmed(&with_credentials(&plain, &self.job.token)), trimmed(&plain)));
            }
        }
        let mut seen = std::collections::HashSet::new();
        rewrites.retain(|r| seen.insert(r.clone()));
        rewrites
    }

    /// Lock files, and with `clean_git_config` the configs and hooks earlier jobs left
    /// (gitlab-runner's `writeGitCleanup`).
    fn git_cleanup(&self) -> String {
        let dot_git = format!("{}/.git", self.project_dir.display());
        let submodules = self.submodule_strategy().is_some();
        let mut out = String::new();
        for file in ["index.lock", "shallow.lock", "HEAD.lock", "hooks/post-checkout", "config.lock"] {
            out.push_str(&remove_if_present(&quote(&format!("{dot_git}/{file}")), false));
            if submodules {
                let base = file.rsplit('/').next().unwrap_or(file);
                out.push_str(&find_delete(&format!("{dot_git}/modules"), "f", base));
            }
        }
        out.push_str(&find_delete(&format!("{dot_git}/refs"), "f", "*.lock"));
        if self.clean_git_config() {
            for dir in [self.tmp_file(GIT_TEMPLATE_DIR), dot_git.clone()] {
                out.push_str(&remove_if_present(&quote(&format!("{dir}/config")), false));
                out.push_str(&remove_if_present(&quote(&format!("{dir}/hooks")), true));
            }
            if submodules {
                out.push_str(&find_delete(&format!("{dot_git}/modules"), "f", "config"));
                let modules = quote(&format!("{dot_git}/modules"));
                out.push_str(&format!(
                    "if [ -d {modules} ]; then find {modules} -type d -name hooks -prune -exec rm -rf {{}} +; fi\n"
                ));
            }
        }
        out
    }

    /// The template directory and the external config with the credentials
    /// (gitlab-runner's `setupTemplateDir`); exports `GLR_EXT_GIT_CONFIG_PATH`.
    fn setup_template_dir(&self) -> String {
        let template = self.tmp_file(GIT_TEMPLATE_DIR);
        let template_config = quote(&format!("{template}/config"));
        let ext = self.tmp_file(EXTERNAL_GIT_CONFIG);
        let mut out = make_dir_unless_present(&quote(&template));
        if self.safe_directory_checkout() {
            out.push_str(&format!(
                "git config --global --add safe.directory {}\n",
                quote(&self.project_dir.display().to_string())
            ));
        }
        for (key, value) in [
            ("init.defaultBranch", "none"),
            ("fetch.recurseSubmodules", "false"),
            ("credential.interactive", "never"),
            ("gc.autoDetach", "false"),
        ] {
            out.push_str(&format!("git config -f {template_config} {key} {value}\n"));
        }
        out.push_str(&remove_if_present(&quote(&ext), false));
        // The file may hold the token: only the job's user reads it.
        out.push_str(&format!("(umask 077 && : >> {})\n", quote(&ext)));
        let correlation = &self.job.request_correlation_id;
        if self.feature_flag(flags::GITALY_CORRELATION_ID) && !correlation.is_empty() {
            out.push_str(&format!(
                "git config -f {} http.extraHeader {}\n",
                quote(&ext),
                quote(&format!("X-Gitaly-Correlation-ID: {correlation}"))
            ));
            out.push_str(&echo_info(&format!("Gitaly correlation ID: {correlation}")));
        }
        if self.feature_flag(flags::GIT_BUNDLE_URIS) {
            out.push_str(&format!("git config -f {} transfer.bundleURI true\n", quote(&ext)));
        }
        for (with, without) in self.instead_ofs() {
            out.push_str(&format!(
                "git config --file {} --replace-all {} {} {}\n",
                quote(&ext),
                quote(&format!("url.{with}.insteadOf")),
                quote(&without),
                quote(&format!("^{}$", quote_meta(&without)))
            ));
        }
        // The CA the runner trusts for GitLab (gitlab-runner's writeGitSSLConfig).
        if self.settings.server_tls_ca_chain.as_ref().is_some_and(|c| !c.is_empty()) {
            out.push_str(&format!("git config --file {} http.sslCAInfo \"$CI_SERVER_TLS_CA_FILE\"\n", quote(&ext)));
        }
        out.push_str(&format!(
            "git config --file {template_config} --replace-all include.path {} {}\n",
            quote(&ext),
            quote(&format!("{}$", quote_meta(EXTERNAL_GIT_CONFIG)))
        ));
        out.push_str(&format!("export {EXTERNAL_GIT_CONFIG_VAR}={}\n", quote(&ext)));
        out
    }

    /// The refspecs to fetch: the payload's, else what the ref needs.
    fn refspecs(&self) -> Vec<String> {
        let git = &self.job.git_info;
        if !git.refspecs.is_empty() {
            return git.refspecs.clone();
        }
        if git.ref_type == "tag" {
            vec![format!("+refs/tags/{0}:refs/tags/{0}", git.git_ref)]
        } else if git.depth > 0 {
            vec![format!("+refs/heads/{0}:refs/remotes/origin/{0}", git.git_ref)]
        } else {
            vec!["+refs/heads/*:refs/remotes/origin/*".into(), "+refs/tags/*:refs/tags/*".into()]
        }
    }

    /// The get_sources stage body.
    pub(super) fn get_sources(&self) -> String {
        let dir = quote(&self.project_dir.display().to_string());
        let mut out = String::new();
        let with_hooks = !matches!(self.strategy, GitStrategy::None | GitStrategy::Empty);
        if with_hooks {
            if let Some(pre) = &self.settings.pre_get_sources_script {
                out.push_str(&user_lines(pre.lines().map(str::to_string)));
            }
            if let Some(hook) = self.job.hooks.iter().find(|h| h.name == "pre_get_sources_script") {
                out.push_str(&user_lines(hook.script.iter().cloned()));
            }
        }
        // Smudging is off during checkout (memory, git-lfs#3524); `git lfs pull` follows it.
        let lfs = !self.lfs_smudge_disabled();
        if lfs {
            out.push_str("export GIT_LFS_SKIP_SMUDGE=1\n");
        }
        match self.strategy {
            GitStrategy::None => {
                out.push_str(&echo_info("Skipping Git repository setup"));
                out.push_str(&make_dir_unless_present(&dir));
                return out;
            }
            GitStrategy::Empty => {
                out.push_str(&echo_info("Skipping Git repository setup and creating an empty build directory"));
                out.push_str(&format!("rm -rf {dir}\nmkdir -p {dir}\n"));
                return out;
            }
            GitStrategy::Clone | GitStrategy::Fetch => {}
        }
        out.push_str(&self.git_cleanup());
        out.push_str(&self.setup_template_dir());
        if self.strategy == GitStrategy::Clone {
            out.push_str(&format!("rm -rf {dir}\n"));
        }
        let depth = self.job.git_info.depth;
        if depth > 0 {
            out.push_str(&echo_info(&format!("Fetching changes with git depth set to {depth}...")));
        } else {
            out.push_str(&echo_info("Fetching changes..."));
        }
        let template = quote(&self.tmp_file(GIT_TEMPLATE_DIR));
        out.push_str(&format!("git init {dir} --template {template}\ncd {dir}\n"));
        let url = quote(&self.remote_url());
        out.push_str(&format!("if git remote add origin {url} >/dev/null 2>&1; then\n"));
        out.push_str(&echo_info("Created fresh repository."));
        out.push_str(&format!(
            "else\ngit remote set-url origin {url}\ngit config --file .git/config --replace-all include.path \"${EXTERNAL_GIT_CONFIG_VAR}\" {}\nfi\n",
            quote(&format!("{}$", quote_meta(EXTERNAL_GIT_CONFIG)))
        ));
        let mut fetch = format!(
            "git -c http.userAgent={} fetch origin --no-recurse-submodules",
            quote(&format!("runway {}", self.settings.runner_version))
        );
        for spec in self.refspecs() {
            fetch.push(' ');
            fetch.push_str(&quote(&spec));
        }
        if depth > 0 {
            fetch.push_str(&format!(" --depth {depth}"));
        }
        let extra = self.value("GIT_FETCH_EXTRA_FLAGS").unwrap_or("--prune --quiet");
        for flag in shell_words::split(extra).unwrap_or_default() {
            fetch.push(' ');
            fetch.push_str(&quote(&flag));
        }
        if depth <= 0 {
            out.push_str(&format!("if [ -f .git/shallow ]; then {fetch} --unshallow; else {fetch}; fi\n"));
        } else {
            out.push_str(&format!("{fetch}\n"));
        }
        if self.value("GIT_CHECKOUT") != Some("false") {
            let sha = &self.job.git_info.sha;
            let short: String = sha.chars().take(8).collect();
            out.push_str(&echo_info(&format!(
                "Checking out {short} as detached HEAD (ref is {})...",
                self.job.git_info.git_ref
            )));
            out.push_str(&format!("git -c submodule.recurse=false checkout -f -q {}\n", quote(sha)));
            let flags = self.clean_flags();
            if !flags.is_empty() {
                out.push_str(&format!("git clean {}\n", flags.join(" ")));
            }
            if lfs {
                out.push_str("if git lfs version >/dev/null 2>&1; then\ngit lfs pull\nfi\n");
            }
        } else {
            out.push_str(&echo_info("Skipping Git checkout"));
        }
        out.push_str(&self.submodules());
        if with_hooks {
            if let Some(hook) = self.job.hooks.iter().find(|h| h.name == "post_get_sources_script") {
                out.push_str(&user_lines(hook.script.iter().cloned()));
            }
            if let Some(post) = &self.settings.post_get_sources_script {
                out.push_str(&user_lines(post.lines().map(str::to_string)));
            }
        }
        out.push_str(&self.clear_git_credentials());
        out
    }

    /// `GIT_CLEAN_FLAGS` (default `-ffdx`, `none`: none), quoted.
    fn clean_flags(&self) -> Vec<String> {
        let clean = self.value("GIT_CLEAN_FLAGS").unwrap_or("-ffdx");
        if clean == "none" {
            return Vec::new();
        }
        shell_words::split(clean).unwrap_or_default().iter().map(|f| quote(f)).collect()
    }

    /// `GIT_SUBMODULE_STRATEGY`: `Some(recursive?)`, `None` for none (and for `none`/`empty`
    /// git strategies).
    fn submodule_strategy(&self) -> Option<bool> {
        if matches!(self.strategy, GitStrategy::None | GitStrategy::Empty) {
            return None;
        }
        match self.value("GIT_SUBMODULE_STRATEGY") {
            Some("normal") => Some(false),
            Some("recursive") => Some(true),
            _ => None,
        }
    }

    /// gitlab-runner's `writeSubmoduleUpdateCmd`: init, sync, clean, update with the parent's
    /// credentials (retried once after a sync), every submodule including the external config,
    /// then `git lfs pull` in each.
    fn submodules(&self) -> String {
        let Some(recursive) = self.submodule_strategy() else {
            return echo_info("Skipping Git submodules setup");
        };
        let depth =
            self.value("GIT_SUBMODULE_DEPTH").and_then(|d| d.parse::<i64>().ok()).unwrap_or(self.job.git_info.depth);
        let notice = match (recursive, depth > 0) {
            (true, true) => format!("Updating/initializing submodules recursively with git depth set to {depth}..."),
            (true, false) => "Updating/initializing submodules recursively...".to_string(),
            (false, true) => format!("Updating/initializing submodules with git depth set to {depth}..."),
            (false, false) => "Updating/initializing submodules...".to_string(),
        };
        let paths: Vec<String> = shell_words::split(self.value("GIT_SUBMODULE_PATHS").unwrap_or(""))
            .unwrap_or_default()
            .iter()
            .map(|p| quote(p))
            .collect();
        let path_args = if paths.is_empty() { String::new() } else { format!(" -- {}", paths.join(" ")) };
        let rec = if recursive { " --recursive" } else { "" };
        let sync = format!("git submodule sync{rec}{path_args}");
        let update_flags =
            shell_words::split(self.value("GIT_SUBMODULE_UPDATE_FLAGS").unwrap_or("")).unwrap_or_default();
        let mut update = format!("git -c include.path=\"${EXTERNAL_GIT_CONFIG_VAR}\" submodule update --init{rec}");
        if depth > 0 {
            update.push_str(&format!(" --depth {depth}"));
        }
        for flag in &update_flags {
            update.push(' ');
            update.push_str(&quote(flag));
        }
        update.push_str(&path_args);
        let foreach = format!("git submodule foreach{rec}");
        let clean = match self.clean_flags() {
            flags if flags.is_empty() => "-ffdx".to_string(),
            flags => flags.join(" "),
        };
        let mut out = echo_info(&notice);
        out.push_str(&format!("git submodule init\n{sync}\n"));
        out.push_str(&format!("{foreach} git clean {clean}\n{foreach} git reset --hard\n"));
        out.push_str(&format!("if {update}; then\n"));
        out.push_str(&echo_info("Updated submodules"));
        out.push_str(&format!("{sync}\nelse\n"));
        out.push_str(&echo_warning("Updating submodules failed. Retrying..."));
        if update_flags.iter().any(|f| f.eq_ignore_ascii_case("--remote")) {
            out.push_str(&format!(
                "git -c include.path=\"${EXTERNAL_GIT_CONFIG_VAR}\" submodule foreach{rec} git fetch origin '+refs/heads/*:refs/remotes/origin/*'\n"
            ));
        }
        out.push_str(&format!("{sync}\n{update}\n{foreach} git reset --hard\nfi\n"));
        out.push_str(&format!("{foreach} git clean {clean}\n"));
        out.push_str(&echo_info("Configuring submodules to use parent git credentials..."));
        out.push_str(&format!(
            "git submodule foreach --recursive git config --replace-all include.path \"${EXTERNAL_GIT_CONFIG_VAR}\"\n"
        ));
        if !self.lfs_smudge_disabled() {
            out.push_str("if git lfs version >/dev/null 2>&1; then\n");
            out.push_str(&echo_info("Pulling LFS files..."));
            out.push_str(&format!(
                "git -c include.path=\"${EXTERNAL_GIT_CONFIG_VAR}\" submodule foreach{rec} git lfs pull\nfi\n"
            ));
        }
        out
    }

    /// `git credential reject` for the remote host, so a credential helper of the user's
    /// forgets the job token it may have stored (best effort). Nothing with `GIT_STRATEGY`
    /// `none` or `empty`: the runner never hands the token to git then, so no helper can have
    /// stored it (gitlab-runner runs the `git` process anyway; its output goes nowhere, so
    /// the trace is the same).
    fn clear_git_credentials(&self) -> String {
        if matches!(self.strategy, GitStrategy::None | GitStrategy::Empty) {
            return String::new();
        }
        let Some(remote) = self.remote_with_credentials() else {
            return String::new();
        };
        if !matches!(remote.scheme(), "http" | "https" | "ssh") {
            return String::new();
        }
        match scheme_and_host(&remote) {
            Some(host) => format!(
                "printf 'url=%s\\nusername=%s\\n' {} {TOKEN_USER} | git credential reject >/dev/null 2>&1 || true\n",
                quote(&host)
            ),
            None => String::new(),
        }
    }

    /// The clear_worktree stage body: run between a failed get_sources and its retry, so
    /// what `git clean` cannot remove (e.g. a broken submodule) does not fail it again.
    pub(super) fn clear_worktree(&self) -> String {
        let dir = quote(&self.project_dir.display().to_string());
        let mut out = echo_info("Deleting tracked and untracked files...");
        out.push_str(&format!(
            "if [ -d {dir} ]; then\ncd {dir}\ngit rm -rf --ignore-unmatch --quiet .\ngit clean -ffdx -q\nfi\n"
        ));
        out
    }

    /// The git part of the cleanup stage: forget the token, remove the external config, lock
    /// files and (with `clean_git_config`) configs and hooks. Nothing for `runway exec`,
    /// whose project directory is the user's own checkout.
    pub(super) fn git_cleanup_stage(&self) -> String {
        if self.settings.project_dir_override.is_some() {
            return String::new();
        }
        let mut out = self.clear_git_credentials();
        out.push_str(&remove_if_present(&quote(&self.tmp_file(EXTERNAL_GIT_CONFIG)), false));
        out.push_str(&self.git_cleanup());
        out
    }
}

/// `find <dir> -type <kind> -name <name> -delete`, when `dir` exists.
fn find_delete(dir: &str, kind: &str, name: &str) -> String {
    let dir = quote(dir);
    format!("if [ -d {dir} ]; then find {dir} -type {kind} -name {} -delete; fi\n", quote(name))
}

#[cfg(test)]
#[path = "git_tests.rs"]
mod tests;
