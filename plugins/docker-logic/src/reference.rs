//! Image references: the host names GitLab derives for a service from its image name, the
//! registry path credentials are matched against, `:latest` for pulls, and `$VARIABLE`
//! expansion of image names. Pure string work; knows nothing of engines or credentials.

/// Docker Hub's registry path.
pub const DOCKER_HUB: &str = "docker.io";

/// Split a reference into name, tag and digest (`host:5000/a/b:1@sha256:…` →
/// (`host:5000/a/b`, `1`, `sha256:…`)); empty parts when absent.
pub fn split_reference(reference: &str) -> (&str, &str, &str) {
    let (rest, digest) = reference.split_once('@').unwrap_or((reference, ""));
    let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
    match rest[last_slash..].find(':') {
        Some(i) => (&rest[..last_slash + i], &rest[last_slash + i + 1..], digest),
        None => (rest, "", digest),
    }
}

/// Whether `reference` looks like a valid image reference (lower-case name components).
fn is_valid_reference(reference: &str) -> bool {
    let (name, tag, _) = split_reference(reference);
    !name.is_empty()
        && name.split('/').all(|part| {
            !part.is_empty()
                && part.bytes().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b"._-:".contains(&c))
        })
        && tag.bytes().all(|c| c.is_ascii_alphanumeric() || b"._-".contains(&c))
}

/// The host names GitLab gives a service from its image: the name without tag, digest and
/// registry port, with `/` replaced by `__`, then (when different) by `-`: `postgres:14` →
/// `postgres`; `tutum/wordpress` → `tutum__wordpress`, `tutum-wordpress`.
pub fn service_aliases(image: &str) -> Vec<String> {
    if !is_valid_reference(image) {
        return Vec::new();
    }
    let (name, _, _) = split_reference(image);
    let (first, rest) = match name.split_once('/') {
        Some((first, rest)) => (first, Some(rest)),
        None => (name, None),
    };
    let host = match first.rsplit_once(':') {
        Some((host, port)) if !port.is_empty() && port.bytes().all(|c| c.is_ascii_digit()) => host,
        _ => first,
    };
    let service = match rest {
        Some(rest) => format!("{host}/{rest}"),
        None => host.to_string(),
    };
    let underscores = service.replace('/', "__");
    let dashes = service.replace('/', "-");
    let mut aliases = vec![underscores.clone()];
    if dashes != underscores {
        aliases.push(dashes);
    }
    aliases
}

/// The host names of each service, in order: GitLab's derived names, then the explicit ones
/// (`services[i].1`), each name at most once over all services. Returns them with GitLab's
/// warning for every name skipped because an earlier service has it.
pub fn assign_aliases(services: &[(String, Vec<String>)]) -> (Vec<Vec<String>>, Vec<String>) {
    let mut used: Vec<String> = Vec::new();
    let mut warnings = Vec::new();
    let mut out = Vec::new();
    for (index, (image, explicit)) in services.iter().enumerate() {
        let mut mine: Vec<String> = Vec::new();
        for alias in service_aliases(image).into_iter().chain(explicit.iter().cloned()) {
            if used.contains(&alias) {
                warnings.push(format!(
                    "Skipping alias \"{alias}\" for service \"{image}\" (services[{index}]): alias is already in use by another service."
                ));
            } else if !mine.contains(&alias) {
                mine.push(alias);
            }
        }
        used.extend(mine.iter().cloned());
        out.push(mine);
    }
    (out, warnings)
}

/// Check that `image` is an image reference the Engine API paths can carry: not empty, no
/// whitespace, no `..`, no characters beyond `[A-Za-z0-9._/:@-]`.
pub fn validate_reference(image: &str) -> Result<(), String> {
    let ok = !image.is_empty()
        && !image.contains("..")
        && !image.starts_with('/')
        && image.bytes().all(|c| c.is_ascii_alphanumeric() || b"._/:@-".contains(&c));
    if ok {
        Ok(())
    } else {
        Err(format!("{image:?} is not a valid image reference"))
    }
}

/// The reference to pull: `:latest` added when there is neither tag nor digest (so the engine
/// pulls one image, not every tag).
pub fn pull_reference(image: &str) -> String {
    let (_, tag, digest) = split_reference(image);
    if tag.is_empty() && digest.is_empty() {
        format!("{image}:latest")
    } else {
        image.to_string()
    }
}

/// The registry part of a reference: `registry.example.com:5000` for
/// `registry.example.com:5000/a/b`, [`DOCKER_HUB`] for `alpine` or `library/alpine`.
pub fn registry_host(image: &str) -> String {
    let normalized = normalize_image_path(image);
    normalized.split('/').next().unwrap_or(DOCKER_HUB).to_string()
}

/// GitLab's `normalizeImageRef`: the reference without tag and digest, Docker Hub images
/// prefixed with `docker.io`, `index.docker.io` folded into `docker.io`, the host lower-cased.
pub fn normalize_image_path(image: &str) -> String {
    let (name, _, _) = split_reference(image);
    let (first, rest) = match name.split_once('/') {
        Some((first, rest)) => (first, Some(rest)),
        None => (name, None),
    };
    let is_registry =
        rest.is_some() && (first.contains('.') || first.contains(':') || first.eq_ignore_ascii_case("localhost"));
    if !is_registry {
        return format!("{DOCKER_HUB}/{name}");
    }
    let host = first.to_ascii_lowercase();
    let host = if host == format!("index.{DOCKER_HUB}") { DOCKER_HUB.to_string() } else { host };
    match rest {
        Some(rest) => format!("{host}/{rest}"),
        None => host,
    }
}

/// GitLab's `convertToRegistryPath`: the path credentials for `server` (a key of `auths`, or a
/// job credential's URL) apply to: the host (lower-cased) and any path, without scheme and tag;
/// `https://index.docker.io/v1/` is [`DOCKER_HUB`].
pub fn registry_path(server: &str) -> String {
    let lower = server.to_ascii_lowercase();
    for scheme in ["https://", "http://"] {
        if let Some(rest) = lower.strip_prefix(scheme) {
            let host = rest.split('/').next().unwrap_or_default().to_string();
            return if host == format!("index.{DOCKER_HUB}") { DOCKER_HUB.to_string() } else { host };
        }
    }
    let path = server.trim_end_matches('/');
    let path = match (path.rfind(':'), path.rfind('/')) {
        (Some(colon), Some(slash)) if colon > slash => &path[..colon],
        _ => path,
    };
    match path.split_once('/') {
        Some((host, rest)) => format!("{}/{rest}", host.to_ascii_lowercase()),
        None => path.to_ascii_lowercase(),
    }
}

/// Expand `$NAME` and `${NAME}` with `lookup` (unknown names become empty), `$$` to `$`.
pub fn expand(text: &str, lookup: impl Fn(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if c != '$' {
            out.push(c);
            continue;
        }
        match chars.peek().map(|(_, c)| *c) {
            Some('$') => {
                chars.next();
                out.push('$');
            }
            Some('{') => match text[i + 2..].find('}') {
                Some(end) => {
                    let name = &text[i + 2..i + 2 + end];
                    out.push_str(&lookup(name).unwrap_or_default());
                    while chars.peek().is_some_and(|(j, _)| *j <= i + 2 + end) {
                        chars.next();
                    }
                }
                None => out.push(c),
            },
            Some(n) if n.is_ascii_alphanumeric() || n == '_' => {
                let start = i + 1;
                let mut end = start;
                while let Some((j, n)) = chars.peek().copied() {
                    if n.is_ascii_alphanumeric() || n == '_' {
                        end = j + n.len_utf8();
                        chars.next();
                    } else {
                        break;
                    }
                }
                out.push_str(&lookup(&text[start..end]).unwrap_or_default());
            }
            _ => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_references() {
        assert_eq!(split_reference("alpine"), ("alpine", "", ""));
        assert_eq!(split_reference("alpine:3.19"), ("alpine", "3.19", ""));
        assert_eq!(split_reference("host:5000/a/b"), ("host:5000/a/b", "", ""));
        assert_eq!(split_reference("host:5000/a/b:1@sha256:ab"), ("host:5000/a/b", "1", "sha256:ab"));
    }

    #[test]
    fn service_aliases_as_gitlab() {
        assert_eq!(service_aliases("postgres:14"), vec!["postgres"]);
        assert_eq!(service_aliases("postgres"), vec!["postgres"]);
        assert_eq!(service_aliases("tutum/wordpress"), vec!["tutum__wordpress", "tutum-wordpress"]);
        assert_eq!(
            service_aliases("registry.example.com:5000/group/mysql:8"),
            vec!["registry.example.com__group__mysql", "registry.example.com-group-mysql"]
        );
        assert_eq!(service_aliases("redis@sha256:0123"), vec!["redis"]);
        assert_eq!(service_aliases("Not/Valid"), Vec::<String>::new());
    }

    #[test]
    fn aliases_are_unique_over_services() {
        let services = vec![
            ("postgres:14".to_string(), vec!["db".to_string()]),
            ("postgres:15".to_string(), vec!["db".to_string(), "pg15".to_string(), "pg15".to_string()]),
        ];
        let (aliases, warnings) = assign_aliases(&services);
        assert_eq!(aliases, vec![vec!["postgres", "db"], vec!["pg15"]]);
        assert_eq!(warnings.len(), 2);
        assert_eq!(
            warnings[0],
            "Skipping alias \"postgres\" for service \"postgres:15\" (services[1]): alias is already in use by another service."
        );
    }

    #[test]
    fn validates_references() {
        assert!(validate_reference("registry.example.com:5000/g/img:1.0@sha256:abc").is_ok());
        assert!(validate_reference("Alpine").is_ok());
        for bad in ["", "a b", "../containers/x", "img?x=1", "/abs", "a\nb"] {
            assert!(validate_reference(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn pull_reference_adds_latest() {
        assert_eq!(pull_reference("alpine"), "alpine:latest");
        assert_eq!(pull_reference("127.0.0.1:5000/a"), "127.0.0.1:5000/a:latest");
        assert_eq!(pull_reference("alpine:3"), "alpine:3");
        assert_eq!(pull_reference("alpine@sha256:00"), "alpine@sha256:00");
    }

    #[test]
    fn registries() {
        assert_eq!(registry_host("alpine"), "docker.io");
        assert_eq!(registry_host("library/alpine:3"), "docker.io");
        assert_eq!(registry_host("127.0.0.1:5000/img:1"), "127.0.0.1:5000");
        assert_eq!(registry_host("Registry.Example.com/g/img"), "registry.example.com");
        assert_eq!(registry_host("localhost/img"), "localhost");
        assert_eq!(normalize_image_path("index.docker.io/library/alpine"), "docker.io/library/alpine");
        assert_eq!(registry_path("https://index.docker.io/v1/"), "docker.io");
        assert_eq!(registry_path("http://Reg.local:5000/v2/"), "reg.local:5000");
        assert_eq!(registry_path("Reg.local:5000"), "reg.local:5000");
        assert_eq!(registry_path("reg.local/group/img:tag"), "reg.local/group/img");
    }

    #[test]
    fn expands_variables() {
        let lookup = |k: &str| match k {
            "CI_REGISTRY" => Some("reg.local".to_string()),
            "TAG" => Some("1.2".to_string()),
            _ => None,
        };
        assert_eq!(expand("$CI_REGISTRY/img:${TAG}", lookup), "reg.local/img:1.2");
        assert_eq!(expand("a$$b $MISSING-c", lookup), "a$b -c");
        assert_eq!(expand("trailing $", lookup), "trailing $");
        assert_eq!(expand("${unclosed", lookup), "${unclosed");
    }
}
