use super::*;

fn var(key: &str, value: &str) -> JobVariable {
    JobVariable { key: key.into(), value: value.into(), public: true, ..Default::default() }
}

fn raw(key: &str, value: &str) -> JobVariable {
    JobVariable { raw: true, ..var(key, value) }
}

fn file(key: &str, value: &str) -> JobVariable {
    JobVariable { file: true, ..var(key, value) }
}

fn values(vars: &[JobVariable]) -> Vec<(&str, &str)> {
    vars.iter().map(|v| (v.key.as_str(), v.value.as_str())).collect()
}

fn expanded(vars: Vec<JobVariable>) -> Vec<(String, String)> {
    expand_all(&vars).expect("no cycle").into_iter().map(|v| (v.key, v.value)).collect()
}

#[test]
fn expands_like_gitlab() {
    let out = expanded(vec![var("A", "a"), var("B", "${A}-$A-$$A-$NOPE."), raw("C", "$A")]);
    assert_eq!(out[1].1, "a-a-$A-.");
    assert_eq!(out[2].1, "$A");
}

#[test]
fn references_expand_to_any_depth_whatever_the_order() {
    // Each variable names one defined after it: only dependency order gets them all.
    let out =
        expanded(vec![var("D", "d=$C"), var("C", "c=${B}"), var("B", "b=$A"), var("A", "a"), var("E", "[$D|$D]")]);
    assert_eq!(out[0].1, "d=c=b=a");
    assert_eq!(out[4].1, "[d=c=b=a|d=c=b=a]");
}

#[test]
fn dollar_dollar_escapes_at_every_depth() {
    // `$$` survives GitLab's pass and becomes `$` in the runner's, once: the escaped name is
    // never expanded, however deep it came from.
    let out = expanded(vec![var("A", "x"), var("B", "$$A and $A"), var("C", "<$B>"), var("D", "$$$$")]);
    assert_eq!(out[1].1, "$A and x");
    assert_eq!(out[2].1, "<$A and x>");
    assert_eq!(out[3].1, "$$");
}

#[test]
fn raw_variables_stay_as_they_are_and_are_not_expanded_when_referenced() {
    let out = expanded(vec![var("A", "a"), raw("R", "$A ${A} $$"), var("B", "r=$R"), var("C", "b=$B")]);
    assert_eq!(out[1].1, "$A ${A} $$");
    assert_eq!(out[2].1, "r=$A ${A} $$", "a raw value is not expanded through a reference");
    assert_eq!(out[3].1, "b=r=$A ${A} $$");
}

#[test]
fn a_file_variable_referenced_expands_to_its_path() {
    let out = expanded(vec![
        var(TEMP_PROJECT_DIR, "/builds/p.tmp"),
        var("USER_NAME", "me"),
        file("KUBECONFIG_DATA", "user: $USER_NAME"),
        var("KUBECONFIG", "$KUBECONFIG_DATA"),
        var("DEEP", "--config=${KUBECONFIG}"),
    ]);
    assert_eq!(out[2].1, "user: me", "a file's content is expanded too (use expand: false to keep it)");
    assert_eq!(out[3].1, "/builds/p.tmp/KUBECONFIG_DATA");
    assert_eq!(out[4].1, "--config=/builds/p.tmp/KUBECONFIG_DATA");
}

#[test]
fn undefined_names_are_empty_and_specials_follow_go() {
    let out = expanded(vec![var("A", "[$NOPE][${NOPE}][$1x][${}][$][${A]")]);
    assert_eq!(out[0].1, "[][][x][][$][A]");
    // GitLab's `%NAME%` (Windows style) references are resolved in its pass.
    let out = expanded(vec![var("A", "a"), var("B", "%A%-%%A%%-100%")]);
    assert_eq!(out[1].1, "a-%%A%%-100%");
}

#[test]
fn a_cycle_is_an_error_naming_its_variables() {
    let err = expand_all(&[var("A", "$B"), var("B", "x$C"), var("C", "${A}"), var("D", "$A")])
        .expect_err("cycle")
        .to_string();
    assert!(err.starts_with("circular variable reference detected: ["), "{err}");
    for name in ["\"A\"", "\"B\"", "\"C\""] {
        assert!(err.contains(name), "{err}");
    }
    // A raw variable breaks the cycle: it is not expanded.
    let out = expand_all(&[var("A", "$B"), raw("B", "$A")]).expect("no cycle through a raw variable");
    assert_eq!(values(&out), vec![("A", "$A"), ("B", "$A")]);
}

#[test]
fn a_self_reference_takes_the_environment_value() {
    let path = std::env::var("PATH").unwrap_or_default();
    let out = expanded(vec![var("PATH", "/opt/bin:$PATH")]);
    assert_eq!(out[0].1, format!("/opt/bin:{path}"));
}

#[test]
fn last_definition_wins() {
    let out = dedup(vec![var("A", "1"), var("B", "x"), var("A", "2")]);
    assert_eq!(values(&out), vec![("B", "x"), ("A", "2")]);
}
